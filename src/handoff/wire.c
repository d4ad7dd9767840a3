/* wire.c — the remote-prefill codec of wire.h: headers, MACs, the request, the manifest and the
 * tiling. Every decoder checks the exact length its counts imply before it allocates, so no
 * input can make it allocate more than the bytes it was given justify. */
#include "handoff/wire.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hx_header_encode(const hx_header *h, uint8_t out[HX_HEADER_BYTES])
{
    hx_put_u32(out, HX_MAGIC);
    out[4] = (uint8_t)h->type;
    out[5] = (uint8_t)(h->type >> 8);
    out[6] = (uint8_t)h->flags;
    out[7] = (uint8_t)(h->flags >> 8);
    hx_put_u32(out + 8, h->index);
    hx_put_u32(out + 12, h->length);
}

const char *hx_type_name(uint32_t type)
{
    static const char *const names[] = {"?", "request", "manifest", "tile", "logits", "progress", "end", "refusal"};
    return type < sizeof names / sizeof names[0] ? names[type] : "?";
}

int hx_header_decode(const uint8_t in[HX_HEADER_BYTES], hx_header *h, muser_error *err)
{
    const uint32_t magic = hx_get_u32(in);
    if (magic != HX_MAGIC)
        return muser_errorf(err, MUSER_E_FORMAT, "not a handoff frame (magic %08x, want %08x)", magic, HX_MAGIC);
    h->type = (uint16_t)(in[4] | in[5] << 8);
    h->flags = (uint16_t)(in[6] | in[7] << 8);
    h->index = hx_get_u32(in + 8);
    h->length = hx_get_u32(in + 12);
    if (h->type < HX_REQUEST || h->type > HX_REFUSE)
        return muser_errorf(err, MUSER_E_FORMAT, "unknown frame type %u", h->type);
    if (h->flags)
        return muser_errorf(err, MUSER_E_FORMAT, "%s frame with flags %04x (none are defined)", hx_type_name(h->type),
                            h->flags);
    return MUSER_OK;
}

void hx_mac(const uint8_t *key, size_t key_len, const uint8_t sid[HX_ID_BYTES], const uint8_t hdr[HX_HEADER_BYTES],
            const uint8_t *payload, size_t len, uint8_t out[HX_MAC_BYTES])
{
    memset(out, 0, HX_MAC_BYTES);
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t got = 0;
    /* a failure leaves the zero MAC, which no sender's frame carries by chance: the frame is refused */
    if (c && EVP_MAC_init(c, key, key_len, params) == 1 && EVP_MAC_update(c, sid, HX_ID_BYTES) == 1 &&
        EVP_MAC_update(c, hdr, HX_HEADER_BYTES) == 1 && (!len || EVP_MAC_update(c, payload, len) == 1))
        EVP_MAC_final(c, out, &got, HX_MAC_BYTES);
    EVP_MAC_CTX_free(c);
    EVP_MAC_free(mac);
}

bool hx_mac_ok(const uint8_t *key, size_t key_len, const uint8_t sid[HX_ID_BYTES], const uint8_t hdr[HX_HEADER_BYTES],
               const uint8_t *payload, size_t len, const uint8_t mac[HX_MAC_BYTES])
{
    uint8_t want[HX_MAC_BYTES], zero[HX_MAC_BYTES] = {0};
    hx_mac(key, key_len, sid, hdr, payload, len, want);
    return CRYPTO_memcmp(want, zero, HX_MAC_BYTES) != 0 && CRYPTO_memcmp(want, mac, HX_MAC_BYTES) == 0;
}

uint64_t hx_tile_bytes(const hx_layer *ly, uint32_t n_rows)
{
    return 2ull * n_rows * ly->n_head_kv * ly->head_dim * sizeof(uint16_t);
}

