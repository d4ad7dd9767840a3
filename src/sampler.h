/* sampler.h — turn a logit row into a token: penalties -> temperature -> top-k -> top-p ->
 * min-p -> draw, or greedy. Seeded RNG (xoshiro256** seeded through splitmix64): the same seed
 * gives the same tokens. Works on the full vocabulary row without allocating per token. */
#ifndef MUSER_SAMPLER_H
#define MUSER_SAMPLER_H

#include "muser.h"

typedef struct muser_sampler_params {
    float temperature;        /* 0 = greedy */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repeat_penalty;     /* 1 = off; applied over the last repeat_last_n tokens */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint32_t repeat_last_n;   /* 64 by default */
    uint64_t seed;
    uint32_t n_logprobs;      /* top-N alternatives to report (<= 20) */
} muser_sampler_params;

void muser_sampler_params_default(muser_sampler_params *p);

typedef struct muser_logprob { int32_t id; float logprob; } muser_logprob;

typedef struct muser_sampler muser_sampler;

int muser_sampler_new(muser_sampler **out, uint32_t n_vocab, const muser_sampler_params *p,
                      muser_error *err);
void muser_sampler_free(muser_sampler *s);
/* The row's k largest logits x[0..n), best first (ties to the lower id, -0 tying +0), into v and
 * id [k]; 1 <= k <= n, no NaN in x. The ranking every top-k in muser uses (the GPU's too). */
void muser_top_k(const float *x, uint32_t n, uint32_t k, float *v, int32_t *id);
/* How many of a row's best logits decide muser_sampler_sample's choice: 1 greedy, top-k's k, 0
 * when it needs the whole row (a penalty, or no top-k). Log-probabilities always need the row. */
uint32_t muser_sampler_top_needed(const muser_sampler *s);
/* muser_sampler_sample from the row's best n logits (muser_top_k's v and id, n >=
 * muser_sampler_top_needed(s) > 0): the same token, and the same draw of the seeded generator, as
 * from the whole row. MUSER_E_NUMERIC when the best is not finite, MUSER_E_ARG when n is too few. */
int32_t muser_sampler_sample_top(muser_sampler *s, const float *v, const int32_t *id, uint32_t n);
/* Tell the sampler about a token in the context (prompt or generated), for penalties. */
void muser_sampler_accept(muser_sampler *s, int32_t id);
void muser_sampler_reset(muser_sampler *s);
/* Choose a token from logits[n_vocab] (not modified). chosen_logprob / top (n_logprobs entries)
 * may be NULL; log-probabilities are of the unpenalised, untempered distribution. */
int32_t muser_sampler_sample(muser_sampler *s, const float *logits, float *chosen_logprob,
                             muser_logprob *top);

/* The distribution muser_sampler_sample draws from for this row (penalties, temperature, top-k,
 * top-p, min-p applied): *n candidate ids and their unnormalised weights, *mass their sum (without
 * top-k: every id in id order, the ones min-p or top-p drops weighing 0); valid until the next call
 * on s. Greedy: the argmax, weight 1. MUSER_E_NUMERIC on a non-finite row.
 * Speculative sampling accepts and resamples against it (spec.h). */
int muser_sampler_dist(muser_sampler *s, const float *logits, const int32_t **ids, const float **w,
                       uint32_t *n, double *mass);
/* Whether the sampler's choice is a draw over the whole row (T > 0, no penalty or top-k; top-p and
 * min-p as they are set): one a GPU can make where the logits are (muser_draw, session.h), with its
 * T, top-p and min-p (each pointer may be NULL). */
bool muser_sampler_draw_params(const muser_sampler *s, float *temperature, float *top_p, float *min_p);
/* muser_sampler_sample's choice (no log-probabilities) with u in [0, 1) as the draw's uniform in
 * place of the generator's next one, the generator unmoved: taking u = muser_sampler_uniform(s)
 * first gives muser_sampler_sample's token and leaves the generator where it would. */
int32_t muser_sampler_sample_u(muser_sampler *s, const float *logits, double u);
/* Whether the sampler always takes the best token (temperature 0 or top-k 1): no draw, so its
 * tokens depend on no generator. */
bool muser_sampler_greedy(const muser_sampler *s);
/* One uniform in [0, 1) from the sampler's seeded generator. */
double muser_sampler_uniform(muser_sampler *s);
/* log_softmax(logits)[id] of the raw row, as muser_sampler_sample's chosen_logprob. */
float muser_sampler_logprob(const muser_sampler *s, const float *logits, int32_t id);

#endif
