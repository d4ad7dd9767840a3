/* generate.h — what `muser run` and `muser chat` share: the sampling and engine options, opening
 * model + tokenizer + session + sampler, chunked prefill, and the streaming token loop.
 *
 * The loop keeps one invariant that lets chat keep its history in the KV cache: the last sampled
 * token is never forwarded by the loop itself (nor counted by the sampler's penalties). It is left
 * in gen_reply.pending, and whoever continues the sequence (the next chat turn) prefills it
 * first. */
#ifndef MUSER_TOOLS_GENERATE_H
#define MUSER_TOOLS_GENERATE_H

#include "cli.h"
#include "sampler.h"
#include "engine.h"
#include "spec.h"
#include "session.h"
#include "tokenizer.h"

#include <signal.h>

typedef struct gen_opts {
    const char *model_path;      /* NULL: cli_default_model() */
    muser_session_opts sess;     /* n_ctx 0: the command's default */
    muser_sampler_params sp;
    bool seed_given;
    uint32_t n_predict;          /* tokens per reply */
} gen_opts;

/* Defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1 (off), CPU backend. */
void gen_opts_default(gen_opts *o, uint32_t n_predict);
/* If argv[*i] is a shared option, consume it (and its value) and return 1; return 0 if it is not
 * one; on a bad value print a usage error and return -1. */
int gen_parse_option(const char *cmd, int argc, char **argv, int *i, gen_opts *o);
/* The shared options' help text. */
void gen_print_option_help(FILE *f);

typedef struct gen_ctx {
    const char *cmd;
    muser_model *model;
    muser_tokenizer *tok;
    muser_engine *eng;           /* one engine, one sequence on it (the route every command shares) */
    muser_seq *seq;
    uint64_t n_ctx;              /* the sequence's context */
    muser_sampler *smp;
    float *logits;               /* [n_vocab]: the distribution for the next token, unless */
    uint32_t top_n;              /* > 0: it is in top_v / top_id, the last step's best top_n logits
                                  * (a greedy or top-k sampler asks for no more; logits is stale) */
    float top_v[MUSER_TOP_MAX];
    int32_t top_id[MUSER_TOP_MAX];
    bool drawn;                  /* the last step drew the token where its logits are (a plain
                                  * temperature sampler): draw.id, or logits when it is −1 */
    muser_draw draw;
    uint32_t n_vocab;            /* the model's logit row width */
    uint32_t max_batch;          /* rows per prefill call */
} gen_ctx;

/* Load the model (progress on stderr), its tokenizer, then the sampler; the session comes later
 * (gen_start_session) so run can size the context from the prompt. Errors are printed as one line;
 * returns 0 or 1 (the exit code). */
int gen_open(gen_ctx *g, const char *cmd, gen_opts *o);
int gen_start_session(gen_ctx *g, gen_opts *o, uint64_t n_ctx);
/* Tokens the sequence holds. */
uint64_t gen_pos(const gen_ctx *g);
/* An empty sequence in place of the current one (a chat that starts over). */
int gen_reset(gen_ctx *g, muser_error *err);
void gen_close(gen_ctx *g);

/* Forward toks through the batch route in max_batch chunks (logits of the last row kept) and tell
 * the sampler about them. Refuses (MUSER_E_CONTEXT_FULL) without running anything if they do not
 * fit. */
int gen_prefill(gen_ctx *g, const int32_t *toks, size_t n, muser_error *err);
/* gen_prefill for a generation drafter d will speculate on (muser_spec_prefill: a DFlash drafter
 * gets the prompt's hidden states; d NULL: plain). */
int gen_prefill_spec(gen_ctx *g, muser_drafter *d, const int32_t *toks, size_t n, muser_error *err);
/* Tokenize and append to a growing malloc'ed vector. */
int gen_tokenize_append(gen_ctx *g, const char *text, bool add_bos, bool parse_special,
                        int32_t **vec, size_t *n, size_t *cap, muser_error *err);

