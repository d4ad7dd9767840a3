/* test_handoff.c — remote prefill (src/handoff/) over loopback on the CPU, the producer and the
 * consumer in this process, each on an engine of its own (certificates from
 * scripts/make-test-certs.sh):
 *
 *   1. exact: the installed cache (muser_session_kv_sha256), the logits row that came with it and
 *      three rows decoded from it are the bytes a local prefill of the same tokens gives, on the
 *      tiny preset (window 16) and the trained model (window 64), prompts shorter and longer than
 *      the window, tiles of 64 and 512 rows, cold and with a warm prefix (delta: only the suffix
 *      crosses); the oracle backend once; and the FULL tiles leave the producer while it still
 *      prefills, the ring tiles after;
 *   2. refused, each with its reason in the error, the target sequence unchanged (position and
 *      digest), the caller's logits untouched, no sequence left open, and a bystander sequence
 *      decoding on the consumer's engine all the while giving its reference bytes: a flipped bit in
 *      a tile and in the manifest, a missing, a repeated and an oversized tile, a missing logits
 *      row, a truncated stream, a stalled producer (the timeout), the wrong model (either side
 *      noticing), the wrong HMAC key, a replayed session (and again after the consumer restarts:
 *      the ledger is a file), a consumer certificate from another CA, a producer certificate from
 *      another CA;
 *   3. the producer outlives bad clients: no certificate, garbage instead of TLS, a refused
 *      request; a good fetch works after each. */
#include "check.h"
#include "gpu.h"
#include "engine.h"
#include "handoff/handoff.h"
#include "handoff/ledger.h"
#include "synth.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define CTX 512

static char g_dir[256];
static int g_ledgers;
static bool g_san; /* MUSER_SANITIZED=1: ASan's build is ~20x slower; fewer and shorter prompts */

static int32_t tok_of(uint64_t i, uint32_t V) { return (int32_t)((i * 7919u + 13u) % V); }

static void make_tokens(int32_t *t, uint32_t n, uint32_t V)
{
    for (uint32_t i = 0; i < n; i++) t[i] = tok_of(i, V);
}

static void path_of(char *out, size_t cap, const char *rel) { snprintf(out, cap, "%s/%s", g_dir, rel); }

/* ---- a producer and a consumer ---- */

/* What the fault hook does, set per case (the producer's threads read it). */
typedef struct fault_plan {
    pthread_mutex_t mu;
    uint32_t type, index;
    handoff_fault act;
    bool edit_model;              /* the manifest's model id altered before it is sealed */
    bool fired;
    /* observation: when FULL tile 0 and the first ring tile were handed to TLS */
    double t_full0, t_ring0;
    uint32_t first_ring;
} fault_plan;

static fault_plan g_plan = {.mu = PTHREAD_MUTEX_INITIALIZER};

static handoff_fault on_frame(void *ctx, uint32_t type, uint32_t index, uint8_t *payload, uint32_t len)
{
    fault_plan *f = ctx;
    (void)len;
    pthread_mutex_lock(&f->mu);
    handoff_fault act = HANDOFF_FAULT_NONE;
    if (type == HX_TILE && index == 0 && !f->t_full0) f->t_full0 = muser_now_s();
    if (type == HX_TILE && index == f->first_ring && !f->t_ring0) f->t_ring0 = muser_now_s();
    if (type == HX_MANIFEST && f->edit_model) payload[36] ^= 1; /* model id, resealed after */
    if (!f->fired && f->act != HANDOFF_FAULT_NONE && type == f->type && index == f->index) {
        act = f->act;
        f->fired = true;
    }
    pthread_mutex_unlock(&f->mu);
    return act;
}

static void plan(uint32_t type, uint32_t index, handoff_fault act)
{
    pthread_mutex_lock(&g_plan.mu);
    g_plan.type = type;
    g_plan.index = index;
    g_plan.act = act;
    g_plan.edit_model = false;
    g_plan.fired = false;
    g_plan.t_full0 = g_plan.t_ring0 = 0;
    pthread_mutex_unlock(&g_plan.mu);
}

