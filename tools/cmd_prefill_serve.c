/* cmd_prefill_serve.c — `muser prefill-serve`: the remote-prefill producer (src/handoff/,
 * docs/handoff.md). Loads the model, starts an engine on the chosen backend, listens for consumers
 * over mutual TLS and streams each one the KV cache of the prompt it sends; a line per session on
 * stderr. SIGTERM or SIGINT stops it (running sessions end; their consumers install nothing). */
#include "cli.h"
#include "engine.h"
#include "handoff/handoff.h"
#include "util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void prefill_serve_help(FILE *f)
{
    fprintf(f,
            "usage: muser prefill-serve [-m MODEL] [--host 127.0.0.1] --port P --tls-dir DIR\n"
            "                           --hmac-key-file F [options]\n\n"
            "The remote-prefill producer: consumers (`muser run|serve --remote-prefill HOST:PORT`)\n"
            "send a prompt; it is prefilled here and its KV cache streamed back in HMAC-sealed\n"
            "tiles over mutually authenticated TLS 1.3 (docs/handoff.md). One session per\n"
            "connection; a line per session on stderr. SIGTERM or SIGINT stops it.\n\n"
            "options:\n"
            "  --host ADDR             IPv4 address to listen on (default 127.0.0.1)\n"
            "  --port N                TCP port (0: any free one, printed)\n"
            "  --tls-dir DIR           ca.pem (the CA consumers' certificates must chain to),\n"
            "                          our cert.pem and key.pem (scripts/make-test-certs.sh)\n"
            "  --hmac-key-file F       the key shared with the consumers (>= 32 bytes, mode 600)\n"
            "  --max-conns N           sessions at once (default %u); more are turned away\n"
            "  --timeout-ms MS         the longest wait on a consumer (default %u)\n"
            "  --tile-rows N           rows per KV tile, %u..%u (default %u)\n"
            "  --ctx N                 the longest prompt taken (default: the model's context)\n"
            "  --backend NAME          cpu (default), cuda or oracle\n"
            "  -t, --threads N         CPU threads; 0 = all cores (default 0)\n"
            "  -m, --model PATH        GGUF model (default: $MUSER_MODEL, else %s)\n"
            "  -h, --help              this help\n",
            HANDOFF_DEFAULT_MAX_CONNS, HANDOFF_DEFAULT_TIMEOUT_MS, HX_TILE_ROWS_MIN, HX_TILE_ROWS, HX_TILE_ROWS,
            cli_default_model());
}

int cmd_prefill_serve(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        prefill_serve_help(stdout);
        return 0;
    }
    const char *model = NULL, *host = "127.0.0.1", *tls_dir = NULL, *key_file = NULL;
    uint64_t port = 0, max_conns = HANDOFF_DEFAULT_MAX_CONNS, timeout = HANDOFF_DEFAULT_TIMEOUT_MS,
             tile_rows = HX_TILE_ROWS, ctx = 0, threads = 0;
    bool have_port = false;
    muser_backend_kind backend = MUSER_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t *num = !strcmp(a, "--port")                           ? &port
                        : !strcmp(a, "--max-conns")                    ? &max_conns
                        : !strcmp(a, "--timeout-ms")                   ? &timeout
                        : !strcmp(a, "--tile-rows")                    ? &tile_rows
                        : !strcmp(a, "--ctx")                          ? &ctx
                        : !strcmp(a, "-t") || !strcmp(a, "--threads") ? &threads
                                                                       : NULL;
        const char **str = !strcmp(a, "-m") || !strcmp(a, "--model") ? &model
                           : !strcmp(a, "--host")                    ? &host
                           : !strcmp(a, "--tls-dir")                 ? &tls_dir
                           : !strcmp(a, "--hmac-key-file")           ? &key_file
                                                                     : NULL;
        if (!num && !str && strcmp(a, "--backend")) return cli_usage_error("prefill-serve", "unknown option '%s'", a);
        if (!v) return cli_usage_error("prefill-serve", "%s needs a value", a);
        i++;
        if (str) {
            *str = v;
        } else if (!num) {
            const int b = muser_backend_from_name(v);
            if (b < 0) return cli_usage_error("prefill-serve", "--backend must be cpu, cuda or oracle, got '%s'", v);
            backend = (muser_backend_kind)b;
        } else if (!muser_parse_u64(v, num) || (num == &port && *num > 65535) || (num == &max_conns && (!*num || *num > 1024)) ||
                   (num == &timeout && (!*num || *num > 3600000)) || (num == &threads && *num > 512) ||
                   (num == &tile_rows && (*num < HX_TILE_ROWS_MIN || *num > HX_TILE_ROWS))) {
            return cli_usage_error("prefill-serve", "%s: '%s' is out of range", a, v);
        }
        have_port |= num == &port;
    }
    if (!have_port || !tls_dir || !key_file)
        return cli_usage_error("prefill-serve", "--port, --tls-dir and --hmac-key-file are required");
    const char *path = model ? model : cli_default_model();
    muser_error err = {0};
    muser_model *m = NULL;
    uint8_t id[HX_MODEL_ID_BYTES];
    char hex[2 * HX_MODEL_ID_BYTES + 1];
    if (muser_model_load(&m, path, &err) || handoff_model_id(m, path, id, &err)) {
        fprintf(stderr, "muser prefill-serve: cannot load model: %s\n", err.msg);
        muser_model_free(m);
        return 1;
    }
    hx_hex(id, HX_MODEL_ID_BYTES, hex);
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev.backend = backend;
    eo.dev.n_threads = (uint32_t)threads;
    eo.dev.n_ctx = ctx && ctx < m->hp.n_ctx_train ? ctx : m->hp.n_ctx_train;
    eo.max_seqs = (uint32_t)max_conns;
    muser_engine *e = NULL;
    handoff_producer *p = NULL;
    const handoff_producer_opts po = {.host = host, .port = (uint16_t)port, .tls_dir = tls_dir, .key_file = key_file,
                                      .model_id = id, .timeout_ms = (uint32_t)timeout, .max_conns = (uint32_t)max_conns,
                                      .tile_rows = (uint32_t)tile_rows, .log = stderr};
    int status = 1;
    if (muser_engine_new(&e, m, &eo, &err) || handoff_producer_start(&p, e, &po, &err)) {
        fprintf(stderr, "muser prefill-serve: %s\n", err.msg);
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    fprintf(stderr,
            "muser prefill-serve: listening on %s:%u; %s (sha256 %.16s...) on %s, prompts up to %llu tokens, tiles of %llu "
            "rows, %llu sessions at once\n",
            host, handoff_producer_port(p), path, hex, muser_backend_name(backend), (unsigned long long)eo.dev.n_ctx,
            (unsigned long long)tile_rows, (unsigned long long)max_conns);
    while (!stop_requested) usleep(100 * 1000);
    handoff_producer_stats st;
    handoff_producer_stats_get(p, &st);
    fprintf(stderr, "muser prefill-serve: stopping; %llu sessions served, %llu refused, %llu broken, %.2f MB sent\n",
            (unsigned long long)st.sessions, (unsigned long long)st.refused, (unsigned long long)st.failed,
            st.bytes_out / 1e6);
    status = 0;
out:
    handoff_producer_stop(p);
    muser_engine_free(e);
    muser_model_free(m);
    return status;
}
