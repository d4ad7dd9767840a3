/* handoff_cli.c — the --remote-prefill options of `muser run` and `muser serve` (handoff_cli.h). */
#include "handoff_cli.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

int cli_remote_parse(const char *cmd, int argc, char **argv, int *i, cli_remote *r)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    const char **dst = !strcmp(a, "--remote-prefill") ? &r->addr
                       : !strcmp(a, "--tls-dir")      ? &r->tls_dir
                       : !strcmp(a, "--hmac-key-file") ? &r->key_file
                       : !strcmp(a, "--ledger")        ? &r->ledger
                                                       : NULL;
    if (!dst && strcmp(a, "--handoff-timeout-ms")) return 0;
    if (!v || !*v) return cli_usage_error(cmd, "%s needs a value", a), -1;
    if (dst) {
        *dst = v;
    } else {
        uint64_t ms;
        if (!muser_parse_u64(v, &ms) || ms == 0 || ms > 3600000)
            return cli_usage_error(cmd, "--handoff-timeout-ms wants 1..3600000, got '%s'", v), -1;
        r->timeout_ms = (uint32_t)ms;
    }
    (*i)++;
    return 1;
}

int cli_remote_check(const char *cmd, const cli_remote *r)
{
    if (!r->addr && (r->tls_dir || r->key_file || r->ledger || r->timeout_ms))
        return cli_usage_error(cmd, "--tls-dir, --hmac-key-file, --ledger and --handoff-timeout-ms go with --remote-prefill");
    if (r->addr && (!r->tls_dir || !r->key_file))
        return cli_usage_error(cmd, "--remote-prefill needs --tls-dir DIR and --hmac-key-file F");
    const char *colon = r->addr ? strrchr(r->addr, ':') : NULL;
    uint64_t port;
    if (r->addr && (!colon || colon == r->addr || !muser_parse_u64(colon + 1, &port) || port == 0 || port > 65535))
        return cli_usage_error(cmd, "--remote-prefill wants HOST:PORT, got '%s'", r->addr);
    return 0;
}

void cli_remote_help(FILE *f)
{
    fprintf(f, "  --remote-prefill HOST:PORT  take the prompt's KV cache from a `muser prefill-serve`\n"
               "                          producer instead of prefilling here (docs/handoff.md);\n"
               "                          a refused handoff is an error, never a local fallback\n"
               "  --tls-dir DIR           ca.pem (the producer's CA), our cert.pem and key.pem\n"
               "  --hmac-key-file F       the key shared with the producer (>= 32 bytes, mode 600)\n"
               "  --ledger FILE           session ids already installed (default\n"
               "                          $XDG_STATE_HOME/muser/handoff.ledger)\n"
               "  --handoff-timeout-ms MS the longest wait for the producer (default %u)\n",
            HANDOFF_DEFAULT_TIMEOUT_MS);
}

int cli_remote_client(const char *cmd, const cli_remote *r, const muser_model *m, const char *model_path,
                      volatile sig_atomic_t *interrupt, handoff_client **out)
{
    *out = NULL;
    if (!r->addr) return 0;
    char host[256];
    const char *colon = strrchr(r->addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - r->addr), r->addr);
    muser_error err = {0};
    uint8_t id[HX_MODEL_ID_BYTES];
    if (handoff_model_id(m, model_path, id, &err)) {
        fprintf(stderr, "muser %s: %s\n", cmd, err.msg);
        return 1;
    }
    const handoff_client_opts o = {.host = host, .port = (uint16_t)atoi(colon + 1), .tls_dir = r->tls_dir,
                                   .key_file = r->key_file, .ledger = r->ledger, .model_id = id,
                                   .timeout_ms = r->timeout_ms, .interrupt = interrupt};
    if (handoff_client_new(out, &o, &err)) {
        fprintf(stderr, "muser %s: remote prefill: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

int gen_prefill_remote(gen_ctx *g, handoff_client *c, const int32_t *toks, size_t n, handoff_stats *st,
                       muser_error *err)
{
    if (n > UINT32_MAX) return muser_errorf(err, MUSER_E_ARG, "%zu tokens in one prompt", n);
    const int rc = handoff_fetch(c, g->seq, toks, (uint32_t)n, g->logits, st, err);
    if (!rc) {
        g->top_n = 0;
        g->drawn = false;
    }
    for (size_t i = 0; !rc && i < n; i++) muser_sampler_accept(g->smp, toks[i]);
    return rc;
}