typedef struct rig_opts {
    muser_backend_kind backend;
    uint32_t tile_rows, timeout_ms;
    const uint8_t *fixed_sid;
    const char *producer_dir, *producer_key; /* relative to g_dir; defaults ok/producer, ok/hmac.key */
    const char *consumer_dir, *consumer_key;
    const uint8_t *consumer_model;           /* default: the model's id */
} rig_opts;

typedef struct rig {
    const muser_model *m;
    uint8_t id[HX_MODEL_ID_BYTES];
    muser_engine *pe, *ce;
    handoff_producer *p;
    handoff_client *c;
    char ledger[300];
    rig_opts o;
} rig;

static muser_engine *engine_for(const muser_model *m, muser_backend_kind b)
{
    muser_engine_opts eo;
    memset(&eo, 0, sizeof eo);
    eo.dev.backend = b;
    eo.dev.n_threads = 1;
    eo.dev.n_ctx = CTX;
    muser_engine *e = NULL;
    muser_error err = {0};
    CHECK_OK(muser_engine_new(&e, m, &eo, &err), &err);
    return e;
}

static int client_for(rig *r, handoff_client **out, muser_error *err)
{
    char dir[300], key[300];
    path_of(dir, sizeof dir, r->o.consumer_dir ? r->o.consumer_dir : "ok/consumer");
    path_of(key, sizeof key, r->o.consumer_key ? r->o.consumer_key : "ok/hmac.key");
    const handoff_client_opts co = {.host = "127.0.0.1", .port = handoff_producer_port(r->p), .tls_dir = dir,
                                    .key_file = key, .ledger = r->ledger,
                                    .model_id = r->o.consumer_model ? r->o.consumer_model : r->id,
                                    .timeout_ms = r->o.timeout_ms ? r->o.timeout_ms : 20000};
    return handoff_client_new(out, &co, err);
}

static bool rig_start(rig *r, const muser_model *m, const rig_opts *o)
{
    memset(r, 0, sizeof *r);
    r->m = m;
    if (o) r->o = *o;
    muser_error err = {0};
    CHECK_OK(handoff_model_id(m, NULL, r->id, &err), &err);
    r->pe = engine_for(m, r->o.backend);
    r->ce = engine_for(m, r->o.backend);
    char dir[300], key[300];
    path_of(dir, sizeof dir, r->o.producer_dir ? r->o.producer_dir : "ok/producer");
    path_of(key, sizeof key, r->o.producer_key ? r->o.producer_key : "ok/hmac.key");
    snprintf(r->ledger, sizeof r->ledger, "%s/ledger-%d", g_dir, g_ledgers++);
    const handoff_producer_opts po = {.tls_dir = dir, .key_file = key, .model_id = r->id, .timeout_ms = 5000,
                                      .tile_rows = r->o.tile_rows, .fault = on_frame, .fault_ctx = &g_plan,
                                      .fixed_session_id = r->o.fixed_sid};
    if (!r->pe || !r->ce) return false;
    CHECK_OK(handoff_producer_start(&r->p, r->pe, &po, &err), &err);
    if (!r->p) return false;
    CHECK_OK(client_for(r, &r->c, &err), &err);
    return r->c != NULL;
}

static void rig_stop(rig *r)
{
    handoff_client_free(r->c);
    handoff_producer_stop(r->p);
    muser_engine_free(r->pe);
    muser_engine_free(r->ce);
}

/* ---- 1. exact ---- */

/* A local prefill on the consumer's engine: its digest, logits row and three decoded rows. */
typedef struct outcome {
    char sha[65];
    float *row, *dec; /* [V], [3][V] */
    uint64_t pos;
} outcome;

static void decode3(muser_seq *q, uint32_t n, uint32_t V, float *dec)
{
    muser_error err = {0};
    for (uint32_t i = 0; i < 3; i++) CHECK_OK(muser_seq_decode(q, tok_of(n + i + 1000, V), dec + (size_t)i * V, NULL, &err), &err);
}

static void local(rig *r, const int32_t *t, uint32_t n, outcome *o)
{
    const uint32_t V = r->m->hp.n_vocab;
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(r->ce, CTX, &q, &err), &err);
    CHECK_OK(muser_seq_prefill(q, t, n, o->row, &err), &err);
    CHECK_OK(muser_seq_kv_sha256(q, o->sha, &err), &err);
    o->pos = muser_seq_pos(q);
    decode3(q, n, V, o->dec);
    muser_engine_close(q);
}

