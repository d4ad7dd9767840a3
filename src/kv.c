/* kv.c — the KV cache planes of SPEC §3: allocation, append, addressing, speculative
 * checkpoint / rollback / commit.
 *
 * Layout (f16 storage, zero-filled at allocation):
 *   SWA ring   token-major: row r = [HKV*D] K (and the same for V); capacity = W rows.
 *              Physical row of logical p = (origin_physical + p - origin_logical) mod capacity.
 *   FULL plane head-major: [HKV][capacity][D]; capacity = n_ctx; position p is row p.
 *
 * Metadata evolves the same way on every backend (the CUDA one keeps metadata only), so it is
 * written once, in plane_advance. Invariant kept by this file on CPU storage: every stored byte
 * equals what a plain sequence of appends of the kept positions would have produced, so two
 * caches built by different routes can be compared with memcmp or SHA-256 — rollback therefore
 * also zeroes the FULL-plane rows it rewinds past (cheap: at most KV_MAX_SPEC_ROWS rows). */
#include "kv.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

static uint64_t plane_row_elems(const kv_plane *pl)
{
    return (uint64_t)pl->n_head_kv * pl->head_dim;
}

static uint64_t plane_elems(const kv_plane *pl)
{
    return pl->capacity * plane_row_elems(pl);
}

/* Rows a speculative block may overwrite in a ring (a block longer than the ring touches every
 * row of it at most once before it would overwrite its own accepted rows). */
static uint64_t ring_saved_rows(const kv_plane *pl)
{
    return pl->capacity < KV_MAX_SPEC_ROWS ? pl->capacity : KV_MAX_SPEC_ROWS;
}

/* Metadata after appending next_pos (storage untouched). A ring that is full drops its oldest
 * position: the new row lands on origin_physical, so the origin moves one row on. */
static void plane_advance(kv_plane *pl)
{
    if (pl->len < pl->capacity) {
        pl->len++;
    } else {
        pl->origin_logical++;
        pl->origin_physical = (pl->origin_physical + 1) % pl->capacity;
    }
    pl->next_pos++;
}

static void plane_reset_meta(kv_plane *pl)
{
    pl->origin_logical = 0;
    pl->origin_physical = 0;
    pl->len = 0;
    pl->next_pos = 0;
}

void kv_plane_shape(kv_plane *pl, const muser_hparams *hp, uint32_t l, uint64_t n_ctx)
{
    memset(pl, 0, sizeof *pl);
    pl->ring = muser_layer_is_swa(hp, l);
    pl->n_head_kv = hp->n_head_kv;
    pl->head_dim = hp->head_dim;
    pl->capacity = pl->ring ? hp->swa_window : n_ctx;
}

void kv_plane_meta_after(kv_plane *pl, uint64_t n)
{
    /* plane_advance n times from empty, in closed form: a ring keeps the last capacity
     * positions and its origin has moved once per dropped position, so origin_physical ==
     * origin_logical mod capacity */
    pl->len = pl->ring && n > pl->capacity ? pl->capacity : n;
    pl->origin_logical = n - pl->len;
    pl->origin_physical = pl->ring ? pl->origin_logical % pl->capacity : 0;
    pl->next_pos = n;
}

