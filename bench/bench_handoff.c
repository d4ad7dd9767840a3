/* bench_handoff.c — remote prefill on one machine: time to first token through a loopback
 * producer against a local prefill, the bytes on the wire per prompt token, and the TLS stream's
 * throughput with the per-frame HMAC on both ends.
 *
 *   bench_handoff MODEL CERTS [N ...] [--threads T] [--reps R] [--tile-rows K]
 *
 * CERTS is a scripts/make-test-certs.sh directory. For each prompt length N (default 128 512):
 * local TTFT is one muser_seq_prefill of N tokens (its last row's logits: what the first token is
 * sampled from); remote TTFT is one handoff_fetch of the same tokens from a producer in this
 * process (its own engine, T threads) over loopback TLS, until the cache is installed and the
 * logits are in hand; "after the producer's prefill" is the part of it past the end of the
 * producer's last prefill pass (the handoff's own latency, whatever the prefill's speed). Medians
 * over R runs, alternating local and remote. The producer and the consumer share the machine: on the 2-core VM the remote path can only add the transfer and the
 * install to the same prefill. The stream figure sends 64 MiB in 512 KiB tile frames (sealed,
 * HMAC-SHA256) over loopback TLS 1.3 and verifies each on arrival. */
#include "handoff/handoff.h"
#include "handoff/tls.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- the stream: one frame sender thread, the reader here ---- */

#define STREAM_FRAME (512u << 10)
#define STREAM_FRAMES 128u

typedef struct stream_side {
    hx_auth *auth;
    int lfd;
    double t_sent;
} stream_side;

static void *stream_sender(void *arg)
{
    stream_side *s = arg;
    const int fd = accept(s->lfd, NULL, NULL);
    hx_conn c;
    muser_error err = {0};
    uint8_t *frame = calloc(1, hx_frame_bytes(HX_TILE, STREAM_FRAME));
    const uint8_t sid[HX_ID_BYTES] = {1};
    if (hx_accept(&c, s->auth, fd, "consumer", 10000, &err) == 0)
        for (uint32_t i = 0; i < STREAM_FRAMES; i++) {
            frame[HX_HEADER_BYTES] = (uint8_t)i; /* different bytes each frame */
            if (hx_frame_send(&c, s->auth, sid, HX_TILE, i, frame, STREAM_FRAME, &err)) break;
        }
    if (err.code) fprintf(stderr, "stream sender: %s\n", err.msg);
    hx_linger(&c, 1000);
    hx_close(&c);
    free(frame);
    return NULL;
}