/* Tiles of rows [start, n) of layer l, tile_rows each but the last. */
static uint32_t tile_range(uint32_t l, uint64_t start, uint64_t n, uint32_t tile_rows, hx_tile *out, uint32_t k)
{
    for (uint64_t a = start; a < n; a += tile_rows, k++)
        if (out)
            out[k] = (hx_tile){.layer = l, .n_rows = (uint32_t)(n - a < tile_rows ? n - a : tile_rows), .pos0 = a};
    return k;
}

uint32_t hx_tiling(const hx_layer *layers, uint32_t n_layer, uint64_t cut, uint64_t n, uint32_t tile_rows,
                   hx_tile *out)
{
    uint32_t k = 0;
    for (uint64_t a = cut; a < n; a += tile_rows) /* FULL layers, chunk-major */
        for (uint32_t l = 0; l < n_layer; l++)
            if (!layers[l].ring)
                k = tile_range(l, a, a + tile_rows < n ? a + tile_rows : n, tile_rows, out, k);
    for (uint32_t l = 0; l < n_layer; l++)
        if (layers[l].ring) {
            const uint64_t w = layers[l].window, start = n > w && n - w > cut ? n - w : cut;
            k = tile_range(l, start, n, tile_rows, out, k);
        }
    return k;
}

void hx_hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

/* ---- the request ---- */

uint64_t hx_request_size(uint32_t n_tokens)
{
    return HX_REQUEST_FIXED + 4ull * n_tokens;
}

void hx_request_encode(const hx_request *r, uint8_t *out)
{
    hx_put_u32(out, r->version);
    memcpy(out + 4, r->nonce, HX_ID_BYTES);
    memcpy(out + 20, r->model_id, HX_MODEL_ID_BYTES);
    hx_put_u64(out + 52, r->cut);
    hx_put_u32(out + 60, r->n_tokens);
    for (uint32_t i = 0; i < r->n_tokens; i++)
        hx_put_u32(out + HX_REQUEST_FIXED + 4ull * i, (uint32_t)r->tokens[i]);
}

int hx_request_decode(const uint8_t *p, size_t len, uint32_t max_tokens, uint32_t n_vocab, hx_request *r,
                      muser_error *err)
{
    memset(r, 0, sizeof *r);
    if (len < HX_REQUEST_FIXED)
        return muser_errorf(err, MUSER_E_FORMAT, "request of %zu bytes: shorter than its %u fixed bytes", len,
                            HX_REQUEST_FIXED);
    r->version = hx_get_u32(p);
    memcpy(r->nonce, p + 4, HX_ID_BYTES);
    memcpy(r->model_id, p + 20, HX_MODEL_ID_BYTES);
    r->cut = hx_get_u64(p + 52);
    r->n_tokens = hx_get_u32(p + 60);
    if (r->version != HX_VERSION)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "request of protocol version %u; this producer speaks %u",
                            r->version, HX_VERSION);
    if (r->n_tokens == 0 || r->n_tokens > max_tokens)
        return muser_errorf(err, MUSER_E_ARG, "request for %u tokens (this producer takes 1..%u)", r->n_tokens,
                            max_tokens);
    if (len != hx_request_size(r->n_tokens))
        return muser_errorf(err, MUSER_E_FORMAT, "request of %zu bytes for %u tokens (want %llu)", len, r->n_tokens,
                            (unsigned long long)hx_request_size(r->n_tokens));
    if (r->cut >= r->n_tokens)
        return muser_errorf(err, MUSER_E_ARG, "request with a warm prefix of %llu of its %u tokens: nothing to send",
                            (unsigned long long)r->cut, r->n_tokens);
    r->tokens = malloc((size_t)r->n_tokens * sizeof *r->tokens);
    if (!r->tokens)
        return muser_errorf(err, MUSER_E_NOMEM, "request: out of memory for %u tokens", r->n_tokens);
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        const uint32_t t = hx_get_u32(p + HX_REQUEST_FIXED + 4ull * i);
        if (t >= n_vocab) {
            hx_request_free(r);
            return muser_errorf(err, MUSER_E_ARG, "request: token %u at index %u is not in [0, %u)", t, i, n_vocab);
        }
        r->tokens[i] = (int32_t)t;
    }
    return MUSER_OK;
}

