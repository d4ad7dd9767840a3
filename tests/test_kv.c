/* test_kv.c — the KV planes of SPEC §3: zero fill, ring wrap-around mapping, head-major FULL
 * layout, discontinuity refused with nothing changed, context full, checkpoint + rollback
 * restoring every byte, commit, metadata-only planes, and the remote install's pieces: the shape
 * of n appends in closed form, rows read out token-major and planted back byte-identically. Values written are small integers, exact
 * in f16, so every stored element can be checked against the position that wrote it. */
#include "check.h"
#include "kv.h"
#include "util.h"

#include <string.h>

#define HKV 2
#define HD 4
#define ROW (HKV * HD)

/* 4 muse layers, pattern 4: layers 0..2 are SWA rings of W rows, layer 3 a FULL plane. */
static muser_hparams make_hp(uint32_t window)
{
    muser_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = MUSER_ARCH_MUSE;
    hp.n_layer = 4;
    hp.n_head_kv = HKV;
    hp.head_dim = HD;
    hp.n_head = 4;
    hp.swa_window = window;
    hp.swa_pattern = 4;
    return hp;
}

/* K element (h, d) of position p in layer l; V is its negative. Distinct within a plane and
 * exact in f16 (integers below 2048) for p < 200. */
static float kval(uint32_t l, uint64_t p, uint32_t h, uint32_t d)
{
    return (float)(p * HKV * HD + h * HD + d + 1 + l);
}

static int append_pos(muser_kv *kv, uint64_t p, muser_error *err)
{
    float k[ROW], v[ROW];
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t d = 0; d < HD; d++) {
                k[h * HD + d] = kval(l, p, h, d);
                v[h * HD + d] = -kval(l, p, h, d);
            }
        int rc = kv_plane_append(&kv->planes[l], p, k, v, err);
        if (rc)
            return rc;
    }
    return MUSER_OK;
}

static size_t plane_bytes(const kv_plane *pl)
{
    return (size_t)pl->capacity * ROW * sizeof(uint16_t);
}

static bool all_zero(const uint16_t *p, size_t bytes)
{
    for (size_t i = 0; i < bytes / 2; i++)
        if (p[i])
            return false;
    return true;
}

/* Same metadata and same bytes in every plane. */
static bool kv_equal(const muser_kv *a, const muser_kv *b)
{
    for (uint32_t l = 0; l < a->n_layer; l++) {
        const kv_plane *x = &a->planes[l], *y = &b->planes[l];
        if (x->ring != y->ring || x->capacity != y->capacity ||
            x->origin_logical != y->origin_logical || x->origin_physical != y->origin_physical ||
            x->len != y->len || x->next_pos != y->next_pos)
            return false;
        if (memcmp(x->k, y->k, plane_bytes(x)) || memcmp(x->v, y->v, plane_bytes(x)))
            return false;
    }
    return true;
}

/* A private copy of a cache's planes (storage and metadata) to compare against later. */
typedef struct snapshot {
    kv_plane meta[4];
    uint16_t *k[4], *v[4];
} snapshot;

static void snap_take(snapshot *s, const muser_kv *kv)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        s->meta[l] = kv->planes[l];
        s->k[l] = malloc(plane_bytes(&kv->planes[l]));
        s->v[l] = malloc(plane_bytes(&kv->planes[l]));
        memcpy(s->k[l], kv->planes[l].k, plane_bytes(&kv->planes[l]));
        memcpy(s->v[l], kv->planes[l].v, plane_bytes(&kv->planes[l]));
    }
}

static bool snap_equal(const snapshot *s, const muser_kv *kv)
{
    for (uint32_t l = 0; l < kv->n_layer; l++) {
        const kv_plane *p = &kv->planes[l], *m = &s->meta[l];
        if (p->origin_logical != m->origin_logical || p->origin_physical != m->origin_physical ||
            p->len != m->len || p->next_pos != m->next_pos)
            return false;
        if (memcmp(s->k[l], p->k, plane_bytes(p)) || memcmp(s->v[l], p->v, plane_bytes(p)))
            return false;
    }
    return true;
}

static void snap_free(snapshot *s, uint32_t n)
{
    for (uint32_t l = 0; l < n; l++) {
        free(s->k[l]);
        free(s->v[l]);
    }
}