static void exact(rig *r, uint32_t n, uint32_t cut, const char *label)
{
    const uint32_t V = r->m->hp.n_vocab;
    int32_t *t = malloc(n * sizeof *t);
    make_tokens(t, n, V);
    outcome a = {.row = malloc(V * sizeof(float)), .dec = malloc(3 * V * sizeof(float))};
    outcome b = {.row = malloc(V * sizeof(float)), .dec = malloc(3 * V * sizeof(float))};
    local(r, t, n, &a);
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(r->ce, CTX, &q, &err), &err);
    if (cut) CHECK_OK(muser_seq_prefill(q, t, cut, NULL, &err), &err); /* the warm prefix, here */
    handoff_stats st;
    plan(0, 0, HANDOFF_FAULT_NONE);
    const int rc = handoff_fetch(r->c, q, t, n, b.row, &st, &err);
    CHECKF(rc == 0, "%s: %s", label, err.msg);
    if (!rc) {
        CHECK_OK(muser_seq_kv_sha256(q, b.sha, &err), &err);
        b.pos = muser_seq_pos(q);
        decode3(q, n, V, b.dec);
        CHECKF(b.pos == n && !strcmp(a.sha, b.sha), "%s: the installed cache (%.16s, at %llu) is not the local one (%.16s)",
               label, b.sha, (unsigned long long)b.pos, a.sha);
        CHECKF(!memcmp(a.row, b.row, V * sizeof(float)), "%s: the logits row differs", label);
        CHECKF(!memcmp(a.dec, b.dec, 3 * V * sizeof(float)), "%s: rows decoded from the installed cache differ", label);
        CHECKF(st.cut == cut && st.n == n, "%s: stats say %llu..%llu", label, (unsigned long long)st.cut, (unsigned long long)st.n);
        printf("  %-34s %3u tokens from %3u: %2u tiles of <= %3u rows, %7.1f KB in, cache %.12s == local\n", label, n, cut,
               st.tiles, st.tile_rows, st.bytes_in / 1e3, b.sha);
    }
    muser_engine_close(q);
    free(t);
    free(a.row);
    free(a.dec);
    free(b.row);
    free(b.dec);
}

static void exact_on(const muser_model *m, const char *name, const uint32_t (*cases)[2], size_t n_cases,
                     muser_backend_kind backend)
{
    const uint32_t rows[] = {64, 512};
    for (size_t k = 0; k < (g_san ? 1 : 2); k++) {
        rig r;
        const rig_opts o = {.backend = backend, .tile_rows = rows[k]};
        if (rig_start(&r, m, &o))
            for (size_t i = 0; i < n_cases; i++) {
                char label[96];
                snprintf(label, sizeof label, "%s/%s/tiles %u", name, muser_backend_name(backend), rows[k]);
                exact(&r, cases[i][0], cases[i][1], label);
            }
        rig_stop(&r);
        if (backend == MUSER_BACKEND_ORACLE) break; /* one tile size is enough for the slow judge */
    }
}