void hx_request_free(hx_request *r)
{
    free(r->tokens);
    r->tokens = NULL;
}

/* ---- the manifest ---- */

uint64_t hx_manifest_size(uint32_t n_tokens, uint32_t n_layer, uint32_t n_tiles)
{
    return HX_MANIFEST_FIXED + 4ull * n_tokens + 16ull * n_layer + 16ull * n_tiles;
}

uint64_t hx_manifest_bound(uint32_t n_tokens, uint32_t n_layer)
{
    const uint64_t per_layer = (n_tokens + HX_TILE_ROWS_MIN - 1) / HX_TILE_ROWS_MIN;
    return HX_MANIFEST_FIXED + 4ull * n_tokens + 16ull * n_layer + 16ull * n_layer * per_layer;
}

void hx_manifest_encode(const hx_manifest *m, uint8_t *out)
{
    hx_put_u32(out, m->version);
    memcpy(out + 4, m->session_id, HX_ID_BYTES);
    memcpy(out + 20, m->nonce, HX_ID_BYTES);
    memcpy(out + 36, m->model_id, HX_MODEL_ID_BYTES);
    hx_put_u64(out + 68, m->cut);
    hx_put_u32(out + 76, m->n_tokens);
    hx_put_u32(out + 80, m->tile_rows);
    hx_put_u32(out + 84, m->n_layer);
    hx_put_u32(out + 88, m->n_vocab);
    hx_put_u32(out + 92, m->n_tiles);
    uint8_t *p = out + HX_MANIFEST_FIXED;
    for (uint32_t i = 0; i < m->n_tokens; i++, p += 4)
        hx_put_u32(p, (uint32_t)m->tokens[i]);
    for (uint32_t l = 0; l < m->n_layer; l++, p += 16) {
        hx_put_u32(p, m->layers[l].ring);
        hx_put_u32(p + 4, m->layers[l].n_head_kv);
        hx_put_u32(p + 8, m->layers[l].head_dim);
        hx_put_u32(p + 12, m->layers[l].window);
    }
    for (uint32_t t = 0; t < m->n_tiles; t++, p += 16) {
        hx_put_u32(p, m->tiles[t].layer);
        hx_put_u32(p + 4, m->tiles[t].n_rows);
        hx_put_u64(p + 8, m->tiles[t].pos0);
    }
}