static void test_layout_and_wrap(void)
{
    muser_error err = {0};
    muser_hparams hp = make_hp(5);
    muser_kv kv;
    CHECK_OK(kv_init(&kv, &hp, 32, true, &err), &err);
    CHECK(kv.planes[0].ring && kv.planes[1].ring && kv.planes[2].ring && !kv.planes[3].ring);
    CHECK(kv.planes[0].capacity == 5 && kv.planes[3].capacity == 32);
    for (uint32_t l = 0; l < 4; l++) /* zero fill */
        CHECK(all_zero(kv.planes[l].k, plane_bytes(&kv.planes[l])) &&
              all_zero(kv.planes[l].v, plane_bytes(&kv.planes[l])));
    CHECK(kv_plane_first_pos(&kv.planes[0]) == 0);

    for (uint64_t p = 0; p < 13; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);

    const kv_plane *ring = &kv.planes[1];
    CHECKF(ring->len == 5 && ring->next_pos == 13, "len %llu next %llu",
           (unsigned long long)ring->len, (unsigned long long)ring->next_pos);
    CHECKF(ring->origin_logical == 8 && ring->origin_physical == 3, "origin %llu @ %llu",
           (unsigned long long)ring->origin_logical, (unsigned long long)ring->origin_physical);
    CHECK(kv_plane_first_pos(ring) == 8);
    for (uint64_t p = 8; p < 13; p++) {
        CHECK(kv_plane_row(ring, p) == p % 5);
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t d = 0; d < HD; d++) {
                /* token-major raw layout: row (p mod 5), then head, then dim */
                float raw = muser_f16_to_f32(ring->k[(p % 5) * ROW + h * HD + d]);
                CHECKF(raw == kval(1, p, h, d), "ring raw p %llu h %u d %u: %g",
                       (unsigned long long)p, h, d, raw);
                CHECK(muser_f16_to_f32(kv_plane_k(ring, h, p)[d]) == kval(1, p, h, d));
                CHECK(muser_f16_to_f32(kv_plane_v(ring, h, p)[d]) == -kval(1, p, h, d));
            }
    }

    const kv_plane *full = &kv.planes[3];
    CHECK(full->len == 13 && full->next_pos == 13 && kv_plane_first_pos(full) == 0);
    for (uint64_t p = 0; p < 13; p++)
        for (uint32_t h = 0; h < HKV; h++)
            for (uint32_t d = 0; d < HD; d++) {
                /* head-major raw layout: head, then position, then dim */
                float raw = muser_f16_to_f32(full->k[(h * 32 + p) * HD + d]);
                CHECK(raw == kval(3, p, h, d));
                CHECK(muser_f16_to_f32(kv_plane_v(full, h, p)[d]) == -kval(3, p, h, d));
            }
    /* Rows beyond the last position are still zero. */
    CHECK(all_zero(full->k + 13 * HD, (32 - 13) * HD * 2));

    kv_reset(&kv);
    CHECK(kv.planes[1].next_pos == 0 && kv.planes[1].len == 0 && kv.planes[1].origin_logical == 0);
    CHECK(all_zero(kv.planes[1].k, plane_bytes(&kv.planes[1])));
    CHECK(all_zero(kv.planes[3].v, plane_bytes(&kv.planes[3])));
    kv_free(&kv);
}

