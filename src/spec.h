/* spec.h — speculative decoding over an engine sequence (SPEC §5): a drafter proposes tokens, the
 * target verifies the block in one small-batch pass (engine.h muser_seq_verify), acceptance runs
 * against the target's full distributions, and the KV cache keeps exactly the accepted rows.
 *
 * Every drafter here is deterministic (its proposal is a point mass), so acceptance is exact and
 * simple: with the sampler's distribution p for a row (muser_sampler_dist: penalties,
 * temperature, top-k, top-p, min-p, as plain decoding applies them), the draft d is accepted with
 * probability p(d), and on rejection the token is drawn from p without d, renormalised. Greedy
 * accepts while d is the argmax. So the output distribution is exactly the target's; greedy output
 * (tokens and logprob bytes) is exactly plain greedy decoding's, because a verify row is
 * bit-identical to the decode row it replaces (row invariance). */
#ifndef MUSER_SPEC_H
#define MUSER_SPEC_H

#include "dflash.h"
#include "engine.h"
#include "sampler.h"

#define MUSER_SPEC_MAX_DRAFT (KV_MAX_SPEC_ROWS - 1) /* a verify block: the next token + 15 drafts */

typedef struct muser_drafter muser_drafter;
struct muser_drafter {
    const char *name;
    /* Up to k tokens to follow ctx[0..n) (every token of the sequence, the next one to verify
     * last) into out; returns how many (0..k), or a negative muser_status. */
    int (*propose)(muser_drafter *d, const int32_t *ctx, uint64_t n, uint32_t k, int32_t *out, muser_error *err);
    void (*free)(muser_drafter *d);
    void *self;
    /* A drafter that reads the target's hidden states (DFlash): the target layers (n_tap 0: none).
     * muser_spec_prefill and every verify of the round loop tap them and hand observe the rows the
     * cache keeps: positions [pos0, pos0 + n) hold feats [n][n_tap][E], later ones are forgotten. */
    uint32_t n_tap;
    const uint32_t *tap_layers;
    int (*observe)(muser_drafter *d, uint64_t pos0, const float *feats, uint32_t n, muser_error *err);
    /* observe returns before its work is done (the GPU drafter's): the round loop then hands it every
     * verified row as soon as the verify pass returns, runs the acceptance on the host while the
     * drafter takes them, and cuts it back to the kept rows after (observe with n = 0). */
    bool observe_early;
    /* The multiply-adds of its matrices in a round that proposes k tokens (NULL: next to nothing,
     * as prompt lookup): the adaptive draft length weighs them against the target's per token. */
    double (*round_macs)(const muser_drafter *d, uint32_t k);
};

/* The multiply-adds of m's matrices for one token (every layer's projections and the LM head). */
double muser_model_token_macs(const muser_model *m);

/* Prompt lookup: the longest suffix of the context (n_max tokens down to 1) that occurred before,
 * and the tokens that followed its latest occurrence. */
int muser_drafter_ngram_new(muser_drafter **out, uint32_t n_max, muser_error *err);
/* A small model sharing the target's vocabulary (a mismatch is refused), greedy, on a sequence of
 * n_ctx positions of draft engine e (engine.h: its model the draft), which the caller may share
 * among drafters (a server's requests: their draft rows then share passes) and must outlive them.
 * Its drafts depend only on the context: a draft row's bytes do not depend on what shares its pass. */
int muser_drafter_model_on(muser_drafter **out, muser_engine *e, const muser_model *target, uint64_t n_ctx,
                           muser_error *err);
/* Whether draft may draft for target (one vocabulary); MUSER_E_ARG saying why not. */
int muser_draft_model_check(const muser_model *draft, const muser_model *target, muser_error *err);
/* The same on an engine of its own (backend b, n_ctx positions), freed with the drafter. */
int muser_drafter_model_new(muser_drafter **out, const muser_model *draft, const muser_model *target,
                            muser_backend_kind b, uint32_t n_threads, uint64_t n_ctx, muser_error *err);
/* DFlash (dflash.h): one block from the target's hidden states per round, on its own run (kind: the
 * CPU engine or the oracle) of n_ctx positions; df must outlive the drafter. A round drafts only when
 * the drafter holds the features of every position before the next token (the prompt was prefilled
 * through muser_spec_prefill), else it proposes nothing. */
int muser_drafter_dflash_new(muser_drafter **out, const muser_dflash *df, muser_dflash_kind kind, uint64_t n_ctx,
                             muser_error *err);
void muser_drafter_free(muser_drafter *d);

/* muser_seq_prefill for a sequence d will speculate on: with d's tap when it has one (its features
 * go to d->observe, in chunks), else plainly. The same logits and cache bytes either way. */
