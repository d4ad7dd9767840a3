/* producer.c — the remote-prefill producer of handoff.h.
 *
 * Threads: one acceptor (poll on the listening socket and a stop pipe), and per connection a
 * session thread (TLS handshake, the request, the manifest, then the sender) plus a prefill
 * thread. The prefill thread walks the manifest's tile list in order: a FULL tile's chunk is
 * prefilled (one engine request of tile_rows rows) when the first layer's tile of it is due, its
 * rows are exported into a free frame slot and queued, so the sender streams chunk k while the
 * engine computes chunk k + 1; ring tiles come after the last chunk. The queue is a fixed ring of
 * frame slots allocated once per session (nothing is allocated per tile). A send that fails
 * cancels the prefill thread at its next chunk; stopping the producer shuts every socket down. */
#include "handoff/handoff.h"
#include "handoff/tls.h"

#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PREFIX_CHUNK 512u /* rows per engine request of a warm prefix (followed by a progress frame) */

typedef struct conn_slot {
    bool used, done;
    int fd;
    pthread_t th;
    char peer[64];
    struct handoff_producer *p;
} conn_slot;

struct handoff_producer {
    muser_engine *e;
    const muser_model *m;
    handoff_producer_opts o;
    uint8_t model_id[HX_MODEL_ID_BYTES], fixed_sid[HX_ID_BYTES];
    bool fixed;
    hx_auth auth;
    hx_layer *layers;            /* [n_layer] the model's planes as a manifest lists them */
    uint32_t max_tokens;
    int lfd, stop_pipe[2];
    uint16_t port;
    pthread_t acceptor;
    pthread_mutex_t mu;
    atomic_bool stopping;
    conn_slot *conns;            /* [max_conns] */
    handoff_producer_stats st;
};