int kv_init(muser_kv *kv, const muser_hparams *hp, uint64_t n_ctx, bool with_storage,
            muser_error *err)
{
    if (!kv || !hp)
        return muser_errorf(err, MUSER_E_ARG, "kv_init: NULL argument");
    memset(kv, 0, sizeof *kv);
    if (n_ctx == 0)
        return muser_errorf(err, MUSER_E_ARG, "kv_init: context length 0");
    if (hp->n_layer == 0 || hp->n_head_kv == 0 || hp->head_dim == 0)
        return muser_errorf(err, MUSER_E_ARG, "kv_init: n_layer %u, n_head_kv %u, head_dim %u",
                            hp->n_layer, hp->n_head_kv, hp->head_dim);
    kv->n_layer = hp->n_layer;
    kv->planes = calloc(hp->n_layer, sizeof *kv->planes);
    kv->ckpt = calloc(hp->n_layer, sizeof *kv->ckpt);
    if (!kv->planes || !kv->ckpt) {
        kv_free(kv);
        return muser_errorf(err, MUSER_E_NOMEM, "kv_init: out of memory for %u planes",
                            hp->n_layer);
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        kv_plane *pl = &kv->planes[l];
        kv_plane_shape(pl, hp, l, n_ctx);
        if (!with_storage)
            continue;
        const uint64_t bytes = plane_elems(pl) * sizeof(uint16_t);
        pl->k = muser_alloc_aligned(bytes);
        pl->v = muser_alloc_aligned(bytes);
        if (pl->ring) {
            const uint64_t save = ring_saved_rows(pl) * plane_row_elems(pl) * sizeof(uint16_t);
            kv->ckpt[l].saved_k = muser_alloc_aligned(save);
            kv->ckpt[l].saved_v = muser_alloc_aligned(save);
        }
        if (!pl->k || !pl->v || (pl->ring && (!kv->ckpt[l].saved_k || !kv->ckpt[l].saved_v))) {
            kv_free(kv);
            return muser_errorf(err, MUSER_E_NOMEM,
                                "kv_init: out of memory for layer %u (%s plane, %llu rows, "
                                "%llu bytes each for K and V)",
                                l, pl->ring ? "SWA ring" : "FULL", (unsigned long long)pl->capacity,
                                (unsigned long long)bytes);
        }
    }
    return MUSER_OK;
}

void kv_free(muser_kv *kv)
{
    if (!kv)
        return;
    for (uint32_t l = 0; kv->planes && l < kv->n_layer; l++) {
        muser_free_aligned(kv->planes[l].k);
        muser_free_aligned(kv->planes[l].v);
    }
    for (uint32_t l = 0; kv->ckpt && l < kv->n_layer; l++) {
        muser_free_aligned(kv->ckpt[l].saved_k);
        muser_free_aligned(kv->ckpt[l].saved_v);
    }
    free(kv->planes);
    free(kv->ckpt);
    memset(kv, 0, sizeof *kv);
}

void kv_reset(muser_kv *kv)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        kv_plane *pl = &kv->planes[l];
        plane_reset_meta(pl);
        if (pl->k) {
            memset(pl->k, 0, plane_elems(pl) * sizeof(uint16_t));
            memset(pl->v, 0, plane_elems(pl) * sizeof(uint16_t));
        }
    }
    kv->has_checkpoint = false;
}

/* Element offset of K/V of head h at physical row r. */
static uint64_t plane_offset(const kv_plane *pl, uint32_t h, uint64_t r)
{
    return pl->ring ? r * plane_row_elems(pl) + (uint64_t)h * pl->head_dim
                    : ((uint64_t)h * pl->capacity + r) * pl->head_dim;
}

static uint64_t plane_physical(const kv_plane *pl, uint64_t p)
{
    return pl->ring ? kv_plane_row(pl, p) : p;
}