int hx_manifest_decode(const uint8_t *p, size_t len, hx_manifest *m, muser_error *err)
{
    memset(m, 0, sizeof *m);
    if (len < HX_MANIFEST_FIXED)
        return muser_errorf(err, MUSER_E_FORMAT, "manifest of %zu bytes: shorter than its %u fixed bytes", len,
                            HX_MANIFEST_FIXED);
    m->version = hx_get_u32(p);
    memcpy(m->session_id, p + 4, HX_ID_BYTES);
    memcpy(m->nonce, p + 20, HX_ID_BYTES);
    memcpy(m->model_id, p + 36, HX_MODEL_ID_BYTES);
    m->cut = hx_get_u64(p + 68);
    m->n_tokens = hx_get_u32(p + 76);
    m->tile_rows = hx_get_u32(p + 80);
    m->n_layer = hx_get_u32(p + 84);
    m->n_vocab = hx_get_u32(p + 88);
    m->n_tiles = hx_get_u32(p + 92);
    if (m->version != HX_VERSION)
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "manifest of protocol version %u; this consumer speaks %u",
                            m->version, HX_VERSION);
    if (m->n_tokens == 0 || m->n_tokens > HX_MAX_TOKENS || m->n_layer == 0 || m->n_layer > HX_MAX_LAYERS ||
        m->n_vocab == 0 || m->n_vocab > HX_MAX_VOCAB || m->tile_rows < HX_TILE_ROWS_MIN || m->tile_rows > HX_TILE_ROWS)
        return muser_errorf(err, MUSER_E_FORMAT,
                            "manifest counts out of range: %u tokens, %u layers, vocabulary %u, tiles of %u rows",
                            m->n_tokens, m->n_layer, m->n_vocab, m->tile_rows);
    if (m->cut >= m->n_tokens)
        return muser_errorf(err, MUSER_E_FORMAT, "manifest with a warm prefix of %llu of its %u tokens",
                            (unsigned long long)m->cut, m->n_tokens);
    if (m->n_tiles > hx_manifest_bound(m->n_tokens, m->n_layer) / 16 || len != hx_manifest_size(m->n_tokens, m->n_layer, m->n_tiles))
        return muser_errorf(err, MUSER_E_FORMAT, "manifest of %zu bytes for %u tokens, %u layers and %u tiles (want %llu)",
                            len, m->n_tokens, m->n_layer, m->n_tiles,
                            (unsigned long long)hx_manifest_size(m->n_tokens, m->n_layer, m->n_tiles));
    m->tokens = malloc((size_t)m->n_tokens * sizeof *m->tokens);
    m->layers = malloc((size_t)m->n_layer * sizeof *m->layers);
    m->tiles = malloc(((size_t)m->n_tiles + 1) * sizeof *m->tiles);
    if (!m->tokens || !m->layers || !m->tiles) {
        hx_manifest_free(m);
        return muser_errorf(err, MUSER_E_NOMEM, "manifest: out of memory");
    }
    const uint8_t *q = p + HX_MANIFEST_FIXED;
    for (uint32_t i = 0; i < m->n_tokens; i++, q += 4)
        m->tokens[i] = (int32_t)hx_get_u32(q);
    int rc = MUSER_OK;
    for (uint32_t l = 0; l < m->n_layer && !rc; l++, q += 16) {
        hx_layer *ly = &m->layers[l];
        *ly = (hx_layer){hx_get_u32(q), hx_get_u32(q + 4), hx_get_u32(q + 8), hx_get_u32(q + 12)};
        if (ly->ring > 1 || !ly->n_head_kv || !ly->head_dim || (uint64_t)ly->n_head_kv * ly->head_dim > HX_MAX_ROW_ELEMS ||
            (ly->ring ? ly->window == 0 : ly->window != 0))
            rc = muser_errorf(err, MUSER_E_FORMAT, "manifest layer %u: kind %u, %u KV heads of %u, window %u", l,
                              ly->ring, ly->n_head_kv, ly->head_dim, ly->window);
    }
    for (uint32_t t = 0; t < m->n_tiles && !rc; t++, q += 16) {
        hx_tile *tl = &m->tiles[t];
        *tl = (hx_tile){.layer = hx_get_u32(q), .n_rows = hx_get_u32(q + 4), .pos0 = hx_get_u64(q + 8)};
        if (tl->layer >= m->n_layer || tl->n_rows == 0 || tl->n_rows > m->tile_rows || tl->pos0 < m->cut ||
            tl->pos0 >= m->n_tokens || tl->n_rows > m->n_tokens - tl->pos0 ||
            hx_tile_bytes(&m->layers[tl->layer], tl->n_rows) > HX_MAX_FRAME)
            rc = muser_errorf(err, MUSER_E_FORMAT, "manifest tile %u: layer %u, %u rows at %llu", t, tl->layer,
                              tl->n_rows, (unsigned long long)tl->pos0);
    }
    if (rc)
        hx_manifest_free(m);
    return rc;
}

static bool layer_eq(const hx_layer *a, const hx_layer *b)
{
    return a->ring == b->ring && a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim && a->window == b->window;
}