static void plog(handoff_producer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void plog(handoff_producer *p, const char *fmt, ...)
{
    if (!p->o.log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(p->o.log, "handoff: %s\n", line); /* one write per line: threads do not interleave inside it */
    fflush(p->o.log);
}

/* ---- one session ---- */

typedef struct frame_slot {
    uint8_t *buf;                /* [header][payload][mac] */
    uint16_t type;
    uint32_t index, len;
} frame_slot;

typedef struct session {
    handoff_producer *p;
    hx_conn c;
    muser_seq *q;
    hx_request req;
    hx_manifest man;
    uint8_t sid[HX_ID_BYTES];
    /* the frame queue: slots [head, tail) are filled, in order */
    frame_slot *slots;
    uint32_t n_slots;
    uint64_t slot_payload;       /* payload bytes a slot holds */
    uint64_t head, tail;
    bool worker_done, prefill_failed;
    atomic_bool cancel;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float *logits;               /* [V] the last chunk's */
    uint64_t done;               /* positions prefilled */
    int worker_rc;
    muser_error worker_err;
    double t_start, t_prefill;
} session;

/* The prefill thread's next free slot (NULL when cancelled). */
static frame_slot *slot_acquire(session *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->tail - s->head >= s->n_slots && !atomic_load(&s->cancel)) pthread_cond_wait(&s->cv, &s->mu);
    frame_slot *f = atomic_load(&s->cancel) ? NULL : &s->slots[s->tail % s->n_slots];
    pthread_mutex_unlock(&s->mu);
    return f;
}

static void slot_push(session *s, frame_slot *f, uint16_t type, uint32_t index, uint32_t len)
{
    f->type = type;
    f->index = index;
    f->len = len;
    pthread_mutex_lock(&s->mu);
    s->tail++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void cancel_session(session *s)
{
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->cancel, true);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Prefill up to position `to` (one engine request; the logits when it reaches the end). */
static int prefill_to(session *s, uint64_t to, muser_error *err)
{
    if (to <= s->done) return MUSER_OK;
    if (atomic_load(&s->cancel)) return muser_errorf(err, MUSER_E_CANCELLED, "cancelled");
    const bool last = to == s->req.n_tokens;
    const int rc = muser_seq_prefill(s->q, s->req.tokens + s->done, (uint32_t)(to - s->done), last ? s->logits : NULL, err);
    if (!rc) s->done = to;
    if (!rc && last) s->t_prefill = muser_now_s() - s->t_start;
    return rc;
}

static void *prefill_main(void *arg)
{
    session *s = arg;
    const hx_manifest *m = &s->man;
    muser_error err = {0};
    int rc = MUSER_OK;
    uint32_t progress = 0;
    while (!rc && s->done < m->cut) { /* the consumer's warm prefix: computed, not sent */
        const uint64_t to = s->done + PREFIX_CHUNK < m->cut ? s->done + PREFIX_CHUNK : m->cut;
        rc = prefill_to(s, to, &err);
        frame_slot *f = rc ? NULL : slot_acquire(s);
        if (!rc && !f) rc = muser_errorf(&err, MUSER_E_CANCELLED, "cancelled");
        if (!rc) {
            hx_put_u64(f->buf + HX_HEADER_BYTES, s->done);
            slot_push(s, f, HX_PROGRESS, progress++, 8);
        }
    }
    for (uint32_t t = 0; t < m->n_tiles && !rc; t++) {
        const hx_tile *tl = &m->tiles[t];
        /* a FULL tile needs its own chunk done; a ring tile the whole prompt */
        rc = prefill_to(s, m->layers[tl->layer].ring ? m->n_tokens : tl->pos0 + tl->n_rows, &err);
        frame_slot *f = rc ? NULL : slot_acquire(s);
        if (!rc && !f) rc = muser_errorf(&err, MUSER_E_CANCELLED, "cancelled");
        if (rc) break;
        uint16_t *k = (uint16_t *)(f->buf + HX_HEADER_BYTES);
        const uint64_t half = hx_tile_bytes(&m->layers[tl->layer], tl->n_rows) / 2;
        rc = muser_seq_kv_rows(s->q, tl->layer, tl->pos0, tl->n_rows, k, k + half / sizeof(uint16_t), &err);
        if (!rc) slot_push(s, f, HX_TILE, t, (uint32_t)(2 * half));
    }
    rc = rc ? rc : prefill_to(s, m->n_tokens, &err); /* the last tile reached the end already: a guard for the logits row */
    for (int last = 0; last < 2 && !rc; last++) {
        frame_slot *f = slot_acquire(s);
        if (!f) {
            rc = muser_errorf(&err, MUSER_E_CANCELLED, "cancelled");
            break;
        }
        if (!last) {
            memcpy(f->buf + HX_HEADER_BYTES, s->logits, (size_t)m->n_vocab * sizeof(float));
            slot_push(s, f, HX_LOGITS, m->n_tiles, m->n_vocab * (uint32_t)sizeof(float));
        } else {
            slot_push(s, f, HX_END, m->n_tiles + 1, 0);
        }
    }
    pthread_mutex_lock(&s->mu);
    s->worker_rc = rc;
    s->worker_err = err;
    s->worker_done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Hold a stalled connection until the peer gives up (or the producer stops). */
static void stall(session *s)
{
    for (int i = 0; i < 600 && !atomic_load(&s->p->stopping); i++) {
        struct pollfd pf = {.fd = s->c.fd, .events = POLLIN};
        if (poll(&pf, 1, 100) > 0) {
            char b[256];
            if (recv(s->c.fd, b, sizeof b, MSG_DONTWAIT) <= 0) return; /* the peer left */
        }
    }
}

/* One frame out, through the fault hook. 1: the session ends here (a fault's close). */
static int send_frame(session *s, uint16_t type, uint32_t index, uint8_t *frame, uint32_t len, muser_error *err)
{
    handoff_producer *p = s->p;
    const handoff_fault f = p->o.fault ? p->o.fault(p->o.fault_ctx, type, index, frame + HX_HEADER_BYTES, len)
                                       : HANDOFF_FAULT_NONE;
    switch (f) {
    case HANDOFF_FAULT_DROP: return MUSER_OK;
    case HANDOFF_FAULT_CLOSE: return 1;
    case HANDOFF_FAULT_STALL: stall(s); return 1;
    case HANDOFF_FAULT_OVERSIZE: {
        const hx_header h = {.type = type, .index = index, .length = HX_MAX_FRAME + 1};
        uint8_t hdr[HX_HEADER_BYTES];
        hx_header_encode(&h, hdr);
        hx_write(&s->c, hdr, sizeof hdr, "an oversized header", err);
        return 1;
    }
    case HANDOFF_FAULT_FLIP:
        hx_frame_seal(&p->auth, s->sid, type, index, frame, len);
        if (len) frame[HX_HEADER_BYTES + len / 2] ^= 0x10;
        return hx_write(&s->c, frame, hx_frame_bytes(type, len), "a tampered frame", err);
    case HANDOFF_FAULT_DUP: {
        const int rc = hx_frame_send(&s->c, &p->auth, s->sid, type, index, frame, len, err);
        return rc ? rc : hx_frame_send(&s->c, &p->auth, s->sid, type, index, frame, len, err);
    }
    case HANDOFF_FAULT_NONE: break;
    }
    return hx_frame_send(&s->c, &p->auth, s->sid, type, index, frame, len, err);
}

/* Send what the prefill thread queues until the end frame, an error or a fault's close. */
static int send_queue(session *s, muser_error *err)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->head == s->tail && !s->worker_done) pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == s->tail) { /* the worker ended without an end frame: it failed */
            s->prefill_failed = true;
            pthread_mutex_unlock(&s->mu);
            *err = s->worker_err;
            return s->worker_rc ? s->worker_rc : muser_errorf(err, MUSER_E_BACKEND, "prefill ended early");
        }
        frame_slot *f = &s->slots[s->head % s->n_slots];
        pthread_mutex_unlock(&s->mu);
        const int rc = send_frame(s, f->type, f->index, f->buf, f->len, err);
        const bool end = f->type == HX_END;
        pthread_mutex_lock(&s->mu);
        s->head++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (rc || end) return rc;
    }
}

