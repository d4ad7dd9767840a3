/* fuzz_handoff.c — libFuzzer entry for the remote-prefill wire format after TLS (src/handoff/wire.c):
 * byte 0 picks what the rest is —
 *   0  a frame header;
 *   1  a request payload (as a producer of a 4096-token context and a vocabulary of 1000 reads it);
 *   2  a manifest payload, then checked against the request it would answer;
 *   3  a session as a consumer reads it: u32 manifest length, the manifest, then frames (header,
 *      payload, MAC) admitted one by one by the stream state machine (hx_stream_admit / take /
 *      complete), the MAC computed and compared for each (and the frame taken either way, so
 *      the fuzzer reaches the states a forged MAC would guard).
 * Checks (a failure aborts): whatever decodes re-encodes to the same bytes; counts and lengths are
 * within what the bytes and the bounds allow; the stream admits a frame only at a length the
 * manifest implies and never counts a tile twice; a complete stream saw every tile. ASan + UBSan
 * catch reads outside the input and leaks. */
#include "handoff/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_handoff: %s failed\n", #c);                                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static const uint8_t key[32] = "fuzz-handoff-hmac-key-0123456789";

static void header(const uint8_t *p, size_t n)
{
    if (n < HX_HEADER_BYTES) return;
    hx_header h;
    muser_error err = {0};
    if (hx_header_decode(p, &h, &err)) {
        CHECK(err.msg[0]);
        return;
    }
    uint8_t again[HX_HEADER_BYTES];
    hx_header_encode(&h, again);
    CHECK(!memcmp(again, p, HX_HEADER_BYTES));
}

static void request(const uint8_t *p, size_t n)
{
    hx_request r;
    muser_error err = {0};
    if (hx_request_decode(p, n, 4096, 1000, &r, &err)) {
        CHECK(err.msg[0] && r.tokens == NULL);
        return;
    }
    CHECK(r.n_tokens >= 1 && r.n_tokens <= 4096 && r.cut < r.n_tokens && n == hx_request_size(r.n_tokens));
    for (uint32_t i = 0; i < r.n_tokens; i++) CHECK(r.tokens[i] >= 0 && r.tokens[i] < 1000);
    uint8_t *again = malloc(n);
    hx_request_encode(&r, again);
    CHECK(!memcmp(again, p, n));
    free(again);
    hx_request_free(&r);
}

/* A decoded manifest's invariants, and its check against the request it would answer. */
static void manifest_checks(const hx_manifest *m, const uint8_t *p, size_t n)
{
    CHECK(n == hx_manifest_size(m->n_tokens, m->n_layer, m->n_tiles));
    CHECK(m->cut < m->n_tokens && m->tile_rows >= HX_TILE_ROWS_MIN && m->tile_rows <= HX_TILE_ROWS);
    for (uint32_t t = 0; t < m->n_tiles; t++) {
        const hx_tile *tl = &m->tiles[t];
        CHECK(tl->layer < m->n_layer && tl->n_rows >= 1 && tl->n_rows <= m->tile_rows);
        CHECK(tl->pos0 >= m->cut && tl->pos0 + tl->n_rows <= m->n_tokens);
        CHECK(hx_tile_bytes(&m->layers[tl->layer], tl->n_rows) <= HX_MAX_FRAME);
    }
    uint8_t *again = malloc(n);
    hx_manifest_encode(m, again);
    CHECK(!memcmp(again, p, n));
    free(again);
    /* the consumer's expectation: the same tokens and nonce (so the check reaches the layers and
     * the tile list), the geometry of a tiny model */
    hx_layer layers[8];
    for (uint32_t l = 0; l < 8; l++) layers[l] = (hx_layer){l % 4 != 3, 2, 32, l % 4 != 3 ? 16 : 0};
    hx_manifest want = *m;
    want.layers = layers;
    want.n_layer = 8;
    want.tiles = NULL;
    muser_error err = {0};
    if (!hx_manifest_check(m, &want, &err)) {
        CHECK(m->n_layer == 8 && m->n_tiles == hx_tiling(layers, 8, m->cut, m->n_tokens, m->tile_rows, NULL));
    } else {
        CHECK(err.msg[0]);
    }
}

static void manifest(const uint8_t *p, size_t n)
{
    hx_manifest m;
    muser_error err = {0};
    if (hx_manifest_decode(p, n, &m, &err)) {
        CHECK(err.msg[0] && m.tokens == NULL && m.tiles == NULL);
        return;
    }
    manifest_checks(&m, p, n);
    hx_manifest_free(&m);
}

static void session(const uint8_t *p, size_t n)
{
    if (n < 4) return;
    const uint32_t mlen = hx_get_u32(p);
    if (mlen > n - 4) return;
    hx_manifest m;
    muser_error err = {0};
    if (hx_manifest_decode(p + 4, mlen, &m, &err)) return;
    bool *seen = malloc(((size_t)m.n_tiles + 1) * sizeof *seen);
    hx_stream s;
    hx_stream_init(&s, &m, seen);
    const uint8_t *q = p + 4 + mlen, *end = p + n;
    char what[160];
    while (end - q >= (long)HX_HEADER_BYTES && !s.ended) {
        hx_header h;
        if (hx_header_decode(q, &h, &err)) break;
        const uint32_t before = s.n_seen;
        if (hx_stream_admit(&s, &h, what, sizeof what, &err)) {
            CHECK(err.msg[0] && what[0]);
            break;
        }
        if (h.type == HX_TILE) /* admitted: exactly the manifest's length, never twice */
            CHECK(!seen[h.index] && h.length == hx_tile_bytes(&m.layers[m.tiles[h.index].layer], m.tiles[h.index].n_rows));
        if (h.type == HX_LOGITS) CHECK(!seen[m.n_tiles] && h.length == m.n_vocab * sizeof(float));
        if ((uint64_t)(end - q) < HX_HEADER_BYTES + (uint64_t)h.length + HX_MAC_BYTES) break; /* a truncated stream */
        const uint8_t *payload = q + HX_HEADER_BYTES;
        (void)hx_mac_ok(key, sizeof key, m.session_id, q, payload, h.length, payload + h.length);
        hx_stream_take(&s, &h);
        CHECK(s.n_seen <= m.n_tiles + 1 && s.n_seen >= before);
        q = payload + h.length + HX_MAC_BYTES;
    }
    if (!hx_stream_complete(&s, &err))
        for (uint32_t t = 0; t <= m.n_tiles; t++) CHECK(seen[t]);
    free(seen);
    hx_manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    switch (data[0] & 3) {
    case 0: header(data + 1, size - 1); break;
    case 1: request(data + 1, size - 1); break;
    case 2: manifest(data + 1, size - 1); break;
    case 3: session(data + 1, size - 1); break;
    }
    return 0;
}
