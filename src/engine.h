/* engine.h — one engine per accelerator (or CPU pool): the sequences on it, a batcher that packs
 * their decode steps into shared passes, and a scheduler where decode outranks prefill.
 *
 * The engine owns a device (session.h) and one thread that runs every pass on it; any number of
 * caller threads open sequences and submit work, each call blocking until its work is done:
 *   - decode steps that arrive within the batch window of the first waiting one share one
 *     small-batch pass (muser_step): the rows' bytes are those of decoding each alone (SPEC §4 row
 *     invariance), so packing never changes an output. The window is batch_window_us (250 µs by
 *     default) or an eighth of the last decode pass (at most 20 ms), whichever is longer; a pass
 *     starts at once when no other decoding sequence could join;
 *   - a prompt runs in chunks (prefill_chunk rows, 512 by default, at most the device's
 *     part_rows). On a device that runs a chunk in parts of layers (the CPU and the GPU), while
 *     another sequence is decoding each part is about three quarters of the last decode pass
 *     (from the last part's time per layer; one layer at least), so a waiting decode step runs
 *     after at most one part, and the chunk's bytes are those of running it whole. On one that
 *     runs chunks whole (the oracle), contended chunks are contended_chunk rows (64 by default),
 *     and while decode passes actually alternate with them about as long as the last decode pass
 *     (8 rows at least). Decode passes and prefill passes alternate while both wait, so neither
 *     starves the other, and an open waits for no more than the pass in flight;
 *   - muser_seq_cancel, from any thread, makes the sequence's waiting or running request return
 *     MUSER_E_CANCELLED at the next pass boundary and frees its cache; muser_engine_close frees
 *     the handle;
 *   - each sequence reserves its KV cache (its context) against the engine's budget when opened
 *     (MUSER_E_NO_ROOM when it does not fit); a request past a sequence's own context fails with
 *     MUSER_E_CONTEXT_FULL and the other sequences go on; a row whose logits are not finite fails
 *     its own request only (the pass is rerun without it).
 * Every pass is recorded in a log (kind, rows, sequences, times) for metrics and tests. */
#ifndef MUSER_ENGINE_H
#define MUSER_ENGINE_H

#include "session.h"

typedef struct muser_engine muser_engine;
typedef struct muser_seq muser_seq;

typedef struct muser_engine_opts {
    muser_session_opts dev;      /* backend, threads, device; dev.n_ctx: the largest context a
                                  * sequence may have (0: the model's) */
    uint32_t batch_window_us;    /* 0: 250 */
    uint32_t prefill_chunk;      /* rows per prefill pass when nothing decodes; 0: 512 */
    uint32_t contended_chunk;    /* rows per prefill pass while a sequence decodes, on a device
                                  * that runs chunks whole (the oracle); 0: 64 */
    uint64_t kv_budget_bytes;    /* KV bytes all open sequences may reserve; 0: no limit */
    uint32_t max_seqs;           /* open sequences at most; 0: 256 */
} muser_engine_opts;

typedef enum { MUSER_PASS_DECODE = 0, MUSER_PASS_PREFILL = 1 } muser_pass_kind;

typedef struct muser_pass_rec {
    uint64_t index;              /* passes since the engine started */
    muser_pass_kind kind;
    uint32_t rows, seqs;         /* rows in the pass, sequences they came from */
    uint32_t waiting_decoders;   /* decode requests waiting when the pass started (prefill) */
    uint32_t layer0, layer1;     /* prefill: the layers it ran, [layer0, layer1) of its chunk (a part
                                  * of a chunk run in parts; 0 .. n_layer: the whole chunk) */
    uint64_t first_seq;          /* id of the first row's sequence */
    double t_start, t_end;       /* muser_now_s() */
} muser_pass_rec;

typedef struct muser_engine_stats {
    uint64_t passes, decode_passes, decode_rows, prefill_rows; /* decode_rows / decode_passes: rows a pass */
    uint32_t open_seqs;
    uint64_t kv_reserved_bytes;
    double busy_s;               /* time inside passes */
} muser_engine_stats;

#define MUSER_ENGINE_LOG 4096    /* passes the log keeps (the newest) */

int muser_engine_new(muser_engine **out, const muser_model *m, const muser_engine_opts *o, muser_error *err);
/* Cancels every open sequence, stops the thread, frees everything. Handles still open are freed
 * too; none may be used afterwards. */
void muser_engine_free(muser_engine *e);

/* A sequence with context n_ctx (0: the engine's), its KV reserved now. */
int muser_engine_open(muser_engine *e, uint64_t n_ctx, muser_seq **out, muser_error *err);
/* Cancels what the sequence still runs, waits until the engine freed its cache, frees the handle.
 * Not concurrently with another call on the same handle (muser_seq_cancel excepted). */
void muser_engine_close(muser_seq *q);
/* Any thread, any time: the sequence's waiting or running request returns MUSER_E_CANCELLED and
 * its cache is freed; later requests on it fail the same way. */
void muser_seq_cancel(muser_seq *q);

/* The prompt, appended at the sequence's position, in chunks; logits (may be NULL) of its last
 * row [V]. One request at a time per sequence. */