/* FULL tiles leave while the producer still prefills; ring tiles only after its last chunk. */
static void streaming(const muser_model *m)
{
    rig r;
    const rig_opts o = {.tile_rows = 64};
    if (!rig_start(&r, m, &o)) return rig_stop(&r);
    const uint32_t n = 400, V = m->hp.n_vocab;
    int32_t t[400];
    make_tokens(t, n, V);
    hx_layer ly[64];
    handoff_layers(&m->hp, ly);
    uint32_t n_full = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) n_full += !ly[l].ring;
    plan(0, 0, HANDOFF_FAULT_NONE);
    g_plan.first_ring = n_full * ((n + 63) / 64); /* the FULL tiles come first (hx_tiling) */
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(r.ce, CTX, &q, &err), &err);
    CHECK_OK(handoff_fetch(r.c, q, t, n, NULL, NULL, &err), &err);
    muser_pass_rec pass[64];
    const uint32_t np = muser_engine_passes(r.pe, pass, 64);
    double last_start = 0, last_end = 0;
    uint32_t chunks = 0;
    for (uint32_t i = 0; i < np; i++)
        if (pass[i].kind == MUSER_PASS_PREFILL) {
            chunks++;
            last_start = pass[i].t_start;
            last_end = pass[i].t_end;
        }
    CHECKF(chunks >= 7, "the producer prefilled in %u passes (tiles of 64 rows over 400 tokens: 7)", chunks);
    CHECKF(g_plan.t_full0 > 0 && g_plan.t_full0 < last_start,
           "FULL tile 0 left %.3f s after the last chunk started: not streamed during the prefill",
           g_plan.t_full0 - last_start);
    CHECKF(g_plan.t_ring0 >= last_end, "a ring tile left before the prefill ended");
    printf("  streaming: FULL tile 0 sent %.1f ms before the last of %u chunks began; ring tiles after it\n",
           (last_start - g_plan.t_full0) * 1e3, chunks);
    muser_engine_close(q);
    rig_stop(&r);
}

/* ---- 2. refused ---- */

/* The bystander: decodes on the consumer's engine while a fetch fails, round after round; every
 * round must give the reference bytes. */
typedef struct bystander {
    muser_engine *e;
    uint32_t V;
    char ref[65];
    atomic_bool stop;
    uint32_t rounds, wrong;
    pthread_t th;
} bystander;

static void bystander_round(bystander *b, char sha[65])
{
    float *logits = malloc((size_t)7 * b->V * sizeof(float));
    int32_t t[24];
    for (uint32_t i = 0; i < 24; i++) t[i] = tok_of(i + 77, b->V);
    muser_error err = {0};
    muser_seq *q = NULL;
    int rc = muser_engine_open(b->e, CTX, &q, &err);
    if (!rc) rc = muser_seq_prefill(q, t, 17, logits, &err);
    for (uint32_t i = 0; !rc && i < 6; i++) rc = muser_seq_decode(q, t[17 + i], logits + (size_t)(i + 1) * b->V, NULL, &err);
    muser_engine_close(q);
    muser_sha256_hex(logits, (size_t)7 * b->V * sizeof(float), sha);
    if (rc) snprintf(sha, 65, "failed");
    free(logits);
}

static void *bystander_main(void *arg)
{
    bystander *b = arg;
    do {
        char sha[65];
        bystander_round(b, sha);
        b->rounds++;
        b->wrong += strcmp(sha, b->ref) != 0;
    } while (!atomic_load(&b->stop));
    return NULL;
}

/* The producer's ended connections (served, refused or broken: each counts when its thread ends) */
static uint64_t producer_ended(rig *r)
{
    handoff_producer_stats st;
    handoff_producer_stats_get(r->p, &st);
    return st.sessions + st.refused + st.failed;
}

/* A fetch that must fail with `want` in its message and change nothing. Returns once the
 * producer's side of it has ended too, so its frames cannot meet the next case's fault plan. */
