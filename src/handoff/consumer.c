/* consumer.c — the remote-prefill consumer of handoff.h: request, sealed manifest, scatter on
 * arrival into a detached generation, validate_complete, the atomic swap.
 *
 * The detached generation is a sequence of its own on the target's engine (it reserves its KV
 * like any other), opened empty or as a copy of the target's warm prefix; tiles go straight into
 * it as they verify (muser_seq_kv_import places each row where a local prefill would have,
 * ring rows at origin_physical = origin mod capacity). Only when every tile and the logits row
 * have arrived and verified does muser_seq_install swap it in; every failure path closes it
 * instead, so the target never holds a half-planted cache. */
#include "handoff/handoff.h"
#include "handoff/ledger.h"
#include "handoff/tls.h"

#include "util.h"

#include <math.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

struct handoff_client {
    hx_auth auth;
    handoff_ledger *ledger;
    char host[256];
    uint16_t port;
    uint8_t model_id[HX_MODEL_ID_BYTES];
    uint32_t timeout_ms;
    volatile sig_atomic_t *interrupt;
};

int handoff_client_new(handoff_client **out, const handoff_client_opts *o, muser_error *err)
{
    *out = NULL;
    if (!o || !o->host || !o->model_id) return muser_errorf(err, MUSER_E_ARG, "handoff_client_new: NULL argument");
    handoff_client *c = calloc(1, sizeof *c);
    if (!c) return muser_errorf(err, MUSER_E_NOMEM, "handoff client: out of memory");
    snprintf(c->host, sizeof c->host, "%s", o->host);
    c->port = o->port;
    memcpy(c->model_id, o->model_id, HX_MODEL_ID_BYTES);
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : HANDOFF_DEFAULT_TIMEOUT_MS;
    c->interrupt = o->interrupt;
    char path[4096];
    int rc = o->ledger ? (snprintf(path, sizeof path, "%s", o->ledger), MUSER_OK)
                       : handoff_ledger_default_path(path, sizeof path, err);
    if (!rc) rc = hx_auth_load(&c->auth, o->tls_dir, o->key_file, false, err);
    if (!rc) rc = handoff_ledger_open(&c->ledger, path, err);
    if (rc) {
        handoff_client_free(c);
        return rc;
    }
    *out = c;
    return MUSER_OK;
}

void handoff_client_free(handoff_client *c)
{
    if (!c) return;
    hx_auth_free(&c->auth);
    handoff_ledger_close(c->ledger);
    free(c);
}

/* One fetch's state. */
typedef struct fetch {
    handoff_client *cl;
    hx_conn c;
    hx_manifest want, got;
    uint8_t nonce[HX_ID_BYTES];
    uint8_t *buf;                 /* the largest frame the manifest allows: payload + MAC */
    bool *seen;                   /* [n_tiles + 1]: tiles, then the logits row */
    float *logits;                /* [V] staged until the install */
    hx_stream st;                 /* what may come next, what came */
    double t0, t_first;
} fetch;

static int send_request(fetch *f, const int32_t *tokens, uint32_t n, uint64_t cut, muser_error *err)
{
    const uint64_t len = hx_request_size(n);
    uint8_t *frame = malloc(hx_frame_bytes(HX_REQUEST, (uint32_t)len));
    if (!frame) return muser_errorf(err, MUSER_E_NOMEM, "out of memory for a request of %u tokens", n);
    hx_request r = {.version = HX_VERSION, .cut = cut, .n_tokens = n, .tokens = (int32_t *)tokens};
    memcpy(r.nonce, f->nonce, HX_ID_BYTES);
    memcpy(r.model_id, f->cl->model_id, HX_MODEL_ID_BYTES);
    hx_request_encode(&r, frame + HX_HEADER_BYTES);
    const int rc = hx_frame_send(&f->c, &f->cl->auth, f->nonce, HX_REQUEST, 0, frame, (uint32_t)len, err);
    free(frame);
    return rc;
}

/* A frame's header; a refusal is turned into the error it carries. */
static int read_header(fetch *f, hx_header *h, const char *what, muser_error *err)
{
    uint8_t hdr[HX_HEADER_BYTES];
    int rc = hx_read(&f->c, hdr, sizeof hdr, what, err);
    if (!rc) rc = hx_header_decode(hdr, h, err);
    if (!rc && h->type == HX_REFUSE) {
        char why[HX_REFUSE_MAX + 1];
        rc = hx_read_refusal(&f->c, h->length, why, sizeof why, err);
        if (!rc) rc = muser_errorf(err, MUSER_E_ARG, "%s refused: %s", f->c.peer, why);
    }
    return rc;
}

