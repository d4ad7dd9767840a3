/* cmd_parity.c — `muser parity`: measure a fast backend against the oracle (SPEC §4).
 *
 * Both run the same tokens from position 0 on the same weights; the fast backend through the
 * chosen route (decode: one token per call; batch: chunks of --max-batch rows), the oracle one
 * token at a time. Per position, over the whole vocabulary row:
 *   max_dlsm    max_i |log_softmax(fast)_i - log_softmax(oracle)_i|, in f64;
 *   n_over      how many i have that |Δ| > 1e-3 (the contract's tolerance, on log_softmax);
 *   top-1       fast argmax == oracle argmax, checked only where the oracle's best two logits
 *               are more than 1e-3 apart (closer pairs are ties the contract does not judge).
 * The contract holds when every position has max_dlsm <= 1e-3 and every checked top-1 agrees;
 * exit 0 then, 1 when it is breached (or on an error), 2 on a usage error. The SHA-256 of the
 * fast logits (f32 [n][V] bytes) identifies a run bit for bit. */
#include "cli.h"
#include "session.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PARITY_TOL 1e-3
#define PARITY_TABLE_ROWS 64 /* longer runs print a summary instead of the table */

typedef enum { ROUTE_DECODE, ROUTE_BATCH } parity_route;

typedef struct parity_pos {
    double max_dlsm;
    uint64_t n_over;
    uint32_t top_oracle, top_fast;
    double gap;       /* oracle's best minus second-best logit */
    bool checked;     /* gap > tolerance: top-1 must agree */
    bool agree;
} parity_pos;

static void parity_help(FILE *f)
{
    fprintf(f,
            "usage: muser parity -m MODEL [options]\n\n"
            "Compare a fast backend with the oracle (f64, f16 KV) on the same tokens (SPEC §4):\n"
            "per position, max |log_softmax(fast) - log_softmax(oracle)| over the whole\n"
            "vocabulary must be <= 1e-3, and the top-1 token must agree wherever the oracle's\n"
            "best two logits are more than 1e-3 apart.\n\n"
            "options:\n"
            "  -m, --model PATH      GGUF model (default: $MUSER_MODEL or models/default.gguf)\n"
            "  --backend NAME        the backend under test: cpu (default), cuda, oracle\n"
            "  --tokens N | LIST     N deterministic pseudo-random token ids (default 16), or a\n"
            "                        comma-separated list of ids (a list has a comma: '5,')\n"
            "  --seed S              seed of the pseudo-random ids (default 1)\n"
            "  --route decode|batch  decode: one token per call (default); batch: the whole list\n"
            "                        in chunks of --max-batch rows\n"
            "  --max-batch N         rows per batch call (default 512)\n"
            "  --ctx N               context to allocate (default: the number of tokens)\n"
            "  -t, --threads N       CPU threads for both (default: all cores)\n"
            "  --json                one JSON object instead of the table\n"
            "  -h, --help            this help\n\n"
            "n_over counts the logits whose |Δ log_softmax| > 1e-3. Exit status: 0 contract met,\n"
            "1 breached or error, 2 usage error.\n");
}

/* Deterministic pseudo-random ids in [0, V): splitmix64 of the seed. */
static void random_tokens(int32_t *t, uint32_t n, uint32_t V, uint64_t seed)
{
    uint64_t x = seed;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        t[i] = (int32_t)(z % V);
    }
}