int kv_plane_append(kv_plane *pl, uint64_t pos, const float *k, const float *v, muser_error *err)
{
    if (pos != pl->next_pos)
        return muser_errorf(err, MUSER_E_CACHE_DISCONTINUITY,
                            "KV append at position %llu, but the cache holds positions up to %llu "
                            "and accepts only %llu",
                            (unsigned long long)pos,
                            (unsigned long long)(pl->next_pos ? pl->next_pos - 1 : 0),
                            (unsigned long long)pl->next_pos);
    if (!pl->ring && pos >= pl->capacity)
        return muser_errorf(err, MUSER_E_CONTEXT_FULL,
                            "KV append at position %llu: the context holds %llu positions",
                            (unsigned long long)pos, (unsigned long long)pl->capacity);
    if (pl->k) {
        if (!k || !v)
            return muser_errorf(err, MUSER_E_ARG, "kv_plane_append: NULL K or V row");
        /* For a full ring this is origin_physical: the oldest row is overwritten. */
        const uint64_t r = plane_physical(pl, pos);
        for (uint32_t h = 0; h < pl->n_head_kv; h++) {
            uint16_t *dk = pl->k + plane_offset(pl, h, r);
            uint16_t *dv = pl->v + plane_offset(pl, h, r);
            const float *sk = k + (uint64_t)h * pl->head_dim;
            const float *sv = v + (uint64_t)h * pl->head_dim;
            for (uint32_t d = 0; d < pl->head_dim; d++) {
                dk[d] = muser_f32_to_f16(sk[d]);
                dv[d] = muser_f32_to_f16(sv[d]);
            }
        }
    }
    plane_advance(pl);
    return MUSER_OK;
}

const uint16_t *kv_plane_k(const kv_plane *pl, uint32_t h, uint64_t p)
{
    return pl->k + plane_offset(pl, h, plane_physical(pl, p));
}

const uint16_t *kv_plane_v(const kv_plane *pl, uint32_t h, uint64_t p)
{
    return pl->v + plane_offset(pl, h, plane_physical(pl, p));
}

uint64_t kv_plane_first_pos(const kv_plane *pl)
{
    return pl->next_pos - pl->len;
}

void kv_plane_read_rows(const kv_plane *pl, uint64_t pos0, uint64_t n, uint16_t *k, uint16_t *v)
{
    const uint64_t re = plane_row_elems(pl), D = pl->head_dim;
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < pl->n_head_kv; h++) {
            memcpy(k + i * re + h * D, kv_plane_k(pl, h, pos0 + i), D * sizeof(uint16_t));
            memcpy(v + i * re + h * D, kv_plane_v(pl, h, pos0 + i), D * sizeof(uint16_t));
        }
}

void kv_plane_import(kv_plane *pl, const kv_plane *meta, uint64_t pos0, uint64_t n, const uint16_t *k,
                     const uint16_t *v)
{
    uint16_t *sk = pl->k, *sv = pl->v;
    *pl = *meta;
    pl->k = sk;
    pl->v = sv;
    if (!sk)
        return;
    const uint64_t re = plane_row_elems(pl), D = pl->head_dim;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = plane_physical(pl, pos0 + i);
        for (uint32_t h = 0; h < pl->n_head_kv; h++) {
            memcpy(sk + plane_offset(pl, h, r), k + i * re + h * D, D * sizeof(uint16_t));
            memcpy(sv + plane_offset(pl, h, r), v + i * re + h * D, D * sizeof(uint16_t));
        }
    }
}

/* Physical row where a ring checkpoint's saved row i lives: the row next_pos + i would take. */
static uint64_t ckpt_ring_row(const kv_plane *meta, uint64_t i)
{
    return (meta->origin_physical + meta->len + i) % meta->capacity;
}

int kv_checkpoint(muser_kv *kv, muser_error *err)
{
    if (!kv || !kv->planes)
        return muser_errorf(err, MUSER_E_ARG, "kv_checkpoint: cache not initialised");
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        const kv_plane *pl = &kv->planes[l];
        kv_checkpoint_plane *c = &kv->ckpt[l];
        c->meta = *pl;
        c->saved_rows = 0;
        if (!pl->ring || !pl->k)
            continue;
        c->saved_rows = ring_saved_rows(pl);
        const uint64_t re = plane_row_elems(pl);
        for (uint64_t i = 0; i < c->saved_rows; i++) {
            const uint64_t r = ckpt_ring_row(pl, i);
            memcpy(c->saved_k + i * re, pl->k + r * re, re * sizeof(uint16_t));
            memcpy(c->saved_v + i * re, pl->v + r * re, re * sizeof(uint16_t));
        }
    }
    kv->has_checkpoint = true;
    return MUSER_OK;
}

