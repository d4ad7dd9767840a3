/* cmd_eval.c — `muser eval`: teacher-forced logits for token lists, each its own sequence on one
 * device, through the route asked for (prefill chunks, one-row decode, verify blocks, or packed
 * steps across the sequences). The logits of every position are kept; they can be dumped as
 * little-endian f32 [n_tokens][V] for comparison with other engines or routes, and a short top-1
 * summary and the SHA-256 go to stdout. */
#include "cli.h"
#include "session.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_SUMMARY_ROWS 32 /* positions listed in the summary before eliding */

static void eval_help(FILE *f)
{
    fprintf(f,
            "usage: muser eval -m MODEL --tokens ID,ID,... [--tokens ID,... ...] [options]\n\n"
            "Feed the tokens teacher-forced (every position sees the true prefix) and compute\n"
            "the logits of every position. Each --tokens list is its own sequence, all on one\n"
            "device. Prints the top-1 token per position (one sequence) and the logits' SHA-256.\n\n"
            "options:\n"
            "  -m, --model PATH      GGUF model (default: $MUSER_MODEL or models/default.gguf)\n"
            "  --tokens LIST         comma-separated token ids, e.g. 1,2,3 (repeat: more sequences)\n"
            "  --route NAME          batch (default: the prefill route, --max-batch rows per call),\n"
            "                        decode (one row per pass), verify (blocks of up to 16 rows of\n"
            "                        one sequence per pass) or packed (step i of every sequence in\n"
            "                        one pass); decode, verify and packed give the same bytes\n"
            "  --backend NAME        cpu (default), oracle (the f64 reference) or cuda\n"
            "  --ctx N               context length to allocate (default: the number of tokens)\n"
            "  --max-batch N         rows per forward call (default 512)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  --dump-logits FILE    write the logits as little-endian f32 [n_tokens][V]; with\n"
            "                        several sequences, sequence k to FILE.k\n"
            "  -h, --help            this help\n");
}

static bool little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static int write_logits(const char *path, const float *logits, size_t count)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t done = 0;
    if (little_endian()) {
        done = fwrite(logits, sizeof(float), count, f);
    } else {
        for (; done < count; done++) {
            uint32_t u;
            uint8_t b[4];
            memcpy(&u, &logits[done], 4);
            for (int i = 0; i < 4; i++)
                b[i] = (uint8_t)(u >> (8 * i));
            if (fwrite(b, 1, 4, f) != 4)
                break;
        }
    }
    int rc = fclose(f);
    return done == count && rc == 0 ? 0 : -1;
}

#define EVAL_MAX_SEQS 64
#define EVAL_VERIFY_ROWS 16

enum { ROUTE_BATCH, ROUTE_DECODE, ROUTE_VERIFY, ROUTE_PACKED };