/* The payload and MAC of a frame whose header (h, re-encoded: it is in the MAC) was read. */
static int read_sealed(fetch *f, const hx_header *h, const uint8_t sid[HX_ID_BYTES], uint8_t *buf, const char *what,
                       muser_error *err)
{
    int rc = hx_read(&f->c, buf, (size_t)h->length + HX_MAC_BYTES, what, err);
    uint8_t hdr[HX_HEADER_BYTES];
    hx_header_encode(h, hdr);
    if (!rc && !hx_mac_ok(f->cl->auth.key, f->cl->auth.key_len, sid, hdr, buf, h->length, buf + h->length))
        rc = muser_errorf(err, MUSER_E_ARG,
                          "%s: the MAC does not verify (altered in transit, or the producer holds another HMAC key)", what);
    return rc;
}

static int read_manifest(fetch *f, muser_error *err)
{
    hx_header h;
    int rc = read_header(f, &h, "the manifest", err);
    if (rc) return rc;
    const uint64_t bound = hx_manifest_bound(f->want.n_tokens, f->want.n_layer);
    if (h.type != HX_MANIFEST || h.index != 0)
        return muser_errorf(err, MUSER_E_FORMAT, "a %s frame where the manifest belongs", hx_type_name(h.type));
    if (h.length > bound || h.length < HX_MANIFEST_FIXED)
        return muser_errorf(err, MUSER_E_FORMAT, "a manifest of %u bytes, beyond the %llu a request of %u tokens allows",
                            h.length, (unsigned long long)bound, f->want.n_tokens);
    uint8_t *buf = malloc((size_t)h.length + HX_MAC_BYTES);
    if (!buf) return muser_errorf(err, MUSER_E_NOMEM, "out of memory for a manifest of %u bytes", h.length);
    rc = hx_read(&f->c, buf, (size_t)h.length + HX_MAC_BYTES, "the manifest", err);
    /* the session id (bytes 4..20) keys the manifest's MAC; nothing of it is believed before it verifies */
    if (!rc) {
        uint8_t hdr[HX_HEADER_BYTES];
        hx_header_encode(&h, hdr);
        if (!hx_mac_ok(f->cl->auth.key, f->cl->auth.key_len, buf + 4, hdr, buf, h.length, buf + h.length))
            rc = muser_errorf(err, MUSER_E_ARG,
                              "the manifest's MAC does not verify (altered in transit, or the producer holds another HMAC key)");
    }
    if (!rc) rc = hx_manifest_decode(buf, h.length, &f->got, err);
    free(buf);
    if (!rc) rc = hx_manifest_check(&f->got, &f->want, err);
    /* recorded before any tile is read: a session is installed at most once, and one that failed
     * halfway is not retried under the same id either */
    if (!rc) rc = handoff_ledger_claim(f->cl->ledger, f->got.session_id, err);
    return rc;
}

/* Frames until the end frame, each admitted by the stream (wire.h) before its payload is read, and
 * each verified tile scattered into gen at once. */
static int receive(fetch *f, muser_seq *gen, muser_error *err)
{
    const hx_manifest *m = &f->got;
    char what[160];
    while (!f->st.ended) {
        snprintf(what, sizeof what, "the stream after %u of %u tiles", f->st.n_seen - f->st.seen[m->n_tiles], m->n_tiles);
        hx_header h;
        int rc = read_header(f, &h, what, err);
        if (!rc) rc = hx_stream_admit(&f->st, &h, what, sizeof what, err);
        if (!rc) rc = read_sealed(f, &h, m->session_id, f->buf, what, err);
        if (rc) return rc;
        if (h.type == HX_TILE) {
            const hx_tile *tl = &m->tiles[h.index];
            const uint16_t *k = (const uint16_t *)f->buf, *v = k + h.length / 2 / sizeof(uint16_t);
            if ((rc = muser_seq_kv_import(gen, tl->layer, m->n_tokens, tl->pos0, tl->n_rows, k, v, err))) return rc;
            if (!f->t_first) f->t_first = muser_now_s() - f->t0;
        } else if (h.type == HX_LOGITS) {
            memcpy(f->logits, f->buf, h.length);
            for (uint32_t i = 0; i < m->n_vocab; i++)
                if (!isfinite(f->logits[i]))
                    return muser_errorf(err, MUSER_E_NUMERIC, "the logits row holds a non-finite value at %u", i);
        }
        hx_stream_take(&f->st, &h);
    }
    return MUSER_OK;
}

/* What we expect the manifest to say (the tile list is hx_tiling's, checked against got's). */
static int expect(fetch *f, const muser_model *mo, const int32_t *tokens, uint32_t n, uint64_t cut, muser_error *err)
{
    const muser_hparams *hp = &mo->hp;
    hx_manifest *w = &f->want;
    w->version = HX_VERSION;
    memcpy(w->nonce, f->nonce, HX_ID_BYTES);
    memcpy(w->model_id, f->cl->model_id, HX_MODEL_ID_BYTES);
    w->cut = cut;
    w->n_tokens = n;
    w->tokens = (int32_t *)tokens;
    w->n_layer = hp->n_layer;
    w->n_vocab = hp->n_vocab;
    w->layers = calloc(hp->n_layer, sizeof *w->layers);
    if (!w->layers) return muser_errorf(err, MUSER_E_NOMEM, "out of memory");
    handoff_layers(hp, w->layers);
    return MUSER_OK;
}

