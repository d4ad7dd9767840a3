/* wire.h — the remote-prefill wire format (docs/handoff.md): frames, their MACs, the request, the
 * manifest and the tiling, encoded and decoded with every count and length checked before
 * anything is allocated. No I/O and no engine here: fuzz/fuzz_handoff.c drives the decoders.
 *
 * A frame is a 16-byte header (magic, type, flags, index, payload length; little-endian), the
 * payload, and — every type but REFUSE — HMAC-SHA256(key, sid ‖ header ‖ payload), where sid is
 * the session id (the request's nonce for the request itself). The header is inside the MAC, so a
 * tile's MAC binds the session, its index, its length and its contents. */
#ifndef MUSER_HANDOFF_WIRE_H
#define MUSER_HANDOFF_WIRE_H

#include "muser.h"

#define HX_VERSION 1u
#define HX_MAGIC 0x3158484Du        /* "MHX1" */
#define HX_HEADER_BYTES 16u
#define HX_MAC_BYTES 32u
#define HX_ID_BYTES 16u             /* session ids and nonces */
#define HX_MODEL_ID_BYTES 32u       /* SHA-256 of the model file */
#define HX_TILE_ROWS 512u           /* rows per tile: the default and the most */
#define HX_TILE_ROWS_MIN 64u
#define HX_MAX_TOKENS (1u << 20)    /* tokens a request or manifest may list */
#define HX_MAX_LAYERS 1024u
#define HX_MAX_ROW_ELEMS 65536u     /* HKV * D of a layer */
#define HX_MAX_VOCAB (1u << 22)
#define HX_MAX_FRAME (64u << 20)    /* no payload is longer, whatever a manifest says */
#define HX_REFUSE_MAX 512u          /* a refusal's reason, bytes */
#define HX_REQUEST_FIXED 64u        /* request payload before its tokens */
#define HX_MANIFEST_FIXED 96u       /* manifest payload before its tokens */

typedef enum {
    HX_REQUEST = 1,  /* consumer -> producer: model, tokens, the prefix it holds, a nonce */
    HX_MANIFEST = 2, /* the sealed list of everything that follows */
    HX_TILE = 3,     /* index i < n_tiles: the K then V rows of manifest tile i */
    HX_LOGITS = 4,   /* index n_tiles: the last prompt row's logits, f32 [n_vocab] */
    HX_PROGRESS = 5, /* index k: the producer's prefill reached a position (u64); keeps the peer's
                      * idle timeout honest while a warm prefix prefills */
    HX_END = 6,      /* index n_tiles + 1, empty: nothing else follows */
    HX_REFUSE = 7,   /* a reason (text, not MACed): the session is over */
} hx_type;

typedef struct hx_header {
    uint16_t type, flags;
    uint32_t index, length;
} hx_header;

void hx_header_encode(const hx_header *h, uint8_t out[HX_HEADER_BYTES]);
/* Magic, a known type, flags 0. The length is the caller's to bound. */
int hx_header_decode(const uint8_t in[HX_HEADER_BYTES], hx_header *h, muser_error *err);
const char *hx_type_name(uint32_t type);

/* HMAC-SHA256(key, sid ‖ header ‖ payload). */
void hx_mac(const uint8_t *key, size_t key_len, const uint8_t sid[HX_ID_BYTES],
            const uint8_t hdr[HX_HEADER_BYTES], const uint8_t *payload, size_t len, uint8_t out[HX_MAC_BYTES]);
/* The same, compared in constant time with mac. */
bool hx_mac_ok(const uint8_t *key, size_t key_len, const uint8_t sid[HX_ID_BYTES],
               const uint8_t hdr[HX_HEADER_BYTES], const uint8_t *payload, size_t len,
               const uint8_t mac[HX_MAC_BYTES]);

/* A layer as the manifest lists it: its plane's shape. */
typedef struct hx_layer {
    uint32_t ring;                 /* 1: SWA ring of `window` rows; 0: FULL plane */
    uint32_t n_head_kv, head_dim, window;
} hx_layer;

/* A tile: rows [pos0, pos0 + n_rows) of one layer, K then V, token-major f16. */
typedef struct hx_tile {
    uint32_t layer, n_rows;
    uint64_t pos0;
} hx_tile;

/* Payload bytes of a tile of n_rows rows of layer ly (K and V). */
uint64_t hx_tile_bytes(const hx_layer *ly, uint32_t n_rows);

/* The tiles of a handoff of positions [cut, n) in the order they stream: the FULL layers' tiles
 * chunk by chunk (tile k of every FULL layer before tile k + 1 of any: they leave the producer as
 * its prefill passes them), then each ring layer's tiles of [max(cut, n - window), n) (the rows a
 * ring of n positions still holds; the rest of the window is the consumer's warm prefix). Tiles
 * start at the range's start and hold tile_rows rows but the last. Returns the count; fills
 * out[] (that many entries) when it is not NULL. */