/* log_softmax normaliser of a row: max + log Σ exp(x - max), f64. */
static double log_norm(const float *x, uint32_t V)
{
    double mx = x[0];
    for (uint32_t i = 1; i < V; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (uint32_t i = 0; i < V; i++)
        sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

static void compare_row(const float *fast, const float *oracle, uint32_t V, parity_pos *r)
{
    const double nf = log_norm(fast, V), no = log_norm(oracle, V);
    r->max_dlsm = 0.0;
    r->n_over = 0;
    uint32_t best = 0, second = V > 1 ? 1 : 0, bf = 0;
    if (V > 1 && oracle[1] > oracle[0]) {
        best = 1;
        second = 0;
    }
    for (uint32_t i = 0; i < V; i++) {
        const double d = fabs(((double)fast[i] - nf) - ((double)oracle[i] - no));
        if (!(d <= r->max_dlsm)) /* NaN propagates as the worst */
            r->max_dlsm = isnan(d) ? INFINITY : d;
        r->n_over += !(d <= PARITY_TOL);
        if (fast[i] > fast[bf])
            bf = i;
        if (i >= 2) {
            if (oracle[i] > oracle[best]) {
                second = best;
                best = i;
            } else if (oracle[i] > oracle[second]) {
                second = i;
            }
        }
    }
    r->top_oracle = best;
    r->top_fast = bf;
    r->gap = V > 1 ? (double)oracle[best] - oracle[second] : INFINITY;
    r->checked = r->gap > PARITY_TOL;
    r->agree = best == bf;
}

/* Run tokens through s: one per call (decode) or chunks of max_batch (batch); logits [n][V]. */
static int run_route(muser_session *s, const int32_t *tok, uint32_t n, parity_route route,
                     float *logits, double *seconds, muser_error *err)
{
    const uint32_t V = s->model->hp.n_vocab;
    const uint32_t step = route == ROUTE_DECODE ? 1 : s->opts.max_batch;
    double t0 = muser_now_s();
    for (uint32_t at = 0; at < n;) {
        const uint32_t c = n - at < step ? n - at : step;
        int rc = muser_session_forward(s, tok + at, c, logits + (size_t)at * V, true, err);
        if (rc)
            return rc;
        at += c;
    }
    *seconds = muser_now_s() - t0;
    return MUSER_OK;
}

int cmd_parity(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        parity_help(stdout);
        return 0;
    }
    const char *model_path = NULL, *tokens_arg = NULL;
    muser_session_opts fopts = {.backend = MUSER_BACKEND_CPU};
    parity_route route = ROUTE_DECODE;
    uint64_t seed = 1, n_random = 16;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            return cli_usage_error("parity", "%s: unknown argument or missing value", a);
        i++;
        uint64_t u;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model_path = val;
        } else if (!strcmp(a, "--backend")) {
            int b = muser_backend_from_name(val);
            if (b < 0)
                return cli_usage_error("parity", "unknown backend '%s' (cpu, cuda, oracle)", val);
            fopts.backend = (muser_backend_kind)b;
        } else if (!strcmp(a, "--tokens")) {
            if (strchr(val, ',')) {
                tokens_arg = val;
            } else if (!muser_parse_u64(val, &n_random) || n_random == 0 ||
                       n_random > (1u << 24)) {
                return cli_usage_error("parity",
                                       "--tokens wants a count 1..2^24 or a list 'ID,ID,...', "
                                       "not '%s'",
                                       val);
            }
        } else if (!strcmp(a, "--seed")) {
            if (!muser_parse_u64(val, &seed))
                return cli_usage_error("parity", "--seed wants a non-negative integer, not '%s'",
                                       val);
        } else if (!strcmp(a, "--route")) {
            if (!strcmp(val, "decode"))
                route = ROUTE_DECODE;
            else if (!strcmp(val, "batch"))
                route = ROUTE_BATCH;
            else
                return cli_usage_error("parity", "--route wants decode or batch, not '%s'", val);
        } else if (!strcmp(a, "--max-batch")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > 65536)
                return cli_usage_error("parity", "--max-batch wants 1..65536, not '%s'", val);
            fopts.max_batch = (uint32_t)u;
        } else if (!strcmp(a, "--ctx")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > (1ull << 32))
                return cli_usage_error("parity", "--ctx wants 1..2^32, not '%s'", val);
            fopts.n_ctx = u;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > 1024)
                return cli_usage_error("parity", "--threads wants 1..1024, not '%s'", val);
            fopts.n_threads = (uint32_t)u;
        } else {
            return cli_usage_error("parity", "unknown argument '%s'", a);
        }
    }
    int32_t *tokens = NULL;
    uint32_t n = 0;
    if (tokens_arg && !cli_parse_token_list(tokens_arg, &tokens, &n))
        return cli_usage_error("parity", "--tokens wants comma-separated ids, not '%s'",
                               tokens_arg);
    if (!model_path)
        model_path = cli_default_model();

    muser_error err = {0};
    muser_model *m = NULL;
    muser_session *fast = NULL, *oracle = NULL;
    float *lf = NULL, *lo = NULL;
    parity_pos *pos = NULL;
    int status = 1;
    if (muser_model_load(&m, model_path, &err)) {
        fprintf(stderr, "muser parity: %s\n", err.msg);
        goto done;
    }
    const uint32_t V = m->hp.n_vocab;
    if (!tokens) {
        n = (uint32_t)n_random;
        tokens = malloc(n * sizeof *tokens);
        if (!tokens) {
            fprintf(stderr, "muser parity: out of memory\n");
            goto done;
        }
        random_tokens(tokens, n, V, seed);
    }
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)tokens[i] >= V) {
            status = cli_usage_error("parity",
                                     "token %d at index %u is not in the vocabulary [0, %u)",
                                     tokens[i], i, V);
            goto done;
        }
    if (fopts.n_ctx == 0)
        fopts.n_ctx = n;
    muser_session_opts oopts = fopts;
    oopts.backend = MUSER_BACKEND_ORACLE;
    lf = malloc((size_t)n * V * sizeof(float));
    lo = malloc((size_t)n * V * sizeof(float));
    pos = calloc(n, sizeof *pos);
    if (!lf || !lo || !pos) {
        fprintf(stderr, "muser parity: out of memory for 2 x %u x %u logits\n", n, V);
        goto done;
    }
    double t_fast = 0, t_oracle = 0;
    if (muser_session_new(&fast, m, &fopts, &err) ||
        run_route(fast, tokens, n, route, lf, &t_fast, &err)) {
        fprintf(stderr, "muser parity: %s backend: %s\n", muser_backend_name(fopts.backend),
                err.msg);
        goto done;
    }
    const uint32_t max_batch = fast->opts.max_batch;
    muser_session_free(fast);
    fast = NULL; /* free its cache before the oracle allocates its own */
    if (muser_session_new(&oracle, m, &oopts, &err) ||
        run_route(oracle, tokens, n, ROUTE_DECODE, lo, &t_oracle, &err)) {
        fprintf(stderr, "muser parity: oracle: %s\n", err.msg);
        goto done;
    }

    double worst = 0.0;
    uint32_t worst_at = 0, n_checked = 0, n_agree = 0;
    uint64_t n_over = 0;
    for (uint32_t p = 0; p < n; p++) {
        compare_row(lf + (size_t)p * V, lo + (size_t)p * V, V, &pos[p]);
        if (pos[p].max_dlsm > worst || p == 0) {
            worst = pos[p].max_dlsm;
            worst_at = p;
        }
        n_over += pos[p].n_over;
        n_checked += pos[p].checked;
        n_agree += pos[p].checked && pos[p].agree;
    }
    char sha_fast[65], sha_oracle[65];
    muser_sha256_hex(lf, (size_t)n * V * sizeof(float), sha_fast);
    muser_sha256_hex(lo, (size_t)n * V * sizeof(float), sha_oracle);
    const bool pass = worst <= PARITY_TOL && n_agree == n_checked;
    const char *bname = muser_backend_name(fopts.backend);
    const char *rname = route == ROUTE_DECODE ? "decode" : "batch";

    if (json) {
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"route\": \"%s\", \"tokens\": %u, "
               "\"vocab\": %u, \"max_batch\": %u, \"tolerance\": %g, \"max_abs_dlogsoftmax\": "
               "%.6e, \"worst_position\": %u, \"logits_over_tolerance\": %llu, "
               "\"top1_checked\": %u, \"top1_agree\": %u, \"sha256_fast\": \"%s\", "
               "\"sha256_oracle\": \"%s\", \"seconds_fast\": %.3f, \"seconds_oracle\": %.3f, "
               "\"pass\": %s, \"positions\": [",
               model_path, bname, rname, n, V, max_batch,
               PARITY_TOL, worst, worst_at, (unsigned long long)n_over, n_checked, n_agree,
               sha_fast, sha_oracle, t_fast, t_oracle, pass ? "true" : "false");
        for (uint32_t p = 0; p < n; p++)
            printf("%s{\"pos\": %u, \"token\": %d, \"max_abs_dlogsoftmax\": %.6e, "
                   "\"over\": %llu, \"top1_oracle\": %u, \"top1_fast\": %u, \"gap\": %.6e, "
                   "\"checked\": %s, \"agree\": %s}",
                   p ? ", " : "", p, tokens[p], pos[p].max_dlsm,
                   (unsigned long long)pos[p].n_over, pos[p].top_oracle, pos[p].top_fast,
                   pos[p].gap, pos[p].checked ? "true" : "false",
                   pos[p].agree ? "true" : "false");
        printf("]}\n");
    } else {
        printf("parity: %s, backend %s vs oracle, route %s, %u tokens, vocab %u\n", model_path,
               bname, rname, n, V);
        if (n <= PARITY_TABLE_ROWS) {
            printf("%5s %8s %14s %8s %9s %9s %11s %s\n", "pos", "token", "max|dlsm|", "n>1e-3",
                   "top1(o)", "top1(f)", "gap(o)", "");
            for (uint32_t p = 0; p < n; p++)
                printf("%5u %8d %14.3e %8llu %9u %9u %11.3e %s\n", p, tokens[p],
                       pos[p].max_dlsm, (unsigned long long)pos[p].n_over, pos[p].top_oracle,
                       pos[p].top_fast, pos[p].gap,
                       !pos[p].checked     ? "tie"
                       : pos[p].agree      ? "ok"
                                           : "TOP-1 DIFFERS");
        }
        printf("time: %s %.3f s, oracle %.3f s\n", bname, t_fast, t_oracle);
        printf("sha256: %s %s  oracle %s\n", bname, sha_fast, sha_oracle);
        printf("%s: max |dlogsoftmax| %.3e at position %u (tolerance %.0e), %llu logits over, "
               "top-1 %u/%u agree (%u ties)\n",
               pass ? "PASS" : "FAIL", worst, worst_at, PARITY_TOL, (unsigned long long)n_over,
               n_agree, n_checked, n - n_checked);
    }
    status = pass ? 0 : 1;
done:
    free(lf);
    free(lo);
    free(pos);
    muser_session_free(fast);
    muser_session_free(oracle);
    muser_model_free(m);
    free(tokens);
    return status;
}