static void session_free(session *s)
{
    for (uint32_t i = 0; s->slots && i < s->n_slots; i++) free(s->slots[i].buf);
    free(s->slots);
    free(s->logits);
    hx_request_free(&s->req);
    free(s->man.tiles);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

/* The request: read, authenticated, decoded, checked against this producer. */
static int read_request(session *s, char *why, size_t cap)
{
    handoff_producer *p = s->p;
    muser_error err = {0};
    uint8_t hdr[HX_HEADER_BYTES];
    hx_header h;
    int rc = hx_read(&s->c, hdr, sizeof hdr, "the request", &err);
    if (!rc) rc = hx_header_decode(hdr, &h, &err);
    if (!rc && h.type != HX_REQUEST) rc = muser_errorf(&err, MUSER_E_FORMAT, "a %s frame where the request belongs", hx_type_name(h.type));
    if (!rc && (h.index || h.length > hx_request_size(p->max_tokens) || h.length < HX_REQUEST_FIXED))
        rc = muser_errorf(&err, MUSER_E_FORMAT, "request of %u bytes (this producer takes prompts up to %u tokens: %llu bytes)",
                          h.length, p->max_tokens, (unsigned long long)hx_request_size(p->max_tokens));
    uint8_t *buf = rc ? NULL : malloc((size_t)h.length + HX_MAC_BYTES);
    if (!rc && !buf) rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory for the request");
    if (!rc) rc = hx_read(&s->c, buf, (size_t)h.length + HX_MAC_BYTES, "the request", &err);
    /* the request's MAC is keyed on its nonce (bytes 4..20): checked before anything is believed */
    if (!rc && !hx_mac_ok(p->auth.key, p->auth.key_len, buf + 4, hdr, buf, h.length, buf + h.length))
        rc = muser_errorf(&err, MUSER_E_ARG, "the request's MAC does not verify (the consumer holds another HMAC key?)");
    if (!rc) rc = hx_request_decode(buf, h.length, p->max_tokens, p->m->hp.n_vocab, &s->req, &err);
    if (!rc && memcmp(s->req.model_id, p->model_id, HX_MODEL_ID_BYTES)) {
        char a[17], b[17];
        hx_hex(s->req.model_id, 8, a);
        hx_hex(p->model_id, 8, b);
        rc = muser_errorf(&err, MUSER_E_ARG, "wrong model: the consumer has %s..., this producer serves %s...", a, b);
    }
    free(buf);
    if (rc) snprintf(why, cap, "%s", err.msg);
    return rc;
}

/* The manifest of the request (tiles by hx_tiling) and the session's frame slots. */
static int plan(session *s, muser_error *err)
{
    handoff_producer *p = s->p;
    const muser_hparams *hp = &p->m->hp;
    hx_manifest *m = &s->man;
    m->version = HX_VERSION;
    memcpy(m->session_id, s->sid, HX_ID_BYTES);
    memcpy(m->nonce, s->req.nonce, HX_ID_BYTES);
    memcpy(m->model_id, p->model_id, HX_MODEL_ID_BYTES);
    m->cut = s->req.cut;
    m->n_tokens = s->req.n_tokens;
    m->tokens = s->req.tokens;
    m->tile_rows = p->o.tile_rows;
    m->n_layer = hp->n_layer;
    m->n_vocab = hp->n_vocab;
    m->layers = p->layers;
    m->n_tiles = hx_tiling(p->layers, hp->n_layer, m->cut, m->n_tokens, m->tile_rows, NULL);
    m->tiles = malloc(((size_t)m->n_tiles + 1) * sizeof *m->tiles);
    if (!m->tiles) return muser_errorf(err, MUSER_E_NOMEM, "out of memory for %u tiles", m->n_tiles);
    hx_tiling(p->layers, hp->n_layer, m->cut, m->n_tokens, m->tile_rows, m->tiles);
    uint32_t n_full = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++) n_full += !p->layers[l].ring;
    /* two chunks of FULL tiles in flight: the sender streams one while the engine computes the next */
    s->n_slots = 2 * n_full + 4;
    s->slot_payload = hx_manifest_max_payload(m);
    s->slots = calloc(s->n_slots, sizeof *s->slots);
    s->logits = malloc((size_t)hp->n_vocab * sizeof(float));
    bool ok = s->slots && s->logits;
    for (uint32_t i = 0; ok && i < s->n_slots; i++)
        ok = (s->slots[i].buf = malloc(hx_frame_bytes(HX_TILE, (uint32_t)s->slot_payload))) != NULL;
    return ok ? MUSER_OK : muser_errorf(err, MUSER_E_NOMEM, "out of memory for %u frames of %llu bytes", s->n_slots,
                                        (unsigned long long)s->slot_payload);
}