int kv_rollback(muser_kv *kv, uint64_t n_keep, muser_error *err)
{
    if (!kv || !kv->has_checkpoint)
        return muser_errorf(err, MUSER_E_ARG, "KV rollback without a checkpoint");
    /* Validate every plane before touching any, so a refused rollback changes nothing. */
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        const kv_plane *pl = &kv->planes[l];
        const kv_plane *m = &kv->ckpt[l].meta;
        if (n_keep < m->next_pos || n_keep > pl->next_pos)
            return muser_errorf(err, MUSER_E_ARG,
                                "KV rollback to %llu: must lie between the checkpoint (%llu) and "
                                "the current position (%llu)",
                                (unsigned long long)n_keep, (unsigned long long)m->next_pos,
                                (unsigned long long)pl->next_pos);
        const uint64_t written = pl->next_pos - m->next_pos;
        if (written > KV_MAX_SPEC_ROWS)
            return muser_errorf(err, MUSER_E_ARG,
                                "KV rollback: %llu rows were written since the checkpoint, more "
                                "than the %d a speculative block may write",
                                (unsigned long long)written, KV_MAX_SPEC_ROWS);
        if (pl->ring && written > pl->capacity && n_keep < pl->next_pos)
            return muser_errorf(err, MUSER_E_ARG,
                                "KV rollback: layer %u's ring (%llu rows) was overwritten by a "
                                "block of %llu rows; cannot restore",
                                l, (unsigned long long)pl->capacity, (unsigned long long)written);
    }
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        kv_plane *pl = &kv->planes[l];
        const kv_checkpoint_plane *c = &kv->ckpt[l];
        const uint64_t accepted = n_keep - c->meta.next_pos;
        const uint64_t written = pl->next_pos - c->meta.next_pos;
        if (pl->k) {
            const uint64_t re = plane_row_elems(pl);
            if (pl->ring) {
                /* Rejected rows get their pre-checkpoint bytes back; accepted rows stay. */
                for (uint64_t i = accepted; i < written && i < c->saved_rows; i++) {
                    const uint64_t r = ckpt_ring_row(&c->meta, i);
                    memcpy(pl->k + r * re, c->saved_k + i * re, re * sizeof(uint16_t));
                    memcpy(pl->v + r * re, c->saved_v + i * re, re * sizeof(uint16_t));
                }
            } else {
                for (uint32_t h = 0; h < pl->n_head_kv; h++) {
                    const uint64_t off = plane_offset(pl, h, n_keep);
                    memset(pl->k + off, 0, (written - accepted) * pl->head_dim * sizeof(uint16_t));
                    memset(pl->v + off, 0, (written - accepted) * pl->head_dim * sizeof(uint16_t));
                }
            }
        }
        /* Metadata: the checkpoint's, advanced by the accepted rows. */
        uint16_t *k = pl->k, *v = pl->v;
        *pl = c->meta;
        pl->k = k;
        pl->v = v;
        for (uint64_t i = 0; i < accepted; i++)
            plane_advance(pl);
    }
    kv->has_checkpoint = false;
    return MUSER_OK;
}

void kv_commit(muser_kv *kv)
{
    if (kv)
        kv->has_checkpoint = false;
}

/* ---- undo for one forward call ---- */

/* Physical ring row that the i-th append from now will write. */
static uint64_t ring_next_row(const kv_plane *pl, uint64_t i)
{
    return (pl->origin_physical + pl->len + i) % pl->capacity;
}