static double stream_mb_s(const char *certs)
{
    char dir[600], key[600];
    hx_auth ps, cs;
    muser_error err = {0};
    snprintf(key, sizeof key, "%s/hmac.key", certs);
    snprintf(dir, sizeof dir, "%s/producer", certs);
    if (hx_auth_load(&ps, dir, key, true, &err)) return fprintf(stderr, "%s\n", err.msg), 0;
    snprintf(dir, sizeof dir, "%s/consumer", certs);
    if (hx_auth_load(&cs, dir, key, false, &err)) return fprintf(stderr, "%s\n", err.msg), 0;
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    stream_side s = {.auth = &ps, .lfd = socket(AF_INET, SOCK_STREAM, 0)};
    if (bind(s.lfd, (struct sockaddr *)&a, sizeof a) || listen(s.lfd, 1) || getsockname(s.lfd, (struct sockaddr *)&a, &al))
        return perror("listen"), 0;
    pthread_t th;
    pthread_create(&th, NULL, stream_sender, &s);
    hx_conn c;
    uint8_t *buf = malloc(STREAM_FRAME + HX_MAC_BYTES);
    const uint8_t sid[HX_ID_BYTES] = {1};
    double t0 = 0, t1 = 0;
    uint32_t ok = 0;
    if (hx_connect(&c, &cs, "127.0.0.1", ntohs(a.sin_port), 10000, NULL, &err) == 0) {
        t0 = muser_now_s();
        for (uint32_t i = 0; i < STREAM_FRAMES; i++) {
            uint8_t hdr[HX_HEADER_BYTES];
            hx_header h;
            if (hx_read(&c, hdr, sizeof hdr, "a header", &err) || hx_header_decode(hdr, &h, &err) ||
                h.length != STREAM_FRAME || hx_read(&c, buf, STREAM_FRAME + HX_MAC_BYTES, "a frame", &err))
                break;
            ok += hx_mac_ok(cs.key, cs.key_len, sid, hdr, buf, STREAM_FRAME, buf + STREAM_FRAME);
        }
        t1 = muser_now_s();
    }
    if (err.code) fprintf(stderr, "stream: %s\n", err.msg);
    hx_close(&c);
    pthread_join(th, NULL);
    close(s.lfd);
    free(buf);
    hx_auth_free(&ps);
    hx_auth_free(&cs);
    if (ok != STREAM_FRAMES) return fprintf(stderr, "stream: %u of %u frames verified\n", ok, STREAM_FRAMES), 0;
    return (double)STREAM_FRAMES * STREAM_FRAME / (t1 - t0) / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_handoff MODEL CERTS [N ...] [--threads T] [--reps R] [--tile-rows K]\n");
        return 2;
    }
    uint32_t lens[16], n_lens = 0, threads = 2, reps = 3, tile_rows = HX_TILE_ROWS;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tile-rows") && i + 1 < argc) tile_rows = (uint32_t)atoi(argv[++i]);
        else if (n_lens < 16) lens[n_lens++] = (uint32_t)atoi(argv[i]);
    }
    if (!n_lens) lens[n_lens++] = 128, lens[n_lens++] = 512;
    muser_error err = {0};
    muser_model *m = NULL;
    uint8_t id[HX_MODEL_ID_BYTES];
    if (muser_model_load(&m, argv[1], &err) || handoff_model_id(m, argv[1], id, &err)) {
        fprintf(stderr, "bench_handoff: %s\n", err.msg);
        return 1;
    }
    const muser_hparams *hp = &m->hp;
    uint32_t most = 0;
    for (uint32_t i = 0; i < n_lens; i++) most = lens[i] > most ? lens[i] : most;
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev.n_threads = threads;
    eo.dev.n_ctx = most;
    muser_engine *pe = NULL, *ce = NULL;
    handoff_producer *p = NULL;
    handoff_client *c = NULL;
    char pdir[600], cdir[600], key[600], ledger[600];
    snprintf(pdir, sizeof pdir, "%s/producer", argv[2]);
    snprintf(cdir, sizeof cdir, "%s/consumer", argv[2]);
    snprintf(key, sizeof key, "%s/hmac.key", argv[2]);
    snprintf(ledger, sizeof ledger, "%s/bench.ledger", argv[2]);
    const handoff_producer_opts po = {.tls_dir = pdir, .key_file = key, .model_id = id, .tile_rows = tile_rows};
    if (muser_engine_new(&pe, m, &eo, &err) || muser_engine_new(&ce, m, &eo, &err) ||
        handoff_producer_start(&p, pe, &po, &err)) {
        fprintf(stderr, "bench_handoff: %s\n", err.msg);
        return 1;
    }
    const handoff_client_opts co = {.host = "127.0.0.1", .port = handoff_producer_port(p), .tls_dir = cdir,
                                    .key_file = key, .ledger = ledger, .model_id = id, .timeout_ms = 600000};
    if (handoff_client_new(&c, &co, &err)) {
        fprintf(stderr, "bench_handoff: %s\n", err.msg);
        return 1;
    }
    printf("%s: %u layers, window %u, %u threads per engine, tiles of %u rows, %u reps\n", argv[1], hp->n_layer,
           hp->swa_window, threads, tile_rows, reps);
    printf("| prompt | local TTFT | remote TTFT | remote / local | first tile | after the producer's prefill | on the "
           "wire | per prompt token |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    for (uint32_t li = 0; li < n_lens; li++) {
        const uint32_t n = lens[li];
        int32_t *t = malloc(n * sizeof *t);
        for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)((i * 7919u + li * 31u + 13u) % hp->n_vocab);
        double loc[32], rem[32], first[32], tail[32];
        handoff_stats st = {0};
        int rc = MUSER_OK;
        for (uint32_t r = 0; r < reps && r < 32 && !rc; r++) {
            muser_seq *q = NULL;
            double t0 = muser_now_s();
            rc = muser_engine_open(ce, n, &q, &err);
            if (!rc) rc = muser_seq_prefill(q, t, n, logits, &err);
            loc[r] = muser_now_s() - t0;
            muser_engine_close(q);
            q = NULL;
            if (!rc) rc = muser_engine_open(ce, n, &q, &err);
            t0 = muser_now_s();
            if (!rc) rc = handoff_fetch(c, q, t, n, logits, &st, &err);
            const double t1 = muser_now_s();
            rem[r] = t1 - t0;
            first[r] = st.first_tile_s;
            /* the handoff's own latency: from the producer's last prefill pass to the cache installed */
            muser_pass_rec last = {0}, pass[64];
            const uint32_t np = muser_engine_passes(pe, pass, 64);
            for (uint32_t i = 0; i < np; i++)
                if (pass[i].kind == MUSER_PASS_PREFILL) last = pass[i];
            tail[r] = t1 - last.t_end;
            muser_engine_close(q);
        }
        if (rc) {
            fprintf(stderr, "bench_handoff: %u tokens: %s\n", n, err.msg);
            return 1;
        }
        const double l = median(loc, (int)reps), rr = median(rem, (int)reps), f = median(first, (int)reps),
                     tl = median(tail, (int)reps);
        printf("| %u | %.3f s | %.3f s | %.2fx | %.3f s | %.1f ms | %.2f MB | %.0f B |\n", n, l, rr, rr / l, f, tl * 1e3,
               st.bytes_in / 1e6, (double)st.bytes_in / n);
        free(t);
    }
    const double mbs = stream_mb_s(argv[2]);
    printf("TLS 1.3 loopback stream, %u frames of %u KiB, HMAC-SHA256 sealed and verified: %.0f MB/s\n", STREAM_FRAMES,
           STREAM_FRAME >> 10, mbs);
    free(logits);
    handoff_client_free(c);
    handoff_producer_stop(p);
    muser_engine_free(pe);
    muser_engine_free(ce);
    muser_model_free(m);
    return mbs > 0 ? 0 : 1;
}