static void refused(rig *r, handoff_client *c, uint32_t n, uint32_t cut, const char *want, const char *label)
{
    const uint64_t ended0 = producer_ended(r);
    const uint32_t V = r->m->hp.n_vocab;
    int32_t *t = malloc(n * sizeof *t);
    make_tokens(t, n, V);
    bystander b = {.e = r->ce, .V = V};
    bystander_round(&b, b.ref);
    muser_engine_stats es0, es1;
    muser_error err = {0};
    muser_seq *q = NULL;
    CHECK_OK(muser_engine_open(r->ce, CTX, &q, &err), &err);
    if (cut) CHECK_OK(muser_seq_prefill(q, t, cut, NULL, &err), &err);
    char before[65], after[65];
    CHECK_OK(muser_seq_kv_sha256(q, before, &err), &err);
    muser_engine_stats_get(r->ce, &es0);
    float *logits = malloc(V * sizeof(float));
    for (uint32_t i = 0; i < V; i++) logits[i] = -7.0f;
    atomic_init(&b.stop, false);
    pthread_create(&b.th, NULL, bystander_main, &b);
    const int rc = handoff_fetch(c ? c : r->c, q, t, n, logits, NULL, &err);
    atomic_store(&b.stop, true);
    pthread_join(b.th, NULL);
    CHECKF(rc != 0, "%s: the fetch succeeded", label);
    CHECKF(rc == 0 || strstr(err.msg, want), "%s: the error does not say '%s': %s", label, want, err.msg);
    CHECKF(strchr(err.msg, '\n') == NULL, "%s: the error is not one line", label);
    CHECK_OK(muser_seq_kv_sha256(q, after, &err), &err);
    CHECKF(muser_seq_pos(q) == cut && !strcmp(before, after), "%s: the target changed (position %llu)", label,
           (unsigned long long)muser_seq_pos(q));
    bool untouched = true;
    for (uint32_t i = 0; i < V; i++) untouched &= logits[i] == -7.0f;
    CHECKF(untouched, "%s: the caller's logits were written", label);
    muser_engine_stats_get(r->ce, &es1);
    CHECKF(es1.open_seqs == es0.open_seqs, "%s: %u sequences open after, %u before", label, es1.open_seqs, es0.open_seqs);
    for (int i = 0; i < 400 && producer_ended(r) == ended0; i++) usleep(50 * 1000);
    CHECKF(producer_ended(r) > ended0, "%s: the producer's session did not end within 20 s", label);
    CHECKF(b.wrong == 0 && b.rounds >= 1, "%s: the bystander's bytes changed in %u of %u rounds", label, b.wrong, b.rounds);
    printf("  refused %-26s (bystander: %u rounds unchanged): %s\n", label, b.rounds, rc ? err.msg : "(accepted!)");
    muser_engine_close(q);
    free(logits);
    free(t);
}

static void faults(const muser_model *m)
{
    rig r;
    const rig_opts o = {.tile_rows = 64};
    if (!rig_start(&r, m, &o)) return rig_stop(&r);
    const struct {
        uint32_t type, index;
        handoff_fault act;
        uint32_t cut;
        const char *want, *label;
    } cases[] = { /* 200 tokens of tiny in tiles of 64 rows: 8 FULL tiles, then 6 ring tiles */
        {HX_TILE, 1, HANDOFF_FAULT_FLIP, 0, "tile 1 (layer 7, positions 0..64): the MAC does not verify", "flipped tile bit"},
        {HX_MANIFEST, 0, HANDOFF_FAULT_FLIP, 0, "the manifest's MAC does not verify", "flipped manifest bit"},
        {HX_TILE, 2, HANDOFF_FAULT_DROP, 0, "1 of 14 tiles missing, the first tile 2", "missing tile"},
        {HX_TILE, 5, HANDOFF_FAULT_DUP, 120, "arrived twice", "repeated tile (delta)"},
        {HX_LOGITS, 14, HANDOFF_FAULT_DROP, 0, "without the logits row", "missing logits"},
        {HX_TILE, 3, HANDOFF_FAULT_OVERSIZE, 0, "a frame of 67108865 bytes; the manifest says", "oversized frame"},
        {HX_TILE, 3, HANDOFF_FAULT_CLOSE, 0, "after 3 of 14 tiles", "truncated stream"},
        {HX_MANIFEST, 0, HANDOFF_FAULT_CLOSE, 0, "while we were reading the manifest", "closed before the manifest"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan(cases[i].type, cases[i].index, cases[i].act);
        refused(&r, NULL, 200, cases[i].cut, cases[i].want, cases[i].label);
    }
    /* a client that waits 400 ms at most (the others wait 20 s: a loaded machine is no stall) */
    handoff_client *quick = NULL;
    muser_error err = {0};
    r.o.timeout_ms = 400;
    CHECK_OK(client_for(&r, &quick, &err), &err);
    plan(HX_TILE, 2, HANDOFF_FAULT_STALL);
    if (quick) refused(&r, quick, 200, 0, "for 400 ms while reading", "stalled producer");
    handoff_client_free(quick);
    plan(0, 0, HANDOFF_FAULT_NONE);
    pthread_mutex_lock(&g_plan.mu);
    g_plan.edit_model = true;
    pthread_mutex_unlock(&g_plan.mu);
    refused(&r, NULL, 200, 0, "wrong model: the producer's is", "manifest of another model");
    plan(0, 0, HANDOFF_FAULT_NONE);
    /* the producer survived all of it */
    exact(&r, 200, 0, "tiny after the faults");
    rig_stop(&r);
}

static void wrong_identity(const muser_model *m, const muser_model *other)
{
    uint8_t other_id[HX_MODEL_ID_BYTES];
    muser_error err = {0};
    CHECK_OK(handoff_model_id(other, NULL, other_id, &err), &err);
    const struct {
        rig_opts o;
        const char *want, *label;
    } cases[] = {
        {{.tile_rows = 64, .consumer_model = other_id}, "refused: wrong model: the consumer has", "wrong model"},
        {{.tile_rows = 64, .consumer_key = "other/hmac.key"}, "the request's MAC does not verify", "wrong HMAC key"},
        /* a consumer certificate of another CA (trusting the right one): the producer refuses it */
        {{.tile_rows = 64, .consumer_dir = "mixed"}, "unknown ca", "consumer cert of another CA"},
        /* a producer certificate of another CA: the consumer refuses it */
        {{.tile_rows = 64, .producer_dir = "other/producer"}, "certificate verify failed", "producer cert of another CA"},
    };
    plan(0, 0, HANDOFF_FAULT_NONE);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rig r;
        if (rig_start(&r, m, &cases[i].o)) refused(&r, NULL, 40, 0, cases[i].want, cases[i].label);
        rig_stop(&r);
    }
}

