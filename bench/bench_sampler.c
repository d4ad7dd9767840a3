/* bench_sampler.c — the sampler's time per token on a full logits row, against a decode step.
 *
 *   bench_sampler [V] [reps]      (defaults: 202048, Glimmer's vocabulary; 300)
 *
 * Random logits (a scaled sum of uniforms: a bell-shaped row, soft-capped at 20 like Glimmer's),
 * then per setting the median over reps of one muser_sampler_sample call: greedy, and top-k 40 /
 * top-p 0.95 / temperature 0.8 (the engine issue's setting), without and with the logprobs a
 * server reply reports, and top-p alone (no top-k: the whole row is a candidate).
 * Printed beside the share of a 5.22 ms GPU decode step (191.7 tok/s, bench/RESULTS.md). */
#include "sampler.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const uint32_t V = argc > 1 ? (uint32_t)atoi(argv[1]) : 202048;
    const int reps = argc > 2 ? atoi(argv[2]) : 300;
    float *logits = malloc((size_t)V * sizeof *logits);
    double *t = malloc((size_t)reps * sizeof *t);
    uint64_t x = 88172645463325252ull;
    for (uint32_t i = 0; i < V; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s += (double)(x >> 11) / 9007199254740992.0;
        }
        logits[i] = (float)(20.0 * tanh((s - 2.0) * 2.0 / 20.0));
    }
    /* lp: 0 no logprob asked, 1 the chosen token's, 1 + N also the top N */
    struct { const char *name; float temp; uint32_t k; float p; uint32_t lp; } cfg[] = {
        {"greedy", 0.0f, 0, 1.0f, 0},
        {"greedy + its logprob", 0.0f, 0, 1.0f, 1},
        {"top-k 40, top-p 0.95, T 0.8", 0.8f, 40, 0.95f, 0},
        {"top-k 40, top-p 0.95, T 0.8 + logprob", 0.8f, 40, 0.95f, 1},
        {"top-k 40, top-p 0.95, T 0.8 + 5 top logprobs", 0.8f, 40, 0.95f, 6},
        {"top-p 0.95, T 0.8 (no top-k)", 0.8f, 0, 0.95f, 0},
        {"T 0.8 alone (OpenAI's defaults: top-p 1)", 0.8f, 0, 1.0f, 0},
    };
    printf("sampler on a %u-token row, median of %d calls (5.22 ms = one Glimmer decode step on the H200)\n", V, reps);
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        muser_sampler_params p;
        muser_sampler_params_default(&p);
        p.temperature = cfg[c].temp;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.min_p = 0.0f;
        p.n_logprobs = cfg[c].lp > 1 ? cfg[c].lp - 1 : 0;
        p.seed = 1;
        muser_sampler *s = NULL;
        muser_error err = {0};
        if (muser_sampler_new(&s, V, &p, &err)) {
            fprintf(stderr, "bench_sampler: %s\n", err.msg);
            return 1;
        }
        muser_logprob top[20];
        float lp;
        for (int r = 0; r < reps; r++) {
            const double t0 = muser_now_s();
            (void)muser_sampler_sample(s, logits, cfg[c].lp ? &lp : NULL, cfg[c].lp > 1 ? top : NULL);
            t[r] = muser_now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp);
        const double med = t[reps / 2];
        printf("  %-42s %8.1f us  = %5.2f%% of a 5.22 ms step\n", cfg[c].name, med * 1e6, 100.0 * med / 5.22e-3);
        muser_sampler_free(s);
    }
    free(logits);
    free(t);
    return 0;
}
