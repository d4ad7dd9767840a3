/* kv.h — the KV cache planes of SPEC §3: f16 K and V per layer, per sequence.
 *
 * SWA layers: a token-major ring of `capacity` (= W) rows, each row [HKV*D] f16. Metadata
 * origin_logical / origin_physical / len; the physical row of logical position p is
 * (origin_physical + p - origin_logical) mod capacity. FULL layers: a head-major plane
 * [HKV][capacity][D] growing to the context limit (capacity = n_ctx). Storage is zero-filled at
 * allocation. Append accepts only the next position (MUSER_E_CACHE_DISCONTINUITY otherwise, with
 * nothing changed). A checkpoint lets a speculative block be rolled back: FULL planes rewind
 * metadata only; SWA planes save the <= KV_MAX_SPEC_ROWS rows a block may overwrite.
 *
 * The metadata struct is shared by every backend; the CPU backend also owns the storage here.
 * The CUDA backend keeps the same metadata and device storage of the same layout. */
#ifndef MUSER_KV_H
#define MUSER_KV_H

#include "model.h"

#define KV_MAX_SPEC_ROWS 16

typedef struct kv_plane {
    bool ring;                /* SWA ring (token-major) vs FULL plane (head-major) */
    uint32_t n_head_kv, head_dim;
    uint64_t capacity;        /* rows */
    uint64_t origin_logical;  /* logical position stored at origin_physical */
    uint64_t origin_physical;
    uint64_t len;             /* valid rows, <= capacity */
    uint64_t next_pos;        /* the only position append accepts */
    uint16_t *k, *v;          /* CPU storage (NULL on device backends) */
} kv_plane;

/* Physical row of logical position p (p must be stored). */
static inline uint64_t kv_plane_row(const kv_plane *pl, uint64_t p)
{
    return (pl->origin_physical + (p - pl->origin_logical)) % pl->capacity;
}

typedef struct kv_checkpoint_plane {
    kv_plane meta;            /* metadata at checkpoint time */
    uint16_t *saved_k, *saved_v; /* ring: up to KV_MAX_SPEC_ROWS rows starting at next_pos */
    uint64_t saved_rows;
} kv_checkpoint_plane;

typedef struct muser_kv {
    uint32_t n_layer;
    kv_plane *planes;         /* [n_layer] */
    bool has_checkpoint;
    kv_checkpoint_plane *ckpt;/* [n_layer], allocated once */
} muser_kv;

/* Layer l's plane geometry (ring or FULL, heads, capacity: the window or n_ctx), empty, no
 * storage: what kv_init gives each plane. */
/* Bytes of f16 K and V one sequence of context n_ctx reserves: a ring of swa_window rows per SWA
 * layer, n_ctx rows per FULL layer (the planes kv_init lays out). */
uint64_t kv_cache_bytes(const muser_hparams *hp, uint64_t n_ctx);
void kv_plane_shape(kv_plane *pl, const muser_hparams *hp, uint32_t l, uint64_t n_ctx);
/* pl's metadata becomes that of n appends from empty, the shape a local prefill of n tokens
 * leaves (a ring: the last min(n, capacity) positions, origin_physical = origin_logical mod
 * capacity); n <= capacity for a FULL plane. Storage untouched. */
void kv_plane_meta_after(kv_plane *pl, uint64_t n);

/* n_ctx: context limit (FULL capacity). with_storage=false allocates metadata only (device). */
int kv_init(muser_kv *kv, const muser_hparams *hp, uint64_t n_ctx, bool with_storage,
            muser_error *err);
void kv_free(muser_kv *kv);
void kv_reset(muser_kv *kv); /* empty, storage zeroed */

/* Write K and V rows ([HKV*D] f32 each, converted to f16) at logical position pos. */
int kv_plane_append(kv_plane *pl, uint64_t pos, const float *k, const float *v, muser_error *err);
/* Pointers to K / V of head h at logical position p (D contiguous f16). */
const uint16_t *kv_plane_k(const kv_plane *pl, uint32_t h, uint64_t p);
const uint16_t *kv_plane_v(const kv_plane *pl, uint32_t h, uint64_t p);
/* Oldest logical position still stored (for a ring after wrapping). */
uint64_t kv_plane_first_pos(const kv_plane *pl);

/* Rows of logical positions [pos0, pos0 + n) (all stored) into k and v, token-major:
 * [n][HKV*D] f16 each — the layout a remote-prefill tile carries. */
void kv_plane_read_rows(const kv_plane *pl, uint64_t pos0, uint64_t n, uint16_t *k, uint16_t *v);
/* A remote install's write: pl's metadata becomes meta's (its storage kept), then the
 * token-major rows of positions [pos0, pos0 + n) land at the physical rows meta maps them to.
 * The caller checked meta (kv_plane_meta_after) and that the rows are positions it holds. */
void kv_plane_import(kv_plane *pl, const kv_plane *meta, uint64_t pos0, uint64_t n, const uint16_t *k,
                     const uint16_t *v);

/* Undo for one forward call of any length (fail closed: a call that errors anywhere must leave
 * the cache byte-identical): every plane's metadata and, for rings, the rows the call's appends
 * will land on. Storage (capacity rows per ring) is allocated once by kv_undo_init, so saving
 * and restoring allocate nothing. Restoring re-zeroes the FULL rows the call appended. */
typedef struct kv_undo {
    uint32_t n_layer;
    kv_plane *meta;           /* [n_layer] */
    uint16_t **k, **v;        /* [n_layer]: [capacity][HKV*D] for rings, NULL for FULL planes */
} kv_undo;

int kv_undo_init(kv_undo *u, const muser_kv *kv, muser_error *err);
void kv_undo_free(kv_undo *u);
void kv_undo_save(kv_undo *u, const muser_kv *kv, uint64_t n_rows);
void kv_undo_restore(const kv_undo *u, muser_kv *kv);

/* dst (allocated for the same hparams and context, with storage) becomes a copy of src: metadata
 * and storage; no checkpoint. */
void kv_copy(muser_kv *dst, const muser_kv *src);

/* Speculation: checkpoint before a block of <= KV_MAX_SPEC_ROWS rows; rollback to keep only
 * positions < n_keep (n_keep >= checkpointed next_pos); commit drops the checkpoint. */
int kv_checkpoint(muser_kv *kv, muser_error *err);
int kv_rollback(muser_kv *kv, uint64_t n_keep, muser_error *err);
void kv_commit(muser_kv *kv);

#endif