uint32_t hx_tiling(const hx_layer *layers, uint32_t n_layer, uint64_t cut, uint64_t n, uint32_t tile_rows,
                   hx_tile *out);

/* REQUEST payload: version u32, nonce[16], model id[32], cut u64, n_tokens u32,
 * tokens i32[n_tokens]. */
typedef struct hx_request {
    uint32_t version;
    uint8_t nonce[HX_ID_BYTES];
    uint8_t model_id[HX_MODEL_ID_BYTES];
    uint64_t cut;                  /* the consumer holds positions [0, cut) already */
    uint32_t n_tokens;
    int32_t *tokens;               /* decoded: owned (hx_request_free) */
} hx_request;

uint64_t hx_request_size(uint32_t n_tokens);
void hx_request_encode(const hx_request *r, uint8_t *out);
/* Any bytes: refused unless the length is exactly that of the counts it states, the version is
 * ours, n_tokens is in 1..max_tokens, cut < n_tokens, every token is in [0, n_vocab). */
int hx_request_decode(const uint8_t *p, size_t len, uint32_t max_tokens, uint32_t n_vocab, hx_request *r,
                      muser_error *err);
void hx_request_free(hx_request *r);

/* MANIFEST payload: version u32, session id[16], nonce[16], model id[32], cut u64, n_tokens,
 * tile_rows, n_layer, n_vocab, n_tiles (u32 each), tokens i32[n_tokens],
 * layers {ring, n_head_kv, head_dim, window}[n_layer], tiles {layer u32, n_rows u32, pos0 u64}[n_tiles]. */
typedef struct hx_manifest {
    uint32_t version;
    uint8_t session_id[HX_ID_BYTES];
    uint8_t nonce[HX_ID_BYTES];
    uint8_t model_id[HX_MODEL_ID_BYTES];
    uint64_t cut;
    uint32_t n_tokens, tile_rows, n_layer, n_vocab, n_tiles;
    int32_t *tokens;               /* owned when decoded (hx_manifest_free) */
    hx_layer *layers;
    hx_tile *tiles;
} hx_manifest;

uint64_t hx_manifest_size(uint32_t n_tokens, uint32_t n_layer, uint32_t n_tiles);
/* The longest manifest a request of n_tokens tokens can be answered with (the smallest tiles). */
uint64_t hx_manifest_bound(uint32_t n_tokens, uint32_t n_layer);
void hx_manifest_encode(const hx_manifest *m, uint8_t *out);
/* Any bytes: refused unless the length is exactly that of the counts it states, the version is
 * ours, and every count, shape and tile is in range (a tile of a listed layer, 1..tile_rows
 * rows inside [cut, n_tokens), its payload under HX_MAX_FRAME). Whether it is the manifest the
 * consumer asked for is hx_manifest_check's. */
int hx_manifest_decode(const uint8_t *p, size_t len, hx_manifest *m, muser_error *err);
/* got against what the consumer expects (want: everything but the session id; its tile list is
 * hx_tiling's for got's tile_rows, so want->tiles may be NULL): the first difference, named. */
int hx_manifest_check(const hx_manifest *got, const hx_manifest *want, muser_error *err);
void hx_manifest_free(hx_manifest *m);

/* The longest payload a session of manifest m carries: its largest tile or the logits row. */
uint64_t hx_manifest_max_payload(const hx_manifest *m);

/* The consumer's view of a session's frames after the manifest, kept apart from the I/O so the
 * fuzzer can drive it: which frames may come next, and whether everything came. */
typedef struct hx_stream {
    const hx_manifest *m;
    bool *seen;                    /* [n_tiles + 1] the caller's: tiles, then the logits row */
    uint32_t n_seen, n_progress, max_progress;
    bool ended;
} hx_stream;

void hx_stream_init(hx_stream *s, const hx_manifest *m, bool *seen);
/* A frame's header, before its payload is read: refused unless the stream still expects it, at
 * its index (a tile once, the logits row once, progress frames in order and at most one per 64
 * warm positions, the end last), with exactly the length the manifest implies — so nothing beyond
 * that is ever read or allocated. what (cap bytes) names the frame for messages either way. */
int hx_stream_admit(const hx_stream *s, const hx_header *h, char *what, size_t cap, muser_error *err);
/* The admitted frame's payload verified: it counts. */
void hx_stream_take(hx_stream *s, const hx_header *h);
/* validate_complete: every tile of the manifest and the logits row arrived (names the first
 * missing one). */
int hx_stream_complete(const hx_stream *s, muser_error *err);

/* Little-endian fields (the codec's, shared with the producer and consumer). */
static inline void hx_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void hx_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t hx_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t hx_get_u64(const uint8_t *p)
{
    return (uint64_t)hx_get_u32(p) | (uint64_t)hx_get_u32(p + 4) << 32;
}

/* Lower-case hex of n bytes into out (2n + 1 bytes). */
void hx_hex(const uint8_t *b, size_t n, char *out);

#endif