int muser_spec_prefill(muser_seq *q, muser_drafter *d, const int32_t *tokens, uint32_t n, float *logits,
                       muser_error *err);

/* Acceptance of a point-mass draft d against row (the target's logits [V]) under s: returns the
 * token to emit (d when accepted, else a draw from p without d) and sets *accepted. */
int32_t muser_spec_accept(muser_sampler *s, const float *row, int32_t d, bool *accepted);

typedef struct muser_spec_stats {
    uint64_t rounds;     /* verify passes */
    uint64_t drafted;    /* draft tokens proposed */
    uint64_t accepted;   /* of them accepted */
    uint64_t emitted;    /* tokens emitted (drafts and the tokens the target chose itself) */
} muser_spec_stats;

/* A speculative generation on q, whose prompt (ctx[0..n_ctx)) is prefilled; logits is the row for
 * the next position ([V], caller-owned, kept current). */
typedef struct muser_spec {
    muser_seq *q;
    muser_sampler *smp;
    muser_drafter *d;
    uint32_t k_max;      /* drafts per round, 1..15 */
    uint64_t n_ctx;      /* the sequence's context */
    int32_t *hist;       /* the sequence's tokens */
    uint64_t n_hist, cap;
    float *rows;         /* [16][V] a verify block's logits */
    float *feats;        /* [16][n_tap][E] a verify block's tapped residuals (a drafter with a tap) */
    float *logits;
    int32_t pending;     /* a token already chosen (a rejection's draw), emitted next; -1 none */
    float pending_lp;
    muser_spec_stats st;
    /* adaptive draft length (muser_spec_adaptive): the device's pass costs, and the acceptance
     * seen so far as decayed counts of accepted drafts and of rejections */
    bool adaptive;
    double cost[KV_MAX_SPEC_ROWS + 1];
    double target_macs;  /* the target's multiply-adds per token (muser_model_token_macs) */
    double acc_w, rej_w;
    bool greedy;         /* the sampler is greedy (muser_sampler_greedy): see muser_spec_set_neighbours */
    uint32_t neighbours; /* rows other sequences bring to the next round's pass */
    uint32_t skipped;    /* rounds in a row the adaptive length chose no drafts */
} muser_spec;

int muser_spec_init(muser_spec *sp, muser_seq *q, uint64_t n_ctx, muser_sampler *smp, muser_drafter *d,
                    uint32_t k_max, const int32_t *prompt, uint64_t n_prompt, float *logits, muser_error *err);
void muser_spec_free(muser_spec *sp);
/* Adaptive draft length: each round asks the drafter for the k in 0..k_max that maximises the
 * expected tokens per unit of cost, E(k) / (cost(k + 1) + r(k)) (k = 0: a plain step; after 8 such
 * rounds in a row k ≥ 1 once, so the acceptance is measured again), with E(k) = 1 + a + … + a^k for
 * the per-draft acceptance a estimated from the rounds so far (decayed counts of accepted drafts
 * and of rejections, from an even prior), cost the device's pass_cost and r the drafter's round in
 * target tokens (its round_macs over the target's per-token multiply-adds). It reads only fixed
 * figures and the run's own history, so runs repeat; greedy output is plain decoding's whatever
 * k is. */
void muser_spec_adaptive(muser_spec *sp, bool on);
/* The rows other sequences will bring to the next round's pass (a server's other streams). The
 * adaptive length of a greedy generation weighs them: with N of them, the k in 0..k_max that
 * maximises (N + E(k)) / (cost(N + 1 + k) + r(k)), so drafts that would crowd a full pass are not
 * made (a greedy generation's tokens are the same whatever k is). A sampled generation's length
 * stays a function of its own history: its tokens do not depend on its neighbours. */
void muser_spec_set_neighbours(muser_spec *sp, uint32_t n);
/* The draft length the next round asks for (k_max when not adaptive; the context may cut it). */
uint32_t muser_spec_next_k(const muser_spec *sp);
/* The next tokens, at most max_out (>= 1): ids and their raw logprobs (log_softmax of the row that
 * produced them, as plain decoding reports; logprobs NULL on every call of a generation: none
 * computed, which saves a pass over each row). A token for which stop(id, arg) is true ends the
 * generation (*ended): it is emitted but not fed, as plain decoding does; the last of max_out
 * tokens is not fed either when last_is_final (the caller's token limit). */
int muser_spec_next(muser_spec *sp, uint32_t max_out, bool last_is_final, bool (*stop)(int32_t, void *), void *arg,
                    int32_t *ids, float *logprobs, uint32_t *n_out, bool *ended, muser_error *err);

#endif