int muser_seq_prefill(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, muser_error *err);
/* One decode row, packed with whatever else decodes in the window; logits (may be NULL) [V], and
 * top (may be NULL) the row's best top->k logits (session.h muser_top): a greedy or top-k sampler
 * that asks for no logits gets what it needs without the row's copy (on the GPU, 808 KB). */
int muser_seq_decode(muser_seq *q, int32_t token, float *logits, const muser_top *top, muser_error *err);
/* One decode row whose token is drawn where its logits are (session.h muser_draw: draw->id set,
 * or −1 and the row in logits [V], which is needed): a whole-row sampler's step (temperature,
 * top-p, min-p) without the row's copy where the backend draws. */
int muser_seq_decode_draw(muser_seq *q, int32_t token, float *logits, muser_draw *draw, muser_error *err);
/* A speculative block: n rows (1..16) at the sequence's next positions in one pass (packed with
 * other sequences' rows), after a KV checkpoint; logits [n][V] (may be NULL). Each row's bytes
 * are those of decoding it alone. Follow it with muser_seq_rollback. */
int muser_seq_verify(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, muser_error *err);
/* muser_seq_prefill / muser_seq_verify with the hidden-state tap (session.h muser_tap; tap->out
 * [n][n_layers][E], written when the request succeeds; tap NULL: none), the same bytes of logits
 * and cache: what a DFlash drafter reads. Verify blocks with different tap layers do not share a
 * pass. A backend without the tap refuses (MUSER_E_UNSUPPORTED; the prefill route: CUDA, oracle). */
int muser_seq_prefill_tap(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_tap *tap,
                          muser_error *err);
int muser_seq_verify_tap(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_tap *tap,
                         muser_error *err);
/* n rows (1..16) at the sequence's next positions in one pass, as muser_seq_verify's, but extending
 * the open speculative block instead of starting one: the first call after any other request
 * checkpoints, later ones add to its rows (at most KV_MAX_SPEC_ROWS in all; MUSER_E_ARG past that,
 * nothing run). logits [n][V] and top (each row's best top->k) may be NULL. What a draft model's
 * greedy proposals run on: muser_seq_rollback then drops the rows the target did not accept. */
int muser_seq_draft(muser_seq *q, const int32_t *tokens, uint32_t n, float *logits, const muser_top *top,
                    muser_error *err);
/* Keep positions < n_keep of the open block (a verify, or muser_seq_draft's rows; n_keep >= its
 * first position) and drop the checkpoint: the cache holds exactly what decoding the kept rows
 * alone would have written. */
int muser_seq_rollback(muser_seq *q, uint64_t n_keep, muser_error *err);
/* q's cache becomes a copy of src's (an idle sequence of the same engine and context): a prefix
 * cache's fork. */
int muser_seq_copy_from(muser_seq *q, muser_seq *src, muser_error *err);
uint64_t muser_seq_pos(const muser_seq *q); /* tokens the sequence holds */
uint64_t muser_seq_id(const muser_seq *q);
/* The passes that ended while this sequence's open waited for the device: at most the one in
 * flight when it was asked (the engine starts none while an open waits). */
uint32_t muser_seq_open_waited(const muser_seq *q);
const muser_model *muser_seq_model(const muser_seq *q);
/* muser_session_kv_sha256 of the sequence's cache (not while a request of it runs). */
int muser_seq_kv_sha256(muser_seq *q, char hex[65], muser_error *err);

/* Remote prefill (src/handoff), on idle sequences (no request running; not while another thread
 * uses or cancels the same handle). muser_seq_kv_rows: K/V rows the sequence holds
 * (muser_session_kv_rows), e.g. a producer's between its prompt's chunks. muser_seq_kv_import:
 * rows into a detached generation, a sequence only its caller knows (muser_session_kv_import).
 * muser_seq_install: the atomic swap, under the engine's lock and outside any pass of q or gen:
 * gen is sealed at n_past (muser_session_kv_seal) and q takes its cache at position n_past, gen
 * q's old one (the caller closes gen). Refused with q unchanged: other engines or contexts, a
 * busy or cancelled sequence. */
int muser_seq_kv_rows(muser_seq *q, uint32_t l, uint64_t pos0, uint32_t n, uint16_t *k, uint16_t *v,
                      muser_error *err);
int muser_seq_kv_import(muser_seq *q, uint32_t l, uint64_t n_past, uint64_t pos0, uint32_t n, const uint16_t *k,
                        const uint16_t *v, muser_error *err);
int muser_seq_install(muser_seq *q, muser_seq *gen, uint64_t n_past, muser_error *err);
muser_engine *muser_seq_engine(const muser_seq *q);
uint64_t muser_seq_ctx(const muser_seq *q); /* its context */

/* Copies the newest passes (at most max) oldest first; returns how many. */
uint32_t muser_engine_passes(muser_engine *e, muser_pass_rec *out, uint32_t max);
void muser_engine_stats_get(muser_engine *e, muser_engine_stats *out);
const muser_device *muser_engine_device(const muser_engine *e);

#endif
