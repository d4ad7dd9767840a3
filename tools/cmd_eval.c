/* cmd_eval.c — `muser eval`: teacher-forced logits for a token list. Every token is fed (the
 * batch route, in chunks of --max-batch rows) and the logits of every position are kept; they
 * can be dumped as little-endian f32 [n_tokens][V] for comparison with other engines, and a
 * short top-1 summary goes to stdout. */
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
            "usage: muser eval -m MODEL --tokens ID,ID,... [options]\n\n"
            "Feed the tokens teacher-forced (every position sees the true prefix) and compute\n"
            "the logits of every position. Prints the top-1 token per position.\n\n"
            "options:\n"
            "  -m, --model PATH      GGUF model (default: $MUSER_MODEL or models/default.gguf)\n"
            "  --tokens LIST         comma-separated token ids, e.g. 1,2,3\n"
            "  --backend NAME        cpu (default), oracle (the f64 reference) or cuda\n"
            "  --ctx N               context length to allocate (default: the number of tokens)\n"
            "  --max-batch N         rows per forward call (default 512)\n"
            "  -t, --threads N       CPU threads (default: all cores)\n"
            "  --dump-logits FILE    write the logits as little-endian f32 [n_tokens][V]\n"
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

int cmd_eval(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        eval_help(stdout);
        return 0;
    }
    const char *model_path = NULL, *tokens_arg = NULL, *dump = NULL;
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
            tokens_arg = val;
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
    if (!tokens_arg)
        return cli_usage_error("eval", "--tokens is required");
    int32_t *tokens = NULL;
    uint32_t n = 0;
    if (!cli_parse_token_list(tokens_arg, &tokens, &n))
        return cli_usage_error("eval", "--tokens wants comma-separated ids, not '%s'",
                               tokens_arg);
    if (!model_path)
        model_path = cli_default_model();

    muser_error err = {0};
    muser_model *m = NULL;
    muser_session *s = NULL;
    float *logits = NULL;
    int status = 1;
    if (muser_model_load(&m, model_path, &err)) {
        fprintf(stderr, "muser eval: %s\n", err.msg);
        goto done;
    }
    const uint32_t V = m->hp.n_vocab;
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)tokens[i] >= V) {
            status = cli_usage_error("eval", "token %d at index %u is not in the vocabulary [0, %u)",
                                     tokens[i], i, V);
            goto done;
        }
    if (opts.n_ctx == 0)
        opts.n_ctx = n;
    if (muser_session_new(&s, m, &opts, &err)) {
        fprintf(stderr, "muser eval: %s\n", err.msg);
        goto done;
    }
    logits = malloc((size_t)n * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "muser eval: out of memory for %u x %u logits\n", n, V);
        goto done;
    }
    double t0 = muser_now_s();
    for (uint32_t at = 0; at < n;) {
        uint32_t chunk = n - at < s->opts.max_batch ? n - at : s->opts.max_batch;
        if (muser_session_forward(s, tokens + at, chunk, logits + (size_t)at * V, true, &err)) {
            fprintf(stderr, "muser eval: at position %u: %s\n", at, err.msg);
            goto done;
        }
        at += chunk;
    }
    double dt = muser_now_s() - t0;

    printf("eval: %s, backend %s, %u tokens, %.3f s (%.1f tok/s)\n", model_path,
           muser_backend_name(opts.backend), n, dt, dt > 0 ? n / dt : 0.0);
    printf("%6s %8s %8s %12s %12s\n", "pos", "token", "top1", "logit", "logprob");
    for (uint32_t p = 0; p < n; p++) {
        if (n > EVAL_SUMMARY_ROWS && p == EVAL_SUMMARY_ROWS / 2) {
            printf("%6s (%u positions not shown)\n", "...", n - EVAL_SUMMARY_ROWS);
            p = n - EVAL_SUMMARY_ROWS / 2;
        }
        const float *row = logits + (size_t)p * V;
        uint32_t best = 0;
        for (uint32_t i = 1; i < V; i++)
            if (row[i] > row[best])
                best = i;
        double sum = 0.0;
        for (uint32_t i = 0; i < V; i++)
            sum += exp((double)row[i] - row[best]);
        printf("%6u %8d %8u %12.5f %12.5f\n", p, tokens[p], best, row[best], -log(sum));
    }
    char sha[65];
    muser_sha256_hex(logits, (size_t)n * V * sizeof(float), sha);
    printf("logits sha256 %s\n", sha);
    if (dump) {
        if (write_logits(dump, logits, (size_t)n * V)) {
            fprintf(stderr, "muser eval: cannot write %s\n", dump);
            goto done;
        }
        printf("wrote %s: f32 little-endian [%u][%u]\n", dump, n, V);
    }
    status = 0;
done:
    free(logits);
    muser_session_free(s);
    muser_model_free(m);
    free(tokens);
    return status;
}