int hx_manifest_check(const hx_manifest *got, const hx_manifest *want, muser_error *err)
{
    char a[2 * HX_MODEL_ID_BYTES + 1], b[2 * HX_MODEL_ID_BYTES + 1];
    if (memcmp(got->model_id, want->model_id, HX_MODEL_ID_BYTES)) {
        hx_hex(got->model_id, 8, a);
        hx_hex(want->model_id, 8, b);
        return muser_errorf(err, MUSER_E_ARG, "wrong model: the producer's is %s..., ours %s... (the files' SHA-256 differ)", a, b);
    }
    if (memcmp(got->nonce, want->nonce, HX_ID_BYTES))
        return muser_errorf(err, MUSER_E_ARG, "the manifest answers another request (its nonce is not ours)");
    if (got->n_tokens != want->n_tokens || got->cut != want->cut ||
        memcmp(got->tokens, want->tokens, (size_t)want->n_tokens * sizeof *want->tokens))
        return muser_errorf(err, MUSER_E_ARG, "the manifest lists other tokens (%u from %llu; we asked for %u from %llu)",
                            got->n_tokens, (unsigned long long)got->cut, want->n_tokens, (unsigned long long)want->cut);
    if (got->n_vocab != want->n_vocab || got->n_layer != want->n_layer)
        return muser_errorf(err, MUSER_E_ARG, "the manifest's model has %u layers and a vocabulary of %u; ours %u and %u",
                            got->n_layer, got->n_vocab, want->n_layer, want->n_vocab);
    for (uint32_t l = 0; l < want->n_layer; l++)
        if (!layer_eq(&got->layers[l], &want->layers[l]))
            return muser_errorf(err, MUSER_E_ARG, "manifest layer %u: %s of %u x %u, window %u; ours %s of %u x %u, window %u", l,
                                got->layers[l].ring ? "ring" : "FULL", got->layers[l].n_head_kv, got->layers[l].head_dim,
                                got->layers[l].window, want->layers[l].ring ? "ring" : "FULL",
                                want->layers[l].n_head_kv, want->layers[l].head_dim, want->layers[l].window);
    /* the tile list must be the tiling of exactly the rows a local prefill leaves past the warm
     * prefix: every expected row listed once, nothing else */
    const uint32_t n = hx_tiling(want->layers, want->n_layer, want->cut, want->n_tokens, got->tile_rows, NULL);
    if (got->n_tiles != n)
        return muser_errorf(err, MUSER_E_ARG, "the manifest lists %u tiles; tiles of %u rows make %u", got->n_tiles,
                            got->tile_rows, n);
    hx_tile *t = malloc(((size_t)n + 1) * sizeof *t);
    if (!t)
        return muser_errorf(err, MUSER_E_NOMEM, "manifest check: out of memory");
    hx_tiling(want->layers, want->n_layer, want->cut, want->n_tokens, got->tile_rows, t);
    int rc = MUSER_OK;
    for (uint32_t i = 0; i < n && !rc; i++)
        if (got->tiles[i].layer != t[i].layer || got->tiles[i].n_rows != t[i].n_rows || got->tiles[i].pos0 != t[i].pos0)
            rc = muser_errorf(err, MUSER_E_ARG, "manifest tile %u is layer %u, %u rows at %llu; want layer %u, %u rows at %llu",
                              i, got->tiles[i].layer, got->tiles[i].n_rows, (unsigned long long)got->tiles[i].pos0,
                              t[i].layer, t[i].n_rows, (unsigned long long)t[i].pos0);
    free(t);
    return rc;
}

void hx_manifest_free(hx_manifest *m)
{
    free(m->tokens);
    free(m->layers);
    free(m->tiles);
    m->tokens = NULL;
    m->layers = NULL;
    m->tiles = NULL;
}

uint64_t hx_manifest_max_payload(const hx_manifest *m)
{
    uint64_t most = (uint64_t)m->n_vocab * sizeof(float);
    for (uint32_t t = 0; t < m->n_tiles; t++) {
        const uint64_t b = hx_tile_bytes(&m->layers[m->tiles[t].layer], m->tiles[t].n_rows);
        most = b > most ? b : most;
    }
    return most;
}

/* ---- the stream after the manifest ---- */

void hx_stream_init(hx_stream *s, const hx_manifest *m, bool *seen)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->seen = seen;
    memset(seen, 0, ((size_t)m->n_tiles + 1) * sizeof *seen);
    s->max_progress = (uint32_t)(m->cut / HX_TILE_ROWS_MIN) + 2;
}