static void test_discontinuity_and_full(void)
{
    muser_error err = {0};
    muser_hparams hp = make_hp(5);
    muser_kv kv;
    CHECK_OK(kv_init(&kv, &hp, 8, true, &err), &err);
    for (uint64_t p = 0; p < 7; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    snapshot s;
    snap_take(&s, &kv);
    float k[ROW] = {7}, v[ROW] = {7};
    const uint64_t bad[] = {0, 6, 8, 100};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (uint32_t l = 0; l < 4; l++) {
            int rc = kv_plane_append(&kv.planes[l], bad[i], k, v, &err);
            CHECKF(rc == MUSER_E_CACHE_DISCONTINUITY, "pos %llu layer %u: rc %d",
                   (unsigned long long)bad[i], l, rc);
        }
    CHECK(snap_equal(&s, &kv));
    CHECK(strstr(err.msg, "accepts only 7") != NULL);

    CHECK_OK(append_pos(&kv, 7, &err), &err); /* the last position the context holds */
    snap_free(&s, 4);
    snap_take(&s, &kv);
    int rc = kv_plane_append(&kv.planes[3], 8, k, v, &err);
    CHECKF(rc == MUSER_E_CONTEXT_FULL, "rc %d", rc);
    CHECK(snap_equal(&s, &kv));
    /* A ring never fills: it keeps the last W positions. */
    CHECK_OK(kv_plane_append(&kv.planes[0], 8, k, v, &err), &err);
    CHECK(kv.planes[0].origin_logical == 4 && kv.planes[0].len == 5);
    snap_free(&s, 4);
    kv_free(&kv);
}

/* Checkpoint at `start`, write `block` rows, roll back to keep positions < n_keep; the cache
 * must equal one that simply appended 0..n_keep-1 (every byte, every metadata field). */
static void rollback_case(uint32_t window, uint64_t start, uint64_t block, uint64_t n_keep)
{
    muser_error err = {0};
    muser_hparams hp = make_hp(window);
    muser_kv kv, ref;
    CHECK_OK(kv_init(&kv, &hp, 64, true, &err), &err);
    CHECK_OK(kv_init(&ref, &hp, 64, true, &err), &err);
    for (uint64_t p = 0; p < start; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    for (uint64_t p = 0; p < n_keep; p++)
        CHECK_OK(append_pos(&ref, p, &err), &err);
    CHECK_OK(kv_checkpoint(&kv, &err), &err);
    for (uint64_t p = start; p < start + block; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    CHECK_OK(kv_rollback(&kv, n_keep, &err), &err);
    CHECKF(kv_equal(&kv, &ref), "W %u start %llu block %llu keep %llu", window,
           (unsigned long long)start, (unsigned long long)block, (unsigned long long)n_keep);
    CHECK(!kv.has_checkpoint);
    /* The rolled-back cache carries on like the reference. */
    CHECK_OK(append_pos(&kv, n_keep, &err), &err);
    CHECK_OK(append_pos(&ref, n_keep, &err), &err);
    CHECK(kv_equal(&kv, &ref));
    kv_free(&kv);
    kv_free(&ref);
}

static void test_checkpoint_rollback(void)
{
    /* Whole-block rejection, partial acceptance, full acceptance; before and after the ring
     * wraps; the tiny preset's shape (W 16, block 16). */
    rollback_case(5, 13, 4, 13);
    rollback_case(5, 13, 4, 15);
    rollback_case(5, 13, 4, 17);
    rollback_case(5, 2, 3, 3);
    rollback_case(16, 0, 16, 0);
    rollback_case(16, 20, 16, 20);
    rollback_case(16, 20, 16, 29);
    rollback_case(16, 7, 16, 22);
    rollback_case(5, 13, 5, 14);

    muser_error err = {0};
    muser_hparams hp = make_hp(5);
    muser_kv kv;
    CHECK_OK(kv_init(&kv, &hp, 64, true, &err), &err);
    CHECK(kv_rollback(&kv, 0, &err) == MUSER_E_ARG); /* no checkpoint */
    for (uint64_t p = 0; p < 9; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    CHECK_OK(kv_checkpoint(&kv, &err), &err);
    for (uint64_t p = 9; p < 12; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    snapshot s;
    snap_take(&s, &kv);
    CHECK(kv_rollback(&kv, 8, &err) == MUSER_E_ARG);  /* before the checkpoint */
    CHECK(kv_rollback(&kv, 13, &err) == MUSER_E_ARG); /* after the current position */
    CHECK(snap_equal(&s, &kv) && kv.has_checkpoint);

    /* Commit keeps everything written and drops the checkpoint. */
    kv_commit(&kv);
    CHECK(!kv.has_checkpoint && snap_equal(&s, &kv));
    CHECK(kv_rollback(&kv, 9, &err) == MUSER_E_ARG);
    snap_free(&s, 4);

    /* A block of more rows than the 5-row ring cannot be undone partially: refused, unchanged. */
    CHECK_OK(kv_checkpoint(&kv, &err), &err);
    for (uint64_t p = 12; p < 19; p++)
        CHECK_OK(append_pos(&kv, p, &err), &err);
    snap_take(&s, &kv);
    CHECK(kv_rollback(&kv, 14, &err) == MUSER_E_ARG);
    CHECK(snap_equal(&s, &kv));
    CHECK_OK(kv_rollback(&kv, 19, &err), &err); /* keeping all of it is fine */
    CHECK(snap_equal(&s, &kv));
    snap_free(&s, 4);
    kv_free(&kv);
}

static void test_metadata_only(void)
{
    muser_error err = {0};
    muser_hparams hp = make_hp(5);
    muser_kv kv;
    CHECK_OK(kv_init(&kv, &hp, 16, false, &err), &err);
    CHECK(kv.planes[0].k == NULL && kv.planes[3].v == NULL);
    for (uint64_t p = 0; p < 11; p++)
        for (uint32_t l = 0; l < 4; l++)
            CHECK_OK(kv_plane_append(&kv.planes[l], p, NULL, NULL, &err), &err);
    CHECK(kv.planes[0].origin_logical == 6 && kv.planes[0].origin_physical == 1);
    CHECK_OK(kv_checkpoint(&kv, &err), &err);
    for (uint32_t l = 0; l < 4; l++)
        CHECK_OK(kv_plane_append(&kv.planes[l], 11, NULL, NULL, &err), &err);
    CHECK_OK(kv_rollback(&kv, 11, &err), &err);
    CHECK(kv.planes[0].origin_logical == 6 && kv.planes[0].next_pos == 11);
    CHECK(kv.planes[3].len == 11);
    kv_free(&kv);
}

/* kv_undo: a call of n rows saved up front, any number of appends (wrapping the 8-row ring
 * several times over), then restore -> the whole cache is byte-identical to before the call. */
static void test_call_undo(void)
{
    const uint32_t starts[] = {0, 5, 8, 13};
    const uint32_t calls[] = {1, 3, 8, 9, 20};
    for (size_t a = 0; a < sizeof starts / sizeof starts[0]; a++)
        for (size_t b = 0; b < sizeof calls / sizeof calls[0]; b++) {
            muser_hparams hp = make_hp(8);
            muser_kv kv;
            kv_undo u;
            muser_error err = {0};
            CHECK_OK(kv_init(&kv, &hp, 64, true, &err), &err);
            CHECK_OK(kv_undo_init(&u, &kv, &err), &err);
            for (uint64_t p = 0; p < starts[a]; p++)
                CHECK_OK(append_pos(&kv, p, &err), &err);
            snapshot before;
            snap_take(&before, &kv);
            kv_undo_save(&u, &kv, calls[b]);
            for (uint64_t p = starts[a]; p < starts[a] + calls[b]; p++)
                CHECK_OK(append_pos(&kv, p, &err), &err);
            CHECKF(calls[b] == 0 || !snap_equal(&before, &kv), "start %u call %u: no change?",
                   starts[a], calls[b]);
            kv_undo_restore(&u, &kv);
            CHECKF(snap_equal(&before, &kv), "start %u, call of %u rows: restore differs",
                   starts[a], calls[b]);
            /* and the cache goes on as if the call never happened */
            CHECK_OK(append_pos(&kv, starts[a], &err), &err);
            snap_free(&before, kv.n_layer);
            kv_undo_free(&u);
            kv_free(&kv);
        }
}

/* kv_plane_meta_after(n) is the metadata n appends leave, before and well past the ring's wrap;
 * rows read token-major from a built cache and imported into an empty one at that shape, in
 * uneven pieces, give the same bytes everywhere (the ring's slots at origin mod capacity); a
 * warm prefix [0, cut) copied first and only [cut, n) imported gives them too. */
static void test_meta_and_import(void)
{
    const uint64_t lens[] = {0, 1, 4, 5, 6, 13, 37};
    const uint64_t cuts[] = {0, 3, 9};
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            const uint64_t n = lens[a], cut = cuts[c] < n ? cuts[c] : 0;
            muser_hparams hp = make_hp(5);
            muser_kv ref, warm, got;
            muser_error err = {0};
            CHECK_OK(kv_init(&ref, &hp, 64, true, &err), &err);
            CHECK_OK(kv_init(&warm, &hp, 64, true, &err), &err);
            CHECK_OK(kv_init(&got, &hp, 64, true, &err), &err);
            for (uint64_t p = 0; p < n; p++)
                CHECK_OK(append_pos(&ref, p, &err), &err);
            for (uint64_t p = 0; p < cut; p++)
                CHECK_OK(append_pos(&warm, p, &err), &err);
            kv_copy(&got, &warm);
            for (uint32_t l = 0; l < 4; l++) {
                kv_plane shape;
                kv_plane_shape(&shape, &hp, l, 64);
                kv_plane_meta_after(&shape, n);
                const kv_plane *r = &ref.planes[l];
                CHECKF(shape.len == r->len && shape.next_pos == r->next_pos && shape.origin_logical == r->origin_logical &&
                           shape.origin_physical == r->origin_physical && shape.capacity == r->capacity,
                       "layer %u after %llu appends", l, (unsigned long long)n);
                /* the rows past the warm prefix that the plane still holds, in pieces of 1, 2, 3, ... */
                const uint64_t first = kv_plane_first_pos(&shape) > cut ? kv_plane_first_pos(&shape) : cut;
                uint16_t k[37 * ROW], v[37 * ROW];
                for (uint64_t p = first, piece = 1; p < n; p += piece, piece++) {
                    const uint64_t m = n - p < piece ? n - p : piece;
                    kv_plane_read_rows(r, p, m, k, v);
                    CHECK(muser_f16_to_f32(k[0]) == kval(l, p, 0, 0) && muser_f16_to_f32(v[ROW * m - 1]) == -kval(l, p + m - 1, HKV - 1, HD - 1));
                    kv_plane_import(&got.planes[l], &shape, p, m, k, v);
                }
                kv_plane_import(&got.planes[l], &shape, 0, 0, NULL, NULL); /* metadata only, for n == cut */
            }
            CHECKF(kv_equal(&got, &ref), "n %llu from cut %llu: the imported cache differs", (unsigned long long)n,
                   (unsigned long long)cut);
            kv_free(&ref);
            kv_free(&warm);
            kv_free(&got);
        }
}

int main(void)
{
    test_layout_and_wrap();
    test_discontinuity_and_full();
    test_checkpoint_rollback();
    test_metadata_only();
    test_call_undo();
    test_meta_and_import();
    return check_report("kv");
}