static void serve_session(session *s)
{
    handoff_producer *p = s->p;
    const double t0 = s->t_start = muser_now_s();
    char why[600] = "", sidhex[2 * HX_ID_BYTES + 1];
    if (read_request(s, why, sizeof why)) {
        hx_send_refusal(&s->c, why);
        plog(p, "refused %s (%s): %s", s->c.peer, s->c.peer_cn, why);
        pthread_mutex_lock(&p->mu);
        p->st.refused++;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (p->fixed) memcpy(s->sid, p->fixed_sid, HX_ID_BYTES);
    else if (RAND_bytes(s->sid, HX_ID_BYTES) != 1) memset(s->sid, 0, HX_ID_BYTES); /* all zero: consumers refuse it */
    hx_hex(s->sid, HX_ID_BYTES, sidhex);
    muser_error err = {0};
    int rc = muser_engine_open(p->e, s->req.n_tokens, &s->q, &err);
    if (!rc) rc = plan(s, &err);
    uint8_t *mbuf = NULL;
    const uint64_t mlen = hx_manifest_size(s->man.n_tokens, s->man.n_layer, s->man.n_tiles);
    if (!rc && !(mbuf = malloc(hx_frame_bytes(HX_MANIFEST, (uint32_t)mlen))))
        rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory for the manifest");
    if (rc) {
        snprintf(why, sizeof why, "cannot serve %u tokens: %s", s->req.n_tokens, err.msg);
        hx_send_refusal(&s->c, why);
        plog(p, "refused %s (%s): %s", s->c.peer, s->c.peer_cn, why);
        pthread_mutex_lock(&p->mu);
        p->st.refused++;
        pthread_mutex_unlock(&p->mu);
        muser_engine_close(s->q);
        return;
    }
    hx_manifest_encode(&s->man, mbuf + HX_HEADER_BYTES);
    rc = send_frame(s, HX_MANIFEST, 0, mbuf, (uint32_t)mlen, &err);
    free(mbuf);
    pthread_t worker;
    bool started = false;
    if (!rc) {
        started = pthread_create(&worker, NULL, prefill_main, s) == 0;
        rc = started ? send_queue(s, &err) : muser_errorf(&err, MUSER_E_BACKEND, "cannot start the prefill thread");
    }
    if (rc) {
        if (s->prefill_failed) { /* tell the consumer why */
            snprintf(why, sizeof why, "prefill failed: %s", err.msg);
            hx_send_refusal(&s->c, why);
        }
        cancel_session(s);
    }
    if (started) pthread_join(worker, NULL);
    muser_engine_close(s->q);
    const double dt = muser_now_s() - t0;
    pthread_mutex_lock(&p->mu);
    p->st.bytes_out += s->c.bytes_out;
    if (rc) p->st.failed++;
    else p->st.sessions++;
    pthread_mutex_unlock(&p->mu);
    if (rc)
        plog(p, "session %.8s to %s (%s): broken after %.3f s: %s", sidhex, s->c.peer, s->c.peer_cn, dt,
             rc == 1 ? "closed (fault injected)" : err.msg);
    else
        plog(p, "session %.8s to %s (%s): %u tokens from %llu, %u tiles, %.2f MB in %.3f s (prefill %.3f s)", sidhex,
             s->c.peer, s->c.peer_cn, s->man.n_tokens, (unsigned long long)s->man.cut, s->man.n_tiles,
             s->c.bytes_out / 1e6, dt, s->t_prefill);
}

static void *conn_main(void *arg)
{
    conn_slot *cs = arg;
    handoff_producer *p = cs->p;
    sigset_t old;
    hx_sigpipe_block(&old); /* this thread's own: a SIGPIPE raised here dies with it */
    session s;
    memset(&s, 0, sizeof s);
    s.p = p;
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    atomic_init(&s.cancel, false);
    muser_error err = {0};
    if (hx_accept(&s.c, &p->auth, cs->fd, cs->peer, p->o.timeout_ms, &err) == MUSER_OK) {
        serve_session(&s);
    } else {
        plog(p, "refused %s: %s", cs->peer, err.msg);
        pthread_mutex_lock(&p->mu);
        p->st.refused++;
        pthread_mutex_unlock(&p->mu);
    }
    hx_linger(&s.c, 1000); /* the peer reads why before the connection goes */
    pthread_mutex_lock(&p->mu);
    hx_close(&s.c); /* under the lock: stop() shuts down only sockets still open */
    cs->fd = -1;
    cs->done = true;
    pthread_mutex_unlock(&p->mu);
    session_free(&s);
    return NULL;
}

/* ---- the acceptor ---- */

/* Join finished connection threads; the first free slot (NULL: all busy). Under p->mu. */
static conn_slot *free_slot(handoff_producer *p)
{
    conn_slot *f = NULL;
    for (uint32_t i = 0; i < p->o.max_conns; i++) {
        conn_slot *cs = &p->conns[i];
        if (cs->used && cs->done) {
            pthread_join(cs->th, NULL);
            cs->used = false;
        }
        if (!cs->used && !f) f = cs;
    }
    return f;
}

static void *acceptor_main(void *arg)
{
    handoff_producer *p = arg;
    for (;;) {
        struct pollfd pf[2] = {{.fd = p->lfd, .events = POLLIN}, {.fd = p->stop_pipe[0], .events = POLLIN}};
        if (poll(pf, 2, 1000) < 0 && errno != EINTR) break;
        if (pf[1].revents) break;
        pthread_mutex_lock(&p->mu);
        free_slot(p); /* reap finished threads even when nobody connects */
        pthread_mutex_unlock(&p->mu);
        if (!(pf[0].revents & POLLIN)) continue;
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        const int fd = accept4(p->lfd, (struct sockaddr *)&a, &al, SOCK_CLOEXEC);
        if (fd < 0) continue;
        char peer[64], ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        snprintf(peer, sizeof peer, "%s:%u", ip, ntohs(a.sin_port));
        pthread_mutex_lock(&p->mu);
        conn_slot *cs = atomic_load(&p->stopping) ? NULL : free_slot(p);
        if (cs) {
            *cs = (conn_slot){.used = true, .fd = fd, .p = p};
            snprintf(cs->peer, sizeof cs->peer, "%s", peer);
            if (pthread_create(&cs->th, NULL, conn_main, cs) != 0) {
                cs->used = false;
                cs = NULL;
            }
        }
        if (!cs) p->st.refused++;
        pthread_mutex_unlock(&p->mu);
        if (!cs) {
            plog(p, "refused %s: %u sessions are running (--max-conns)", peer, p->o.max_conns);
            close(fd);
        }
    }
    return NULL;
}

int handoff_producer_start(handoff_producer **out, muser_engine *e, const handoff_producer_opts *o, muser_error *err)
{
    *out = NULL;
    if (!e || !o || !o->model_id) return muser_errorf(err, MUSER_E_ARG, "handoff_producer_start: NULL argument");
    handoff_producer *p = calloc(1, sizeof *p);
    if (!p) return muser_errorf(err, MUSER_E_NOMEM, "producer: out of memory");
    p->e = e;
    p->m = muser_engine_device(e)->model;
    p->o = *o;
    p->lfd = p->stop_pipe[0] = p->stop_pipe[1] = -1;
    if (!p->o.timeout_ms) p->o.timeout_ms = HANDOFF_DEFAULT_TIMEOUT_MS;
    if (!p->o.max_conns) p->o.max_conns = HANDOFF_DEFAULT_MAX_CONNS;
    if (!p->o.tile_rows) p->o.tile_rows = HX_TILE_ROWS;
    memcpy(p->model_id, o->model_id, HX_MODEL_ID_BYTES);
    if ((p->fixed = o->fixed_session_id != NULL)) memcpy(p->fixed_sid, o->fixed_session_id, HX_ID_BYTES);
    pthread_mutex_init(&p->mu, NULL);
    const muser_hparams *hp = &p->m->hp;
    const uint64_t ctx = muser_engine_device(e)->opts.n_ctx;
    p->max_tokens = ctx < HX_MAX_TOKENS ? (uint32_t)ctx : HX_MAX_TOKENS;
    int rc = MUSER_OK;
    if (p->o.tile_rows < HX_TILE_ROWS_MIN || p->o.tile_rows > HX_TILE_ROWS)
        rc = muser_errorf(err, MUSER_E_ARG, "producer: tiles of %u rows (%u..%u)", p->o.tile_rows, HX_TILE_ROWS_MIN, HX_TILE_ROWS);
    p->layers = rc ? NULL : calloc(hp->n_layer, sizeof *p->layers);
    p->conns = rc ? NULL : calloc(p->o.max_conns, sizeof *p->conns);
    if (!rc && (!p->layers || !p->conns)) rc = muser_errorf(err, MUSER_E_NOMEM, "producer: out of memory");
    if (!rc) handoff_layers(hp, p->layers);
    if (!rc) rc = hx_auth_load(&p->auth, o->tls_dir, o->key_file, true, err);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(o->port)};
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!rc && inet_pton(AF_INET, host, &a.sin_addr) != 1)
        rc = muser_errorf(err, MUSER_E_ARG, "producer: '%s' is not an IPv4 address", host);
    if (!rc) {
        const int one = 1;
        p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (p->lfd >= 0) setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        socklen_t al = sizeof a;
        if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(p->lfd, 64) != 0 ||
            getsockname(p->lfd, (struct sockaddr *)&a, &al) != 0)
            rc = muser_errorf(err, MUSER_E_IO, "producer: cannot listen on %s:%u: %s", host, o->port, strerror(errno));
        p->port = ntohs(a.sin_port);
    }
    if (!rc && pipe2(p->stop_pipe, O_CLOEXEC) != 0) rc = muser_errorf(err, MUSER_E_IO, "producer: pipe: %s", strerror(errno));
    if (!rc && pthread_create(&p->acceptor, NULL, acceptor_main, p) != 0)
        rc = muser_errorf(err, MUSER_E_BACKEND, "producer: cannot start the acceptor thread");
    if (rc) {
        if (p->lfd >= 0) close(p->lfd);
        if (p->stop_pipe[0] >= 0) close(p->stop_pipe[0]), close(p->stop_pipe[1]);
        hx_auth_free(&p->auth);
        free(p->layers);
        free(p->conns);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return rc;
    }
    *out = p;
    return MUSER_OK;
}

uint16_t handoff_producer_port(const handoff_producer *p) { return p->port; }

void handoff_producer_stats_get(handoff_producer *p, handoff_producer_stats *st)
{
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    pthread_mutex_unlock(&p->mu);
}

void handoff_producer_stop(handoff_producer *p)
{
    if (!p) return;
    const char b = 1;
    if (write(p->stop_pipe[1], &b, 1) < 0) { /* the acceptor polls the pipe; a failed write leaves its 1 s poll */ }
    pthread_join(p->acceptor, NULL);
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stopping, true);
    for (uint32_t i = 0; i < p->o.max_conns; i++)
        if (p->conns[i].used && p->conns[i].fd >= 0) shutdown(p->conns[i].fd, SHUT_RDWR); /* their I/O fails now */
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->o.max_conns; i++)
        if (p->conns[i].used) pthread_join(p->conns[i].th, NULL);
    close(p->lfd);
    close(p->stop_pipe[0]);
    close(p->stop_pipe[1]);
    hx_auth_free(&p->auth);
    free(p->layers);
    free(p->conns);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