/* Runs every sequence on one device through the chosen route; logits[k] gets [n[k]][V]. */
static int eval_run(muser_device *d, muser_session **s, int32_t **tok, const uint32_t *n, uint32_t n_seq, int route,
                    float **logits, muser_error *err)
{
    const uint64_t V = d->model->hp.n_vocab;
    muser_session *rs[MUSER_STEP_MAX_ROWS];
    int32_t rt[MUSER_STEP_MAX_ROWS];
    float *rl = NULL;
    int rc = 0;
    if (route == ROUTE_PACKED) {
        rl = malloc((size_t)n_seq * V * sizeof(float));
        if (!rl)
            return muser_errorf(err, MUSER_E_NOMEM, "eval: out of memory");
        uint32_t most = 0;
        for (uint32_t k = 0; k < n_seq; k++)
            most = n[k] > most ? n[k] : most;
        for (uint32_t i = 0; i < most && !rc; i++) {
            uint32_t r = 0;
            for (uint32_t k = 0; k < n_seq; k++)
                if (i < n[k]) {
                    rs[r] = s[k];
                    rt[r++] = tok[k][i];
                }
            rc = muser_step(d, rs, rt, r, rl, NULL, NULL, err);
            r = 0;
            for (uint32_t k = 0; k < n_seq && !rc; k++)
                if (i < n[k])
                    memcpy(logits[k] + (size_t)i * V, rl + (size_t)(r++) * V, V * sizeof(float));
        }
        free(rl);
        return rc;
    }
    for (uint32_t k = 0; k < n_seq && !rc; k++)
        for (uint32_t at = 0; at < n[k] && !rc;) {
            uint32_t c = route == ROUTE_DECODE ? 1 : route == ROUTE_VERIFY ? EVAL_VERIFY_ROWS : s[k]->opts.max_batch;
            if (c > n[k] - at)
                c = n[k] - at;
            if (route == ROUTE_BATCH) {
                rc = muser_session_forward(s[k], tok[k] + at, c, logits[k] + (size_t)at * V, true, err);
            } else {
                for (uint32_t j = 0; j < c; j++)
                    rs[j] = s[k];
                rc = muser_step(d, rs, tok[k] + at, c, logits[k] + (size_t)at * V, NULL, NULL, err);
            }
            at += c;
        }
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        eval_help(stdout);
        return 0;
    }
    const char *model_path = NULL, *tokens_arg[EVAL_MAX_SEQS], *dump = NULL;
    uint32_t n_seq = 0;
    int route = ROUTE_BATCH;
    muser_session_opts opts = {.backend = MUSER_BACKEND_CPU};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            return cli_usage_error("eval", "%s: unknown argument or missing value", a);
        i++;
        uint64_t u;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model_path = val;
        } else if (!strcmp(a, "--tokens")) {
            if (n_seq == EVAL_MAX_SEQS)
                return cli_usage_error("eval", "at most %d --tokens lists", EVAL_MAX_SEQS);
            tokens_arg[n_seq++] = val;
        } else if (!strcmp(a, "--route")) {
            if (!strcmp(val, "batch"))
                route = ROUTE_BATCH;
            else if (!strcmp(val, "decode"))
                route = ROUTE_DECODE;
            else if (!strcmp(val, "verify"))
                route = ROUTE_VERIFY;
            else if (!strcmp(val, "packed"))
                route = ROUTE_PACKED;
            else
                return cli_usage_error("eval", "unknown route '%s' (batch, decode, verify, packed)", val);
        } else if (!strcmp(a, "--dump-logits")) {
            dump = val;
        } else if (!strcmp(a, "--backend")) {
            int b = muser_backend_from_name(val);
            if (b < 0)
                return cli_usage_error("eval", "unknown backend '%s' (cpu, oracle, cuda)", val);
            opts.backend = (muser_backend_kind)b;
        } else if (!strcmp(a, "--ctx")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > (1ull << 32))
                return cli_usage_error("eval", "--ctx wants 1..2^32, not '%s'", val);
            opts.n_ctx = u;
        } else if (!strcmp(a, "--max-batch")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > 65536)
                return cli_usage_error("eval", "--max-batch wants 1..65536, not '%s'", val);
            opts.max_batch = (uint32_t)u;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!muser_parse_u64(val, &u) || u == 0 || u > 1024)
                return cli_usage_error("eval", "--threads wants 1..1024, not '%s'", val);
            opts.n_threads = (uint32_t)u;
        } else {
            return cli_usage_error("eval", "unknown argument '%s'", a);
        }
    }
    if (!n_seq)
        return cli_usage_error("eval", "--tokens is required");
    if (route == ROUTE_PACKED && n_seq > MUSER_STEP_MAX_ROWS)
        return cli_usage_error("eval", "--route packed takes at most %u sequences", MUSER_STEP_MAX_ROWS);
    int32_t *tokens[EVAL_MAX_SEQS] = {0};
    uint32_t n[EVAL_MAX_SEQS] = {0}, most = 0;
    muser_session *s[EVAL_MAX_SEQS] = {0};
    float *logits[EVAL_MAX_SEQS] = {0};
    int status = 1;
    muser_error err = {0};
    muser_model *m = NULL;
    muser_device *d = NULL;
    for (uint32_t k = 0; k < n_seq; k++) {
        if (!cli_parse_token_list(tokens_arg[k], &tokens[k], &n[k])) {
            status = cli_usage_error("eval", "--tokens wants comma-separated ids, not '%s'", tokens_arg[k]);
            goto done;
        }
        most = n[k] > most ? n[k] : most;
    }
    if (!model_path)
        model_path = cli_default_model();
    if (muser_model_load(&m, model_path, &err)) {
        fprintf(stderr, "muser eval: %s\n", err.msg);
        goto done;
    }
    const uint32_t V = m->hp.n_vocab;
    for (uint32_t k = 0; k < n_seq; k++)
        for (uint32_t i = 0; i < n[k]; i++)
            if ((uint32_t)tokens[k][i] >= V) {
                status = cli_usage_error("eval", "token %d at index %u is not in the vocabulary [0, %u)",
                                         tokens[k][i], i, V);
                goto done;
            }
    if (opts.n_ctx == 0)
        opts.n_ctx = most;
    if (muser_device_new(&d, m, &opts, &err)) {
        fprintf(stderr, "muser eval: %s\n", err.msg);
        goto done;
    }
    for (uint32_t k = 0; k < n_seq; k++) {
        if (muser_session_open(&s[k], d, 0, &err)) {
            fprintf(stderr, "muser eval: %s\n", err.msg);
            goto done;
        }
        if (!(logits[k] = malloc((size_t)n[k] * V * sizeof(float)))) {
            fprintf(stderr, "muser eval: out of memory for %u x %u logits\n", n[k], V);
            goto done;
        }
    }
    static const char *const route_name[] = {"batch", "decode", "verify", "packed"};
    double t0 = muser_now_s();
    if (eval_run(d, s, tokens, n, n_seq, route, logits, &err)) {
        fprintf(stderr, "muser eval: %s\n", err.msg);
        goto done;
    }
    double dt = muser_now_s() - t0;
    uint64_t total = 0;
    for (uint32_t k = 0; k < n_seq; k++)
        total += n[k];
    printf("eval: %s, backend %s, route %s, %u sequence%s, %llu tokens, %.3f s (%.1f tok/s)\n", model_path,
           muser_backend_name(opts.backend), route_name[route], n_seq, n_seq == 1 ? "" : "s",
           (unsigned long long)total, dt, dt > 0 ? total / dt : 0.0);
    if (n_seq == 1) {
        printf("%6s %8s %8s %12s %12s\n", "pos", "token", "top1", "logit", "logprob");
        for (uint32_t p = 0; p < n[0]; p++) {
            if (n[0] > EVAL_SUMMARY_ROWS && p == EVAL_SUMMARY_ROWS / 2) {
                printf("%6s (%u positions not shown)\n", "...", n[0] - EVAL_SUMMARY_ROWS);
                p = n[0] - EVAL_SUMMARY_ROWS / 2;
            }
            const float *row = logits[0] + (size_t)p * V;
            uint32_t best = 0;
            for (uint32_t i = 1; i < V; i++)
                if (row[i] > row[best])
                    best = i;
            double sum = 0.0;
            for (uint32_t i = 0; i < V; i++)
                sum += exp((double)row[i] - row[best]);
            printf("%6u %8d %8u %12.5f %12.5f\n", p, tokens[0][p], best, row[best], -log(sum));
        }
    }
    for (uint32_t k = 0; k < n_seq; k++) {
        char sha[65];
        muser_sha256_hex(logits[k], (size_t)n[k] * V * sizeof(float), sha);
        if (n_seq == 1)
            printf("logits sha256 %s\n", sha);
        else
            printf("sequence %u: %u tokens, logits sha256 %s\n", k, n[k], sha);
        if (dump) {
            char path[4096];
            if (n_seq == 1)
                snprintf(path, sizeof path, "%s", dump);
            else
                snprintf(path, sizeof path, "%s.%u", dump, k);
            if (write_logits(path, logits[k], (size_t)n[k] * V)) {
                fprintf(stderr, "muser eval: cannot write %s\n", path);
                goto done;
            }
            printf("wrote %s: f32 little-endian [%u][%u]\n", path, n[k], V);
        }
    }
    status = 0;
done:
    for (uint32_t k = 0; k < n_seq; k++) {
        free(logits[k]);
        muser_session_free(s[k]);
        free(tokens[k]);
    }
    muser_device_free(d);
    muser_model_free(m);
    return status;
}