static void replay(const muser_model *m)
{
    const uint8_t sid[HX_ID_BYTES] = {0x5e, 0x55, 0x10, 0x4e, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    rig r;
    const rig_opts o = {.tile_rows = 64, .fixed_sid = sid};
    plan(0, 0, HANDOFF_FAULT_NONE);
    if (!rig_start(&r, m, &o)) return rig_stop(&r);
    exact(&r, 40, 0, "a session's first delivery");
    refused(&r, NULL, 40, 0, "was seen before", "replayed session");
    /* a restarted consumer: a new client reading the same ledger file */
    handoff_client *c2 = NULL;
    muser_error err = {0};
    CHECK_OK(client_for(&r, &c2, &err), &err);
    if (c2) refused(&r, c2, 40, 0, "was seen before", "replay after a restart");
    handoff_client_free(c2);
    rig_stop(&r);
}

/* ---- 3. bad clients ---- */

static int tcp_connect(uint16_t port)
{
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    const struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A TLS client trusting the right CA but presenting no certificate: the producer ends it. */
static bool certless_client_refused(uint16_t port)
{
    char ca[300];
    path_of(ca, sizeof ca, "ok/ca.pem");
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_load_verify_locations(ctx, ca, NULL);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    const int fd = tcp_connect(port);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    bool refused = true;
    if (SSL_connect(ssl) == 1) { /* TLS 1.3: the client finishes first; the refusal comes as an alert */
        const char junk[64] = {0};
        char buf[64];
        SSL_write(ssl, junk, sizeof junk);
        refused = SSL_read(ssl, buf, sizeof buf) <= 0;
    }
    ERR_clear_error();
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    return refused;
}

static void bad_clients(const muser_model *m)
{
    rig r;
    const rig_opts o = {.tile_rows = 64};
    plan(0, 0, HANDOFF_FAULT_NONE);
    if (!rig_start(&r, m, &o)) return rig_stop(&r);
    const uint16_t port = handoff_producer_port(r.p);
    CHECKF(certless_client_refused(port), "a client without a certificate was served");
    exact(&r, 40, 0, "after a client without a cert");
    const int fd = tcp_connect(port);
    const char garbage[] = "GET / HTTP/1.0\r\n\r\nnot TLS at all";
    CHECK(fd >= 0 && write(fd, garbage, sizeof garbage) == (ssize_t)sizeof garbage);
    char buf[256];
    while (fd >= 0 && read(fd, buf, sizeof buf) > 0) {}
    if (fd >= 0) close(fd);
    exact(&r, 40, 0, "after garbage instead of TLS");
    handoff_producer_stats st;
    for (int i = 0; i < 100; i++) { /* a session counts when its thread ends, just after the consumer's install */
        handoff_producer_stats_get(r.p, &st);
        if (st.refused >= 2 && st.sessions >= 2) break;
        usleep(50 * 1000);
    }
    CHECKF(st.refused >= 2 && st.sessions >= 2, "producer stats: %llu refused, %llu served", (unsigned long long)st.refused,
           (unsigned long long)st.sessions);
    rig_stop(&r);
}

/* The credentials: two CAs (ok, other) and a mixed directory (ok's CA, other's consumer cert). */
static bool make_certs(void)
{
    const char *src = getenv("MUSER_SOURCE_DIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "sh %s/scripts/make-test-certs.sh %s/ok >/dev/null && sh %s/scripts/make-test-certs.sh %s/other >/dev/null && "
             "mkdir -p %s/mixed && cp %s/ok/ca.pem %s/mixed/ && cp %s/other/consumer/cert.pem %s/other/consumer/key.pem %s/mixed/",
             src ? src : "..", g_dir, src ? src : "..", g_dir, g_dir, g_dir, g_dir, g_dir, g_dir, g_dir);
    return system(cmd) == 0;
}

int main(void)
{
    g_san = getenv("MUSER_SANITIZED") && !strcmp(getenv("MUSER_SANITIZED"), "1");
    snprintf(g_dir, sizeof g_dir, "%s", "/tmp/muser-handoff-XXXXXX");
    if (!mkdtemp(g_dir)) SKIP("cannot make a temporary directory");
    if (!make_certs()) SKIP("scripts/make-test-certs.sh failed (openssl CLI missing?)");
    char path[300], trained_path[600];
    path_of(path, sizeof path, "tiny.gguf");
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.n_threads = 2;
    muser_error err = {0};
    muser_model *tiny = NULL, *trained = NULL;
    CHECK_OK(muser_synth_write(&so, path, NULL, &err), &err);
    CHECK_OK(muser_model_load(&tiny, path, &err), &err);
    const char *src = getenv("MUSER_SOURCE_DIR");
    snprintf(trained_path, sizeof trained_path, "%s/models/default.gguf", src ? src : "..");
    CHECK_OK(muser_model_load(&trained, trained_path, &err), &err);
    if (!tiny || !trained) return check_report("handoff");

    printf("1. exact (installed cache == local prefill, SHA-256):\n");
    /* {n, cut}: shorter and longer than the window, cold and warm (the warm prefix's end before
     * and inside the window the ring keeps) */
    const uint32_t tiny_cases[][2] = {{11, 0}, {200, 0}, {200, 190}, {200, 150}, {11, 5}};
    const uint32_t trained_cases[][2] = {{40, 0}, {300, 260}, {300, 0}, {300, 100}};
    const uint32_t oracle_cases[][2] = {{40, 30}, {40, 0}};
    exact_on(tiny, "tiny", tiny_cases, g_san ? 3 : 5, MUSER_BACKEND_CPU);
    exact_on(trained, "trained", trained_cases, g_san ? 2 : 4, MUSER_BACKEND_CPU);
    exact_on(tiny, "tiny", oracle_cases, g_san ? 1 : 2, MUSER_BACKEND_ORACLE);
    /* the GPU: its install hooks (kv_import / kv_seal) and its prefill and decode routes, the
     * producer and the consumer on one GPU, each its own engine */
    if (gpu_present(tiny)) {
        exact_on(tiny, "tiny", tiny_cases, 5, MUSER_BACKEND_CUDA);
        exact_on(trained, "trained", trained_cases, 4, MUSER_BACKEND_CUDA);
    } else {
        printf("SKIP: the CUDA exact cases (no GPU, or built without CUDA)\n");
    }
    streaming(g_san ? tiny : trained);
    printf("2. refused, nothing installed:\n");
    faults(tiny);
    wrong_identity(tiny, trained);
    replay(tiny);
    printf("3. bad clients:\n");
    bad_clients(tiny);

    muser_model_free(tiny);
    muser_model_free(trained);
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf %s", g_dir);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return check_report("handoff");
}