typedef enum {
    GEN_STOP_LIMIT = 0,       /* n_predict tokens */
    GEN_STOP_END = 1,         /* an end-of-generation token (not printed) */
    GEN_STOP_INTERRUPT = 2,   /* *interrupt was set */
    GEN_STOP_CONTEXT = 3,     /* the context is full */
} gen_stop;

typedef struct gen_reply {
    uint32_t n_tokens;        /* sampled, including an end token */
    int32_t pending;          /* last sampled token, not yet forwarded; -1 if none */
    gen_stop stop;
    double seconds;
} gen_reply;

/* Sample up to max_tokens from g->logits onward, streaming text to out (fflush per token).
 * stop_id (>= 0) ends the reply like an EOG token. Returns MUSER_OK or an error (NaN logits,
 * backend failure) with err filled. */
int gen_generate(gen_ctx *g, uint32_t max_tokens, int32_t stop_id, FILE *out,
                 volatile sig_atomic_t *interrupt, gen_reply *r, muser_error *err);

/* SIGINT sets the flag while installed (no SA_RESTART, so a blocking read returns EINTR). */
extern volatile sig_atomic_t gen_interrupted;
void gen_catch_sigint(bool on);

/* gen_generate with speculation: drafter d proposes up to k tokens a round (adaptive: as many of
 * them as the acceptance so far makes worth a pass, muser_spec_adaptive), the target verifies them
 * in one pass; the tokens (and their logprobs) are those plain decoding gives (greedy: the same;
 * sampled: the same distribution). ctx: the prompt. Round statistics into *st. */
int gen_generate_spec(gen_ctx *g, muser_drafter *d, uint32_t k, bool adaptive, const int32_t *ctx, size_t n_ctx_toks,
                      uint32_t max_tokens, FILE *out, volatile sig_atomic_t *interrupt, gen_reply *r,
                      muser_spec_stats *st, muser_error *err);

/* The drafter options `muser run` and `muser bench` share: --draft MODEL, --draft-ngram N,
 * --draft-dflash MODEL, --draft-max K, --draft-fixed. */
typedef struct gen_draft {
    const char *model_path, *dflash_path;
    uint32_t ngram;              /* 0: no prompt lookup */
    uint32_t max;                /* drafts per round at most (default 8) */
    bool fixed;                  /* ask for max every round (no adaptive length) */
} gen_draft;
#define GEN_DRAFT_DEFAULT ((gen_draft){.max = 8})
/* As gen_parse_option, for the drafter options. */
int gen_parse_draft_option(const char *cmd, int argc, char **argv, int *i, gen_draft *d);
/* The drafter options' help text. */
void gen_print_draft_help(FILE *f);
/* Whether d asks for a drafter. */
static inline bool gen_draft_wanted(const gen_draft *d) { return d->model_path || d->dflash_path || d->ngram; }
/* A usage error (printed; returns CLI_EXIT_USAGE) for two drafters or DFlash on a backend without
 * the tap; else 0. */
int gen_draft_check(const char *cmd, const gen_draft *d, muser_backend_kind backend);
/* A drafter and the models it reads (a draft model, a DFlash drafter), owned together. */
typedef struct gen_drafter {
    muser_drafter *d;            /* NULL: none */
    muser_model *dm;
    muser_dflash *df;
} gen_drafter;
/* The drafter d asks for (out->d NULL when none), for g's model and a sequence of n_ctx
 * positions. Errors in err; out is then empty. */
int gen_drafter_open(gen_ctx *g, const gen_draft *d, const gen_opts *o, uint64_t n_ctx, gen_drafter *out,
                     muser_error *err);
void gen_drafter_close(gen_drafter *dr);
/* "draft model", "DFlash" or "n-gram" */
const char *gen_draft_name(const gen_draft *d);

/* cmd_chat.c: the model's chat template (asked for, else its metadata's, else its special tokens',
 * else muse; *why says which), and its end-of-turn marker (text in buf; the token id or -1). */
struct chat_template;
const struct chat_template *choose_template(const gen_ctx *g, const char **why);
int32_t resolve_end_of_turn(const gen_ctx *g, const struct chat_template *t, char *buf, size_t cap);

#endif