int hx_stream_admit(const hx_stream *s, const hx_header *h, char *what, size_t cap, muser_error *err)
{
    const hx_manifest *m = s->m;
    snprintf(what, cap, "a %s frame", hx_type_name(h->type));
    if (s->ended)
        return muser_errorf(err, MUSER_E_FORMAT, "%s after the end frame", what);
    switch (h->type) {
    case HX_TILE: {
        if (h->index >= m->n_tiles)
            return muser_errorf(err, MUSER_E_FORMAT, "tile %u: the manifest lists %u", h->index, m->n_tiles);
        const hx_tile *tl = &m->tiles[h->index];
        const uint64_t want = hx_tile_bytes(&m->layers[tl->layer], tl->n_rows);
        snprintf(what, cap, "tile %u (layer %u, positions %llu..%llu)", h->index, tl->layer, (unsigned long long)tl->pos0,
                 (unsigned long long)(tl->pos0 + tl->n_rows));
        if (s->seen[h->index])
            return muser_errorf(err, MUSER_E_FORMAT, "%s arrived twice", what);
        if (h->length != want)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: a frame of %u bytes; the manifest says %llu", what, h->length,
                                (unsigned long long)want);
        return MUSER_OK;
    }
    case HX_LOGITS:
        snprintf(what, cap, "the logits row");
        if (h->index != m->n_tiles || s->seen[m->n_tiles] || h->length != (uint64_t)m->n_vocab * sizeof(float))
            return muser_errorf(err, MUSER_E_FORMAT, "a logits frame %u of %u bytes (%s; want index %u, %llu bytes)",
                                h->index, h->length, s->seen[m->n_tiles] ? "a second one" : "not the manifest's",
                                m->n_tiles, (unsigned long long)m->n_vocab * sizeof(float));
        return MUSER_OK;
    case HX_PROGRESS:
        snprintf(what, cap, "progress frame %u", h->index);
        if (h->index != s->n_progress || h->length != 8 || s->n_progress >= s->max_progress)
            return muser_errorf(err, MUSER_E_FORMAT, "progress frame %u of %u bytes (want %u, 8 bytes, at most %u)", h->index,
                                h->length, s->n_progress, s->max_progress);
        return MUSER_OK;
    case HX_END:
        snprintf(what, cap, "the end frame");
        if (h->index != m->n_tiles + 1 || h->length != 0)
            return muser_errorf(err, MUSER_E_FORMAT, "an end frame %u of %u bytes (want %u, empty)", h->index, h->length,
                                m->n_tiles + 1);
        return MUSER_OK;
    default:
        return muser_errorf(err, MUSER_E_FORMAT, "%s inside the stream", what);
    }
}

void hx_stream_take(hx_stream *s, const hx_header *h)
{
    if (h->type == HX_PROGRESS) {
        s->n_progress++;
    } else if (h->type == HX_END) {
        s->ended = true;
    } else if (h->type == HX_TILE || h->type == HX_LOGITS) {
        const uint32_t i = h->type == HX_TILE ? h->index : s->m->n_tiles;
        s->n_seen += !s->seen[i];
        s->seen[i] = true;
    }
}

int hx_stream_complete(const hx_stream *s, muser_error *err)
{
    const uint32_t n = s->m->n_tiles;
    if (s->n_seen == n + 1) return MUSER_OK;
    uint32_t first = n, missing = 0;
    for (uint32_t t = 0; t < n; t++)
        if (!s->seen[t]) {
            if (first == n) first = t;
            missing++;
        }
    if (first == n) return muser_errorf(err, MUSER_E_FORMAT, "the stream ended without the logits row");
    const hx_tile *tl = &s->m->tiles[first];
    return muser_errorf(err, MUSER_E_FORMAT,
                        "the stream ended with %u of %u tiles missing, the first tile %u (layer %u, positions %llu..%llu)",
                        missing, n, first, tl->layer, (unsigned long long)tl->pos0,
                        (unsigned long long)(tl->pos0 + tl->n_rows));
}
