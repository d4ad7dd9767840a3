/* handoff.h — remote prefill (SPEC §6, docs/handoff.md): a producer prefills prompts and streams
 * their KV cache to decoding consumers over mutually authenticated TLS; a consumer installs it and
 * decodes from position n as if it had prefilled the prompt itself, bit for bit.
 *
 * Producer (handoff_producer): listens, takes one session per connection (a thread each, up to
 * max_conns), prefills the requested tokens on an engine sequence in tile-sized chunks and sends
 * each FULL-layer tile as soon as its chunk is done, then the SWA ring tiles, the last row's
 * logits and an end frame. A client that misbehaves loses its own connection only.
 *
 * Consumer (handoff_client + handoff_fetch): sends the tokens and the prefix [0, cut) it already
 * holds, checks the sealed manifest (model, tokens, the exact tile list, a fresh session id:
 * the replay ledger), scatters each verified tile into a detached generation (a sequence of its
 * own that nothing decodes), checks that every expected row arrived (validate_complete) and then
 * swaps the generation in atomically (muser_seq_install: n_past = n). Any failure — a bad MAC, a
 * missing or repeated tile, the wrong model, an early close, a timeout, an oversized frame —
 * installs nothing, leaves the target sequence as it was, and says what failed. */
#ifndef MUSER_HANDOFF_H
#define MUSER_HANDOFF_H

#include "engine.h"
#include "handoff/wire.h"

#include <signal.h>
#include <stdio.h>

#define HANDOFF_DEFAULT_TIMEOUT_MS 30000u
#define HANDOFF_DEFAULT_MAX_CONNS 8u

/* The model's identity: SHA-256 of its file (the mapped bytes of m), cached beside it in
 * PATH.sha256 and trusted while the file's size and mtime match what the cache records (a cache
 * that cannot be written is skipped; path NULL: no cache). */
int handoff_model_id(const muser_model *m, const char *path, uint8_t id[HX_MODEL_ID_BYTES], muser_error *err);
/* The model's planes as a manifest lists them (out: [n_layer]): ring and window, or FULL. */
void handoff_layers(const muser_hparams *hp, hx_layer *out);

/* ---- producer ---- */

/* Tests play a hostile producer: called on every frame before it is sealed (the payload may be
 * edited); the answer says what to do with it. */
typedef enum {
    HANDOFF_FAULT_NONE = 0, /* send it */
    HANDOFF_FAULT_DROP,     /* skip it */
    HANDOFF_FAULT_DUP,      /* send it twice */
    HANDOFF_FAULT_FLIP,     /* flip one payload bit after the MAC */
    HANDOFF_FAULT_OVERSIZE, /* send a header claiming a payload past every bound instead, then close */
    HANDOFF_FAULT_CLOSE,    /* close the connection instead (a truncated stream) */
    HANDOFF_FAULT_STALL,    /* send nothing more; hold the connection until the peer leaves */
} handoff_fault;
typedef handoff_fault (*handoff_fault_fn)(void *ctx, uint32_t type, uint32_t index, uint8_t *payload, uint32_t len);

typedef struct handoff_producer_opts {
    const char *host;            /* IPv4 address to listen on; NULL: 127.0.0.1 */
    uint16_t port;               /* 0: any free one (handoff_producer_port) */
    const char *tls_dir;         /* ca.pem, cert.pem, key.pem */
    const char *key_file;        /* the shared HMAC key */
    const uint8_t *model_id;     /* [HX_MODEL_ID_BYTES] handoff_model_id of the engine's model */
    uint32_t timeout_ms;         /* every read and write; 0: HANDOFF_DEFAULT_TIMEOUT_MS */
    uint32_t max_conns;          /* sessions at once (more are closed at once); 0: HANDOFF_DEFAULT_MAX_CONNS */
    uint32_t tile_rows;          /* HX_TILE_ROWS_MIN..HX_TILE_ROWS; 0: HX_TILE_ROWS */
    FILE *log;                   /* a line per session or refusal; NULL: none */
    handoff_fault_fn fault;      /* tests; NULL in the product */
    void *fault_ctx;
    const uint8_t *fixed_session_id; /* tests: every session gets this id (a replaying producer) */
} handoff_producer_opts;

typedef struct handoff_producer handoff_producer;
typedef struct handoff_producer_stats {
    uint64_t sessions, refused, failed; /* completed, refused (request, TLS, busy), broken mid-stream */
    uint64_t bytes_out;
} handoff_producer_stats;

/* Binds, listens and starts serving on e (which must outlive the producer). */
int handoff_producer_start(handoff_producer **out, muser_engine *e, const handoff_producer_opts *o, muser_error *err);
uint16_t handoff_producer_port(const handoff_producer *p);
void handoff_producer_stats_get(handoff_producer *p, handoff_producer_stats *st);
/* Stops accepting, ends the running sessions (their peers see an early close), frees. */
void handoff_producer_stop(handoff_producer *p);

/* ---- consumer ---- */

typedef struct handoff_client_opts {
    const char *host;
    uint16_t port;
    const char *tls_dir, *key_file;
    const char *ledger;          /* NULL: handoff_ledger_default_path */
    const uint8_t *model_id;     /* [HX_MODEL_ID_BYTES] our model's */
    uint32_t timeout_ms;         /* 0: HANDOFF_DEFAULT_TIMEOUT_MS */
    volatile sig_atomic_t *interrupt; /* NULL, or a flag a SIGINT handler sets: a fetch waiting
                                       * then fails MUSER_E_INTERRUPTED (installing nothing) */
} handoff_client_opts;

typedef struct handoff_client handoff_client;

typedef struct handoff_stats {
    char session[2 * HX_ID_BYTES + 1];
    uint32_t tiles, tile_rows;
    uint64_t cut, n;             /* positions [cut, n) came over the wire */
    uint64_t bytes_in, bytes_out;
    double connect_s, first_tile_s, total_s; /* from the call's start */
} handoff_stats;

/* Loads the credentials and opens the ledger (errors name the file). One client serves any
 * number of fetches, from any threads. */
int handoff_client_new(handoff_client **out, const handoff_client_opts *o, muser_error *err);
void handoff_client_free(handoff_client *c);
/* Remote prefill of tokens[0, n) into q: q holds [0, cut) already (cut = its position: a warm
 * prefix, which must be those tokens; 0 for an empty sequence) and gets [cut, n) from the
 * producer; on success q is at position n and logits (may be NULL) holds the last row's [V].
 * On failure q, logits and every other sequence are untouched. st may be NULL. */
int handoff_fetch(handoff_client *c, muser_seq *q, const int32_t *tokens, uint32_t n, float *logits,
                  handoff_stats *st, muser_error *err);

#endif