/* The buffers the verified manifest sizes: the largest frame, the arrival map, the logits. */
static int size_buffers(fetch *f, muser_error *err)
{
    const hx_manifest *m = &f->got;
    const uint64_t most = hx_manifest_max_payload(m);
    f->buf = malloc(most + HX_MAC_BYTES);
    f->seen = calloc((size_t)m->n_tiles + 1, sizeof *f->seen);
    f->logits = malloc((size_t)m->n_vocab * sizeof(float));
    if (!f->buf || !f->seen || !f->logits)
        return muser_errorf(err, MUSER_E_NOMEM, "out of memory for frames of %llu bytes", (unsigned long long)most);
    hx_stream_init(&f->st, m, f->seen);
    return MUSER_OK;
}

int handoff_fetch(handoff_client *cl, muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, handoff_stats *st,
                  muser_error *err)
{
    if (!cl || !q || !tokens) return muser_errorf(err, MUSER_E_ARG, "handoff_fetch: NULL argument");
    const muser_model *mo = muser_seq_model(q);
    const uint64_t cut = muser_seq_pos(q), ctx = muser_seq_ctx(q);
    if (n == 0 || n > HX_MAX_TOKENS || cut >= n || n > ctx)
        return muser_errorf(err, MUSER_E_ARG,
                            "remote prefill of %u tokens into a sequence holding %llu with a context of %llu: %s", n,
                            (unsigned long long)cut, (unsigned long long)ctx,
                            cut >= n ? "nothing to fetch" : "they do not fit");
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= mo->hp.n_vocab)
            return muser_errorf(err, MUSER_E_ARG, "token %d at index %u is not in [0, %u)", tokens[i], i, mo->hp.n_vocab);
    fetch f;
    memset(&f, 0, sizeof f);
    f.cl = cl;
    f.c.fd = -1;
    f.t0 = muser_now_s();
    sigset_t old;
    hx_sigpipe_block(&old);
    muser_seq *gen = NULL;
    int rc = RAND_bytes(f.nonce, HX_ID_BYTES) == 1 ? MUSER_OK : muser_errorf(err, MUSER_E_BACKEND, "no randomness for a nonce");
    if (!rc) rc = expect(&f, mo, tokens, n, cut, err);
    if (!rc) rc = hx_connect(&f.c, &cl->auth, cl->host, cl->port, cl->timeout_ms, cl->interrupt, err);
    const double t_connect = muser_now_s() - f.t0;
    if (!rc) rc = send_request(&f, tokens, n, cut, err);
    if (!rc) rc = read_manifest(&f, err);
    if (!rc) rc = size_buffers(&f, err);
    /* the detached generation: nothing decodes it, nobody else knows it */
    if (!rc) rc = muser_engine_open(muser_seq_engine(q), ctx, &gen, err);
    if (!rc && cut) rc = muser_seq_copy_from(gen, q, err);
    if (!rc) rc = receive(&f, gen, err);
    if (!rc) rc = hx_stream_complete(&f.st, err); /* validate_complete */
    if (!rc) rc = muser_seq_install(q, gen, n, err);
    if (!rc && logits) memcpy(logits, f.logits, (size_t)mo->hp.n_vocab * sizeof(float));
    muser_engine_close(gen); /* after a swap it holds q's old cache; else the half-planted one */
    if (st && !rc) {
        memset(st, 0, sizeof *st);
        hx_hex(f.got.session_id, HX_ID_BYTES, st->session);
        st->tiles = f.got.n_tiles;
        st->tile_rows = f.got.tile_rows;
        st->cut = cut;
        st->n = n;
        st->bytes_in = f.c.bytes_in;
        st->bytes_out = f.c.bytes_out;
        st->connect_s = t_connect;
        st->first_tile_s = f.t_first;
        st->total_s = muser_now_s() - f.t0;
    }
    if (rc && err) { /* every failure names the producer once */
        char peer[300], msg[sizeof err->msg];
        snprintf(peer, sizeof peer, "%s:%u", cl->host, cl->port);
        if (strncmp(err->msg, peer, strlen(peer))) {
            snprintf(msg, sizeof msg, "%s", err->msg);
            muser_errorf(err, err->code, "%s: %s", peer, msg);
        }
    }
    hx_close(&f.c);
    hx_sigpipe_restore(&old);
    free(f.want.layers);
    hx_manifest_free(&f.got);
    free(f.buf);
    free(f.seen);
    free(f.logits);
    return rc;
}