int kv_undo_init(kv_undo *u, const muser_kv *kv, muser_error *err)
{
    memset(u, 0, sizeof *u);
    u->n_layer = kv->n_layer;
    u->meta = calloc(kv->n_layer, sizeof *u->meta);
    u->k = calloc(kv->n_layer, sizeof *u->k);
    u->v = calloc(kv->n_layer, sizeof *u->v);
    bool ok = u->meta && u->k && u->v;
    for (uint32_t l = 0; ok && l < kv->n_layer; l++) {
        const kv_plane *pl = &kv->planes[l];
        if (!pl->ring || !pl->k)
            continue;
        const uint64_t bytes = pl->capacity * pl->n_head_kv * pl->head_dim * sizeof(uint16_t);
        ok = (u->k[l] = muser_alloc_aligned(bytes)) != NULL &&
             (u->v[l] = muser_alloc_aligned(bytes)) != NULL;
    }
    if (!ok) {
        kv_undo_free(u);
        return muser_errorf(err, MUSER_E_NOMEM, "kv: out of memory for the undo copy");
    }
    return MUSER_OK;
}

void kv_undo_free(kv_undo *u)
{
    for (uint32_t l = 0; u->k && l < u->n_layer; l++) {
        muser_free_aligned(u->k[l]);
        muser_free_aligned(u->v[l]);
    }
    free(u->k);
    free(u->v);
    free(u->meta);
    memset(u, 0, sizeof *u);
}

void kv_undo_save(kv_undo *u, const muser_kv *kv, uint64_t n_rows)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        const kv_plane *pl = &kv->planes[l];
        u->meta[l] = *pl;
        if (!u->k[l])
            continue;
        const uint64_t re = (uint64_t)pl->n_head_kv * pl->head_dim;
        const uint64_t rows = n_rows < pl->capacity ? n_rows : pl->capacity;
        for (uint64_t i = 0; i < rows; i++) {
            const uint64_t r = ring_next_row(pl, i);
            memcpy(u->k[l] + i * re, pl->k + r * re, re * sizeof(uint16_t));
            memcpy(u->v[l] + i * re, pl->v + r * re, re * sizeof(uint16_t));
        }
    }
}

void kv_undo_restore(const kv_undo *u, muser_kv *kv)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        kv_plane *pl = &kv->planes[l];
        const kv_plane *was = &u->meta[l];
        const uint64_t added = pl->next_pos - was->next_pos;
        if (u->k[l]) {
            const uint64_t re = (uint64_t)pl->n_head_kv * pl->head_dim;
            const uint64_t rows = added < pl->capacity ? added : pl->capacity;
            for (uint64_t i = 0; i < rows; i++) {
                const uint64_t r = ring_next_row(was, i);
                memcpy(pl->k + r * re, u->k[l] + i * re, re * sizeof(uint16_t));
                memcpy(pl->v + r * re, u->v[l] + i * re, re * sizeof(uint16_t));
            }
        } else if (!pl->ring && pl->k) {
            for (uint32_t h = 0; h < pl->n_head_kv && added; h++) {
                const uint64_t off = ((uint64_t)h * pl->capacity + was->next_pos) * pl->head_dim;
                memset(pl->k + off, 0, added * pl->head_dim * sizeof(uint16_t));
                memset(pl->v + off, 0, added * pl->head_dim * sizeof(uint16_t));
            }
        }
        *pl = *was;
    }
}

void kv_copy(muser_kv *dst, const muser_kv *src)
{
    for (uint32_t l = 0; l < src->n_layer; l++) {
        kv_plane *d = &dst->planes[l];
        const kv_plane *s = &src->planes[l];
        uint16_t *k = d->k, *v = d->v;
        *d = *s;
        d->k = k;
        d->v = v;
        if (k && s->k) {
            memcpy(k, s->k, plane_elems(s) * sizeof(uint16_t));
            memcpy(v, s->v, plane_elems(s) * sizeof(uint16_t));
        }
    }
    dst->has_checkpoint = false;
}

uint64_t kv_cache_bytes(const muser_hparams *hp, uint64_t n_ctx)
{
    uint64_t rows = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        rows += muser_layer_is_swa(hp, l) ? hp->swa_window : n_ctx;
    return rows * hp->n_head_kv * hp->head_dim * 2 /* K, V */ * sizeof(uint16_t);
}
