/* tokenizer.c — the two tokenizers GGUF files carry, built from tokenizer.ggml.* metadata only.
 *
 *   gpt2   byte-level BPE. Text is split into pre-tokens by a regex (PCRE2, UTF + Unicode
 *          properties, JIT) chosen by tokenizer.ggml.pre; each pre-token's bytes start as one
 *          symbol per byte (GPT-2's byte -> printable-codepoint map) and adjacent pairs merge by
 *          rank (the index in tokenizer.ggml.merges) until no listed pair is left.
 *   llama  SentencePiece BPE. Spaces become U+2581 '▁' (plus one leading '▁'), the text starts
 *          as one symbol per character, and adjacent pairs whose concatenation is a vocabulary
 *          piece merge best score first; characters left outside the vocabulary fall back to
 *          <0xNN> byte tokens.
 *
 * Both merge loops use a binary heap of candidate pairs with lazy invalidation: a popped pair
 * is used only if both symbols are still alive, still adjacent and unchanged, so a word of n
 * bytes costs O(n log n), never a rescan per merge.
 *
 * Shape of the loaded state: one arena holds every token's vocabulary text and, separately,
 * the bytes it stands for in text; an open-addressing table maps text -> id and another maps
 * (left id, right id) -> (merge rank, result id). Nothing points into the GGUF map after load. */
#include "tokenizer.h"
#include "vocab.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.token_type values (llama.cpp numbering). */
enum {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

enum { KIND_GPT2, KIND_LLAMA };

#define MAX_EOG 16

/* Unicode White_Space as a character-class body. PCRE2's \s under UCP leaves out U+0085, which
 * the reference tokenizers (Rust regex / Oniguruma) count as space, so the patterns spell it. */
#define WS "\\t-\\r\\x{85}\\p{Z}"

/* Pre-tokenizer patterns. Facts from the reference implementations (GPT-2's encoder.py,
 * tiktoken's cl100k/o200k, Qwen2's tokenizer.json); \s and \S are written with WS. */
static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char PAT_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

typedef struct pre_family {
    const char *names[4];
    const char *pattern;
    bool ignore_merges; /* a pre-token that is itself a vocabulary entry is emitted whole */
} pre_family;

static const pre_family pre_families[] = {
    {{"gpt2", "gpt-2", "default", NULL}, PAT_GPT2, false},
    {{"llama3", "llama-bpe", "llama-v3", NULL}, PAT_LLAMA3, true},
    {{"qwen2", NULL, NULL, NULL}, PAT_QWEN2, false},
    {{"gpt-4o", "llama4", NULL, NULL}, PAT_O200K, true},
};

/* Control-token texts that end a generation turn in the common chat formats. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>",  "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<|return|>", "<|call|>", "<|end_of_text|>", "</s>",
};

typedef struct merge_slot {
    uint64_t key;   /* (left << 32) | right, valid when rank != UINT32_MAX */
    uint32_t rank;
    int32_t result;
} merge_slot;

struct muser_tokenizer {
    int kind;
    char model[16];
    char pre[48];
    uint32_t n_vocab;
    char *arena;            /* token texts, then token bytes, NUL after each */
    uint64_t *text_off;     /* [n_vocab] vocabulary text of token i */
    uint32_t *text_len;
    uint64_t *bytes_off;    /* [n_vocab] what token i stands for in text */
    uint32_t *bytes_len;
    uint8_t *type;          /* [n_vocab] TT_* */
    float *score;           /* [n_vocab] llama only, else NULL */
    uint32_t *text_table;   /* open addressing: id + 1, 0 = empty */
    uint64_t text_mask;
    merge_slot *merges;     /* gpt2 only */
    uint64_t merge_mask;
    int32_t byte_tok[256];  /* gpt2: token of the single byte; llama: <0xNN>; -1 if none */
    int32_t *specials;      /* control + user-defined ids, longest text first */
    uint32_t n_specials;
    uint32_t special_lens[64]; /* distinct special text lengths, descending */
    uint32_t n_special_lens;
    bool special_first[256];/* bytes that start some special text */
    pcre2_code *re;
    bool ignore_merges;
    bool add_space_prefix;
    bool add_bos;
    int32_t bos, eos, eot, unk;
    int32_t eog[MAX_EOG];
    uint32_t n_eog;
    uint32_t max_token_bytes;
};

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence at s (n bytes available): 1..4; 0 if the bytes there are
 * invalid; -k (k >= 1) if they are a valid but incomplete prefix of k bytes. Strict: no
 * overlongs, no surrogates, nothing above U+10FFFF. */
static int utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n)
            return -i;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
            return 0;
    }
    return need;
}

static uint32_t utf8_decode(const uint8_t *s, int len)
{
    if (len == 1)
        return s[0];
    uint32_t cp = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

static int utf8_encode(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ------------------------------------------------ GPT-2 byte <-> codepoint */

/* GPT-2 maps each byte to a printable codepoint: bytes that are printable Latin-1 ('!'..'~',
 * '¡'..'¬', '®'..'ÿ') map to themselves, the other 68 map to 256, 257, ... in byte order. */
static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 others, in byte order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD (1). */
static uint32_t byte_to_cp(unsigned b)
{
    if (byte_is_printable(b))
        return b;
    if (b <= 0x20)
        return 256 + b;
    if (b <= 0xA0)
        return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

size_t muser_byte_level_encode(const uint8_t *bytes, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)utf8_encode(byte_to_cp(bytes[i]), (uint8_t *)out + o);
    return o;
}

/* Inverse: byte for a codepoint, -1 if the codepoint is not in the map. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 256;
    if (n < 33)
        return (int)n;
    if (n < 67)
        return (int)(0x7F + n - 33);
    return n == 67 ? 0xAD : -1;
}

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static const char *tok_text(const muser_tokenizer *t, int32_t id, uint32_t *len)
{
    *len = t->text_len[id];
    return t->arena + t->text_off[id];
}

/* Id of the vocabulary entry whose text is exactly s[0..n), or -1. */
static int32_t text_lookup(const muser_tokenizer *t, const char *s, size_t n)
{
    uint64_t i = hash_bytes(s, n) & t->text_mask;
    for (;;) {
        uint32_t v = t->text_table[i];
        if (!v)
            return -1;
        uint32_t len;
        const char *x = tok_text(t, (int32_t)(v - 1), &len);
        if (len == n && !memcmp(x, s, n))
            return (int32_t)(v - 1);
        i = (i + 1) & t->text_mask;
    }
}

/* Entries ordinary text may turn into: not control, user-defined, unknown, unused or bytes. */
static bool type_mergeable(uint8_t ty)
{
    return ty == TT_NORMAL || ty == TT_UNDEFINED;
}

static int32_t text_lookup_mergeable(const muser_tokenizer *t, const char *s, size_t n)
{
    int32_t id = text_lookup(t, s, n);
    return (id >= 0 && type_mergeable(t->type[id])) ? id : -1;
}

static const merge_slot *merge_find(const muser_tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint64_t i = hash_u64(key) & t->merge_mask;
    for (;;) {
        const merge_slot *m = &t->merges[i];
        if (m->rank == UINT32_MAX)
            return NULL;
        if (m->key == key)
            return m;
        i = (i + 1) & t->merge_mask;
    }
}

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---------------------------------------------------------------- loading */

static int get_opt_id(const gguf_file *f, const char *key, uint32_t n_vocab, int32_t *out,
                      muser_error *err)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return MUSER_OK;
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v, err);
    if (rc)
        return rc;
    if (v >= n_vocab) {
        /* Some converters write a placeholder id past the vocabulary; treat as absent. */
        *out = -1;
        return MUSER_OK;
    }
    *out = (int32_t)v;
    return MUSER_OK;
}

static int get_opt_bool(const gguf_file *f, const char *key, bool *out, muser_error *err)
{
    if (!gguf_find_kv(f, key))
        return MUSER_OK;
    return gguf_get_bool(f, key, out, err);
}

/* Decode a GPT-2 byte-level vocabulary text into the bytes it stands for; false if some
 * character is outside the byte map (then the text is taken literally). */
static bool byte_level_decode(const char *s, uint32_t n, char *out, uint32_t *n_out)
{
    uint32_t o = 0;
    for (uint32_t i = 0; i < n;) {
        int l = utf8_seq((const uint8_t *)s + i, n - i);
        if (l <= 0)
            return false;
        int b = cp_to_byte(utf8_decode((const uint8_t *)s + i, l));
        if (b < 0)
            return false;
        out[o++] = (char)b;
        i += (uint32_t)l;
    }
    *n_out = o;
    return true;
}

/* SentencePiece piece -> text bytes: '▁' is a space, <0xNN> byte tokens are that byte. */
static uint32_t spm_piece_decode(const char *s, uint32_t n, uint8_t type, char *out)
{
    if (type == TT_BYTE && n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        char hex[3] = {s[3], s[4], 0};
        char *end;
        unsigned long v = strtoul(hex, &end, 16);
        if (*end == 0) {
            out[0] = (char)v;
            return 1;
        }
    }
    uint32_t o = 0;
    for (uint32_t i = 0; i < n;) {
        if (i + 3 <= n && !memcmp(s + i, "\xE2\x96\x81", 3)) {
            out[o++] = ' ';
            i += 3;
        } else
            out[o++] = s[i++];
    }
    return o;
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const muser_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->text_len[x] != t->text_len[y])
        return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int load_vocab(muser_tokenizer *t, const gguf_file *f, muser_error *err)
{
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!kv)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: missing key tokenizer.ggml.tokens", f->path);
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING)
        return muser_errorf(err, MUSER_E_FORMAT,
                            "%s: tokenizer.ggml.tokens: expected an array of strings", f->path);
    if (kv->arr_n == 0 || kv->arr_n > (1u << 30))
        return muser_errorf(err, MUSER_E_FORMAT, "%s: tokenizer.ggml.tokens: %llu tokens",
                            f->path, (unsigned long long)kv->arr_n);
    uint32_t n = (uint32_t)kv->arr_n;
    t->n_vocab = n;

    uint64_t text_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(kv, i);
        if (s.len > 65535)
            return muser_errorf(err, MUSER_E_FORMAT,
                                "%s: tokenizer.ggml.tokens[%u]: %llu bytes long", f->path, i,
                                (unsigned long long)s.len);
        text_bytes += s.len + 1;
    }
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->bytes_off = malloc(n * sizeof *t->bytes_off);
    t->bytes_len = malloc(n * sizeof *t->bytes_len);
    t->type = malloc(n);
    t->arena = malloc(text_bytes * 2 + 1); /* decoded bytes never outnumber the text's */
    if (!t->text_off || !t->text_len || !t->bytes_off || !t->bytes_len || !t->type || !t->arena)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    uint64_t o = 0;
    for (uint32_t i = 0; i < n; i++) {
        gguf_str s = gguf_arr_str(kv, i);
        memcpy(t->arena + o, s.ptr, s.len);
        t->arena[o + s.len] = 0;
        t->text_off[i] = o;
        t->text_len[i] = (uint32_t)s.len;
        o += s.len + 1;
    }

    /* token types (absent: all normal) */
    memset(t->type, TT_NORMAL, n);
    if (gguf_find_kv(f, "tokenizer.ggml.token_type")) {
        uint64_t nt;
        const void *data;
        int rc = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &nt, &data, err);
        if (rc)
            return rc;
        if (nt != n)
            return muser_errorf(err, MUSER_E_FORMAT,
                                "%s: tokenizer.ggml.token_type has %llu entries, tokens has %u",
                                f->path, (unsigned long long)nt, n);
        for (uint32_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const uint8_t *)data + 4 * (size_t)i, 4);
            if (v < 0 || v > TT_BYTE)
                return muser_errorf(err, MUSER_E_FORMAT,
                                    "%s: tokenizer.ggml.token_type[%u] = %d (expected 0..6)",
                                    f->path, i, v);
            t->type[i] = (uint8_t)v;
        }
    }

    /* text -> id */
    t->text_mask = pow2_at_least((uint64_t)n * 2) - 1;
    t->text_table = calloc(t->text_mask + 1, sizeof *t->text_table);
    if (!t->text_table)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len;
        const char *s = tok_text(t, (int32_t)i, &len);
        uint64_t h = hash_bytes(s, len) & t->text_mask;
        bool dup = false;
        while (t->text_table[h]) {
            uint32_t l2;
            const char *s2 = tok_text(t, (int32_t)(t->text_table[h] - 1), &l2);
            if (l2 == len && !memcmp(s, s2, len)) {
                dup = true; /* the first id keeps the text, as in the reference tokenizers */
                break;
            }
            h = (h + 1) & t->text_mask;
        }
        if (!dup)
            t->text_table[h] = i + 1;
    }
    return MUSER_OK;
}

static int load_gpt2(muser_tokenizer *t, const gguf_file *f, muser_error *err)
{
    /* pre-tokenizer */
    const char *pre = "default";
    gguf_str ps;
    if (gguf_find_kv(f, "tokenizer.ggml.pre")) {
        int rc = gguf_get_str(f, "tokenizer.ggml.pre", &ps, err);
        if (rc)
            return rc;
        if (ps.len >= sizeof t->pre)
            return muser_errorf(err, MUSER_E_UNSUPPORTED,
                                "%s: tokenizer.ggml.pre: unknown pre-tokenizer '%.*s'", f->path,
                                (int)(ps.len > 40 ? 40 : ps.len), ps.ptr);
        memcpy(t->pre, ps.ptr, ps.len);
        t->pre[ps.len] = 0;
        pre = t->pre;
    } else
        snprintf(t->pre, sizeof t->pre, "%s", pre);
    const pre_family *fam = NULL;
    for (size_t i = 0; i < sizeof pre_families / sizeof pre_families[0] && !fam; i++)
        for (int j = 0; j < 4 && pre_families[i].names[j]; j++)
            if (!strcmp(pre, pre_families[i].names[j]))
                fam = &pre_families[i];
    if (!fam)
        return muser_errorf(err, MUSER_E_UNSUPPORTED,
                            "%s: tokenizer.ggml.pre: unknown pre-tokenizer '%s' (supported: gpt2, "
                            "gpt-2, default, llama3, llama-bpe, qwen2, gpt-4o, llama4)",
                            f->path, pre);
    t->ignore_merges = fam->ignore_merges;
    int ecode;
    PCRE2_SIZE eoff;
    t->re = pcre2_compile((PCRE2_SPTR)fam->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &ecode, &eoff, NULL);
    if (!t->re) {
        char msg[160];
        pcre2_get_error_message(ecode, (PCRE2_UCHAR *)msg, sizeof msg);
        return muser_errorf(err, MUSER_E_UNSUPPORTED, "%s: pre-tokenizer '%s': regex at %zu: %s",
                            f->path, pre, (size_t)eoff, msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */

    /* byte -> single-byte token */
    for (unsigned b = 0; b < 256; b++) {
        uint8_t u[4];
        int l = utf8_encode(byte_to_cp(b), u);
        t->byte_tok[b] = text_lookup_mergeable(t, (const char *)u, (size_t)l);
    }

    /* merges: "left right" -> rank */
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!kv)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: missing key tokenizer.ggml.merges", f->path);
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING)
        return muser_errorf(err, MUSER_E_FORMAT,
                            "%s: tokenizer.ggml.merges: expected an array of strings", f->path);
    if (kv->arr_n >= UINT32_MAX / 4)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: tokenizer.ggml.merges: too many", f->path);
    t->merge_mask = pow2_at_least(kv->arr_n * 2 + 1) - 1;
    t->merges = malloc((t->merge_mask + 1) * sizeof *t->merges);
    char *buf = malloc(65536 * 2 + 2);
    if (!t->merges || !buf) {
        free(buf);
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    }
    for (uint64_t i = 0; i <= t->merge_mask; i++)
        t->merges[i].rank = UINT32_MAX;
    for (uint64_t r = 0; r < kv->arr_n; r++) {
        gguf_str m = gguf_arr_str(kv, r);
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp || m.len > 65536 * 2) {
            free(buf);
            return muser_errorf(err, MUSER_E_FORMAT,
                                "%s: tokenizer.ggml.merges[%llu]: '%.*s' is not 'left right'",
                                f->path, (unsigned long long)r, (int)(m.len > 60 ? 60 : m.len),
                                m.ptr);
        }
        size_t ll = (size_t)(sp - m.ptr), rl = m.len - ll - 1;
        int32_t l = text_lookup(t, m.ptr, ll), rr = text_lookup(t, sp + 1, rl);
        memcpy(buf, m.ptr, ll);
        memcpy(buf + ll, sp + 1, rl);
        int32_t res = text_lookup(t, buf, ll + rl);
        /* A merge whose parts or result are not in the vocabulary can never fire: skip it. */
        if (l < 0 || rr < 0 || res < 0)
            continue;
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
        uint64_t h = hash_u64(key) & t->merge_mask;
        while (t->merges[h].rank != UINT32_MAX && t->merges[h].key != key)
            h = (h + 1) & t->merge_mask;
        if (t->merges[h].rank == UINT32_MAX) /* duplicates: the first (lowest rank) wins */
            t->merges[h] = (merge_slot){key, (uint32_t)r, res};
    }
    free(buf);

    /* token bytes */
    uint64_t o = t->text_off[t->n_vocab - 1] + t->text_len[t->n_vocab - 1] + 1;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint32_t len, bl = 0;
        const char *s = tok_text(t, (int32_t)i, &len);
        char *out = t->arena + o;
        bool literal = t->type[i] == TT_CONTROL || t->type[i] == TT_USER_DEFINED ||
                       !byte_level_decode(s, len, out, &bl);
        if (literal) {
            memcpy(out, s, len);
            bl = len;
        }
        out[bl] = 0;
        t->bytes_off[i] = o;
        t->bytes_len[i] = bl;
        o += bl + 1;
    }
    return MUSER_OK;
}

static int load_llama(muser_tokenizer *t, const gguf_file *f, muser_error *err)
{
    snprintf(t->pre, sizeof t->pre, "%s", "default");
    uint64_t ns;
    const void *data;
    int rc = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &ns, &data, err);
    if (rc)
        return rc;
    if (ns != t->n_vocab)
        return muser_errorf(err, MUSER_E_FORMAT,
                            "%s: tokenizer.ggml.scores has %llu entries, tokens has %u", f->path,
                            (unsigned long long)ns, t->n_vocab);
    t->score = malloc(t->n_vocab * sizeof *t->score);
    if (!t->score)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    memcpy(t->score, data, t->n_vocab * sizeof *t->score);
    t->add_space_prefix = true;
    rc = get_opt_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
    if (rc)
        return rc;
    for (unsigned b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t id = text_lookup(t, name, 6);
        t->byte_tok[b] = (id >= 0 && t->type[id] == TT_BYTE) ? id : -1;
    }
    uint64_t o = t->text_off[t->n_vocab - 1] + t->text_len[t->n_vocab - 1] + 1;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint32_t len;
        const char *s = tok_text(t, (int32_t)i, &len);
        uint32_t bl = spm_piece_decode(s, len, t->type[i], t->arena + o);
        t->arena[o + bl] = 0;
        t->bytes_off[i] = o;
        t->bytes_len[i] = bl;
        o += bl + 1;
    }
    return MUSER_OK;
}

static void add_eog(muser_tokenizer *t, int32_t id)
{
    if (id < 0 || t->n_eog >= MAX_EOG)
        return;
    for (uint32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    t->eog[t->n_eog++] = id;
}

static int load_specials(muser_tokenizer *t, const gguf_file *f, muser_error *err)
{
    int rc;
    t->bos = t->eos = t->eot = t->unk = -1;
    int32_t eom = -1;
    if ((rc = get_opt_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err)) ||
        (rc = get_opt_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err)) ||
        (rc = get_opt_id(f, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err)) ||
        (rc = get_opt_id(f, "tokenizer.ggml.eom_token_id", t->n_vocab, &eom, err)) ||
        (rc = get_opt_id(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err)))
        return rc;
    t->add_bos = t->kind == KIND_LLAMA; /* SentencePiece models expect BOS unless told */
    if ((rc = get_opt_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)))
        return rc;
    if (t->bos < 0)
        t->add_bos = false;

    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER_DEFINED) && t->text_len[i] > 0)
            n++;
    t->specials = malloc((n ? n : 1) * sizeof *t->specials);
    if (!t->specials)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (!((t->type[i] == TT_CONTROL || t->type[i] == TT_USER_DEFINED) && t->text_len[i] > 0))
            continue;
        t->specials[t->n_specials++] = (int32_t)i;
        t->special_first[(uint8_t)t->arena[t->text_off[i]]] = true;
        for (size_t e = 0; e < sizeof eog_texts / sizeof eog_texts[0]; e++) {
            uint32_t len;
            const char *s = tok_text(t, (int32_t)i, &len);
            if (t->type[i] == TT_CONTROL && len == strlen(eog_texts[e]) &&
                !memcmp(s, eog_texts[e], len)) {
                add_eog(t, (int32_t)i);
                if (t->eot < 0 && e < 4)
                    t->eot = (int32_t)i;
            }
        }
    }
    qsort_r(t->specials, t->n_specials, sizeof *t->specials, cmp_special, t);
    for (uint32_t i = 0; i < t->n_specials; i++) {
        uint32_t len = t->text_len[t->specials[i]];
        if (t->n_special_lens && t->special_lens[t->n_special_lens - 1] == len)
            continue;
        if (t->n_special_lens == sizeof t->special_lens / sizeof t->special_lens[0])
            return muser_errorf(err, MUSER_E_UNSUPPORTED,
                                "%s: more than 64 distinct special-token lengths", f->path);
        t->special_lens[t->n_special_lens++] = len;
    }
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, eom);
    return MUSER_OK;
}

int muser_tokenizer_load(muser_tokenizer **out, const gguf_file *f, muser_error *err)
{
    *out = NULL;
    gguf_str model;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (rc)
        return rc;
    muser_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: tokenizer: out of memory", f->path);
    if (gguf_str_eq(model, "gpt2"))
        t->kind = KIND_GPT2;
    else if (gguf_str_eq(model, "llama"))
        t->kind = KIND_LLAMA;
    else {
        muser_errorf(err, MUSER_E_UNSUPPORTED,
                     "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2, llama)", f->path,
                     (int)(model.len > 40 ? 40 : model.len), model.ptr);
        free(t);
        return MUSER_E_UNSUPPORTED;
    }
    snprintf(t->model, sizeof t->model, "%s", t->kind == KIND_GPT2 ? "gpt2" : "llama");
    rc = load_vocab(t, f, err);
    if (!rc)
        rc = t->kind == KIND_GPT2 ? load_gpt2(t, f, err) : load_llama(t, f, err);
    if (!rc)
        rc = load_specials(t, f, err);
    if (rc) {
        muser_tokenizer_free(t);
        return rc;
    }
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if (t->bytes_len[i] > t->max_token_bytes)
            t->max_token_bytes = t->bytes_len[i];
    *out = t;
    return MUSER_OK;
}

void muser_tokenizer_free(muser_tokenizer *t)
{
    if (!t)
        return;
    if (t->re)
        pcre2_code_free(t->re);
    free(t->arena);
    free(t->text_off);
    free(t->text_len);
    free(t->bytes_off);
    free(t->bytes_len);
    free(t->type);
    free(t->score);
    free(t->text_table);
    free(t->merges);
    free(t->specials);
    free(t);
}

/* ---------------------------------------------------------------- encoding */

/* A symbol of the word being merged: bytes [start, start+len) of the word, alive while len>0. */
typedef struct sym {
    uint32_t start, len;
    int32_t id;   /* gpt2: current token */
    int32_t prev, next;
} sym;

/* A candidate merge of sym[left] with sym[right]. Lower prio pops first; ties go to the leftmost
 * pair. a/b record what the pair looked like when pushed (gpt2: ids; llama: lengths). */
typedef struct cand {
    double prio;
    uint32_t left, right;
    int32_t a, b;
    int32_t result;
} cand;

typedef struct scratch {
    sym *syms;
    size_t syms_cap;
    cand *heap;
    size_t heap_n, heap_cap;
    char *buf;          /* byte-level text of a word / escaped SentencePiece text */
    size_t buf_cap;
    int32_t *ids;       /* output */
    size_t n_ids, ids_cap;
} scratch;

static bool grow_to(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static bool emit(scratch *s, int32_t id)
{
    if (!grow_to((void **)&s->ids, &s->ids_cap, s->n_ids + 1, sizeof *s->ids))
        return false;
    s->ids[s->n_ids++] = id;
    return true;
}

static bool cand_less(const cand *x, const cand *y)
{
    if (x->prio != y->prio)
        return x->prio < y->prio;
    return x->left < y->left;
}

static bool heap_push(scratch *s, cand c)
{
    if (!grow_to((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap))
        return false;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
    return true;
}

static cand heap_pop(scratch *s)
{
    cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && cand_less(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!cand_less(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

static bool gpt2_push_pair(const muser_tokenizer *t, scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return true;
    const merge_slot *m = merge_find(t, s->syms[l].id, s->syms[r].id);
    if (!m)
        return true;
    return heap_push(s, (cand){(double)m->rank, (uint32_t)l, (uint32_t)r, s->syms[l].id,
                               s->syms[r].id, m->result});
}

static int oom(muser_error *err)
{
    return muser_errorf(err, MUSER_E_NOMEM, "tokenize: out of memory");
}

/* Byte-level BPE of one pre-token w[0..n). */
static int gpt2_word(const muser_tokenizer *t, scratch *s, const uint8_t *w, size_t n,
                     size_t at, muser_error *err)
{
    if (t->ignore_merges) {
        if (!grow_to((void **)&s->buf, &s->buf_cap, n * 2 + 1, 1))
            return oom(err);
        size_t o = muser_byte_level_encode(w, n, s->buf);
        int32_t id = text_lookup_mergeable(t, s->buf, o);
        if (id >= 0)
            return emit(s, id) ? MUSER_OK : oom(err);
    }
    if (!grow_to((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms))
        return oom(err);
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[w[i]];
        if (id < 0)
            return muser_errorf(err, MUSER_E_TOKENIZE,
                                "tokenize: byte 0x%02X at offset %zu has no token in this "
                                "vocabulary", w[i], at + i);
        s->syms[i] = (sym){(uint32_t)i, 1, id, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!gpt2_push_pair(t, s, (int32_t)i, (int32_t)i + 1))
            return oom(err);
    while (s->heap_n) {
        cand c = heap_pop(s);
        sym *l = &s->syms[c.left], *r = &s->syms[c.right];
        if (!l->len || !r->len || l->next != (int32_t)c.right || l->id != c.a || r->id != c.b)
            continue; /* stale */
        l->id = c.result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = (int32_t)c.left;
        if (!gpt2_push_pair(t, s, l->prev, (int32_t)c.left) ||
            !gpt2_push_pair(t, s, (int32_t)c.left, l->next))
            return oom(err);
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next)
        if (!emit(s, s->syms[i].id))
            return oom(err);
    return MUSER_OK;
}

static int gpt2_fragment(const muser_tokenizer *t, scratch *s, pcre2_match_data *md,
                         const uint8_t *text, size_t len, size_t at, muser_error *err)
{
    size_t pos = 0;
    while (pos < len) {
        int rc = pcre2_match(t->re, text, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        size_t ms, me;
        if (rc == PCRE2_ERROR_NOMATCH) {
            ms = len;
            me = len;
        } else if (rc < 0) {
            char msg[160];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return muser_errorf(err, MUSER_E_TOKENIZE, "tokenize: regex at offset %zu: %s",
                                at + pos, msg);
        } else {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            ms = ov[0];
            me = ov[1];
        }
        if (ms > pos) { /* text no alternative matched stays one piece */
            int r = gpt2_word(t, s, text + pos, ms - pos, at + pos, err);
            if (r)
                return r;
        }
        if (me == ms) { /* empty match or no match: step one character */
            if (ms >= len)
                break;
            int l = utf8_seq(text + ms, len - ms);
            me = ms + (size_t)(l > 0 ? l : 1);
            int r = gpt2_word(t, s, text + ms, me - ms, at + ms, err);
            if (r)
                return r;
        } else {
            int r = gpt2_word(t, s, text + ms, me - ms, at + ms, err);
            if (r)
                return r;
        }
        pos = me;
    }
    return MUSER_OK;
}

static bool spm_push_pair(const muser_tokenizer *t, scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return true;
    const sym *a = &s->syms[l], *b = &s->syms[r];
    int32_t id = text_lookup_mergeable(t, s->buf + a->start, a->len + b->len);
    if (id < 0)
        return true;
    return heap_push(s, (cand){-(double)t->score[id], (uint32_t)l, (uint32_t)r, (int32_t)a->len,
                               (int32_t)b->len, id});
}

/* SentencePiece BPE of one text fragment (no special tokens inside). */
static int spm_fragment(const muser_tokenizer *t, scratch *s, const uint8_t *text, size_t len,
                        bool prefix, muser_error *err)
{
    /* escape: optional leading '▁', every ' ' -> '▁' */
    if (!grow_to((void **)&s->buf, &s->buf_cap, len * 3 + 4, 1))
        return oom(err);
    size_t n = 0;
    if (prefix) {
        memcpy(s->buf, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + n, "\xE2\x96\x81", 3);
            n += 3;
        } else
            s->buf[n++] = (char)text[i];
    }
    if (!n)
        return MUSER_OK;
    if (!grow_to((void **)&s->syms, &s->syms_cap, n, sizeof *s->syms))
        return oom(err);
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        int l = utf8_seq((const uint8_t *)s->buf + i, n - i);
        if (l <= 0)
            l = 1; /* cannot happen: input was validated */
        s->syms[ns] = (sym){(uint32_t)i, (uint32_t)l, -1, (int32_t)ns - 1, (int32_t)ns + 1};
        ns++;
        i += (size_t)l;
    }
    s->syms[ns - 1].next = -1;
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (!spm_push_pair(t, s, (int32_t)i, (int32_t)i + 1))
            return oom(err);
    while (s->heap_n) {
        cand c = heap_pop(s);
        sym *l = &s->syms[c.left], *r = &s->syms[c.right];
        if (!l->len || !r->len || l->next != (int32_t)c.right || l->len != (uint32_t)c.a ||
            r->len != (uint32_t)c.b)
            continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = (int32_t)c.left;
        if (!spm_push_pair(t, s, l->prev, (int32_t)c.left) ||
            !spm_push_pair(t, s, (int32_t)c.left, l->next))
            return oom(err);
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        int32_t id = text_lookup_mergeable(t, s->buf + y->start, y->len);
        if (id >= 0) {
            if (!emit(s, id))
                return oom(err);
            continue;
        }
        for (uint32_t k = 0; k < y->len; k++) { /* byte fallback */
            int32_t b = t->byte_tok[(uint8_t)s->buf[y->start + k]];
            if (b < 0)
                b = t->unk;
            if (b < 0)
                return muser_errorf(err, MUSER_E_TOKENIZE,
                                    "tokenize: '%.*s' is not in the vocabulary and it has no byte "
                                    "or unknown tokens", (int)y->len, s->buf + y->start);
            if (!emit(s, b))
                return oom(err);
            if (b == t->unk)
                break; /* one <unk> for the whole character */
        }
    }
    return MUSER_OK;
}

/* Longest special token whose text starts at text[pos], or -1. */
static int32_t special_at(const muser_tokenizer *t, const uint8_t *text, size_t len, size_t pos)
{
    if (!t->special_first[text[pos]])
        return -1;
    for (uint32_t i = 0; i < t->n_special_lens; i++) {
        uint32_t l = t->special_lens[i];
        if (l > len - pos)
            continue;
        int32_t id = text_lookup(t, (const char *)text + pos, l);
        if (id >= 0 && (t->type[id] == TT_CONTROL || t->type[id] == TT_USER_DEFINED))
            return id;
    }
    return -1;
}

static int encode_fragment(const muser_tokenizer *t, scratch *s, pcre2_match_data *md,
                           const uint8_t *text, size_t len, size_t at, bool prev_special,
                           muser_error *err)
{
    if (t->kind == KIND_GPT2)
        return gpt2_fragment(t, s, md, text, len, at, err);
    return spm_fragment(t, s, text, len, t->add_space_prefix && prev_special, err);
}

int muser_tokenize(const muser_tokenizer *t, const char *text, size_t len, bool add_bos,
                   bool parse_special, int32_t **out, size_t *n_out, muser_error *err)
{
    *out = NULL;
    *n_out = 0;
    if (!text && len)
        return muser_errorf(err, MUSER_E_ARG, "tokenize: NULL text");
    const uint8_t *u = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        int l = utf8_seq(u + i, len - i);
        if (l <= 0)
            return muser_errorf(err, MUSER_E_TOKENIZE,
                                "tokenize: invalid UTF-8 at byte offset %zu (byte 0x%02X%s)", i,
                                u[i], l < 0 ? ", truncated sequence" : "");
        i += (size_t)l;
    }
    scratch s = {0};
    pcre2_match_data *md = NULL;
    int rc = MUSER_OK;
    if (t->kind == KIND_GPT2) {
        md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!md)
            return oom(err);
    }
    if (add_bos && t->bos >= 0 && !emit(&s, t->bos))
        rc = oom(err);
    /* Split at special tokens (only when asked); everything between is ordinary text. */
    size_t frag = 0;
    bool prev_special = true; /* SentencePiece: the first fragment gets the '▁' prefix */
    for (size_t i = 0; !rc && i <= len;) {
        int32_t sp = (parse_special && i < len) ? special_at(t, u, len, i) : -1;
        if (sp < 0 && i < len) {
            i++;
            continue;
        }
        if (i > frag) {
            rc = encode_fragment(t, &s, md, u + frag, i - frag, frag, prev_special, err);
            prev_special = false;
        }
        if (rc || sp < 0)
            break;
        if (!emit(&s, sp)) {
            rc = oom(err);
            break;
        }
        prev_special = true;
        i += t->text_len[sp];
        frag = i;
    }
    if (md)
        pcre2_match_data_free(md);
    free(s.syms);
    free(s.heap);
    free(s.buf);
    if (rc) {
        free(s.ids);
        return rc;
    }
    if (!s.ids) { /* empty result: still hand back a freeable pointer */
        s.ids = malloc(sizeof *s.ids);
        if (!s.ids)
            return oom(err);
    }
    *out = s.ids;
    *n_out = s.n_ids;
    return MUSER_OK;
}

/* ---------------------------------------------------------------- decoding */

const char *muser_token_bytes(const muser_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->bytes_len[id];
    return t->arena + t->bytes_off[id];
}

/* SentencePiece drops the '▁' it added in front of the text: the first piece that is not a
 * control token loses one leading space. */
static bool strips_space(const muser_tokenizer *t, int32_t id)
{
    return t->kind == KIND_LLAMA && t->add_space_prefix && t->type[id] != TT_CONTROL;
}

int muser_detokenize(const muser_tokenizer *t, const int32_t *ids, size_t n, char **out,
                     muser_error *err)
{
    *out = NULL;
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab)
            return muser_errorf(err, MUSER_E_ARG,
                                "detokenize: id %d at position %zu is outside the vocabulary "
                                "(0..%u)", ids[i], i, t->n_vocab - 1);
        total += t->bytes_len[ids[i]];
    }
    char *s = malloc(total);
    if (!s)
        return oom(err);
    size_t o = 0;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        const char *b = muser_token_bytes(t, ids[i], &bl);
        if (first && strips_space(t, ids[i])) {
            first = false;
            if (bl && b[0] == ' ') {
                b++;
                bl--;
            }
        }
        memcpy(s + o, b, bl);
        o += bl;
    }
    s[o] = 0;
    *out = s;
    return MUSER_OK;
}

uint32_t muser_tokenizer_n_vocab(const muser_tokenizer *t) { return t->n_vocab; }
int32_t muser_token_bos(const muser_tokenizer *t) { return t->bos; }
int32_t muser_token_eos(const muser_tokenizer *t) { return t->eos; }
int32_t muser_token_eot(const muser_tokenizer *t) { return t->eot; }
bool muser_tokenizer_add_bos(const muser_tokenizer *t) { return t->add_bos; }
const char *muser_tokenizer_model(const muser_tokenizer *t) { return t->model; }
const char *muser_tokenizer_pre(const muser_tokenizer *t) { return t->pre; }

bool muser_token_is_eog(const muser_tokenizer *t, int32_t id)
{
    for (uint32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

int32_t muser_token_find(const muser_tokenizer *t, const char *text)
{
    return text ? text_lookup(t, text, strlen(text)) : -1;
}

size_t muser_detok_stream_min_cap(const muser_tokenizer *t)
{
    /* worst case: 3 pending bytes + the longest token, every byte invalid -> 3 bytes each */
    size_t c = 3 * ((size_t)t->max_token_bytes + 4);
    return c < 64 ? 64 : c;
}

/* ---------------------------------------------------------------- streaming */

void muser_detok_stream_init(muser_detok_stream *s, const muser_tokenizer *t)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->first = true;
}

/* Write the complete characters of p[0..n) to out; invalid bytes become U+FFFD; an incomplete
 * tail (valid so far) is kept in pending unless final. Never writes past cap or half a char. */
static size_t stream_emit(muser_detok_stream *s, const uint8_t *p, size_t n, bool final,
                          char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int l = utf8_seq(p + i, n - i);
        if (l < 0 && !final) {
            memcpy(s->pending, p + i, n - i);
            s->n_pending = n - i;
            return o;
        }
        const uint8_t *src = p + i;
        size_t w = (size_t)l;
        if (l <= 0) { /* invalid byte, or a truncated sequence at the very end */
            src = (const uint8_t *)"\xEF\xBF\xBD";
            w = 3;
            l = l < 0 ? -l : 1;
        }
        if (o + w > cap)
            break; /* caller's buffer is below muser_detok_stream_min_cap: drop the rest */
        memcpy(out + o, src, w);
        o += w;
        i += (size_t)l;
    }
    s->n_pending = 0;
    return o;
}

size_t muser_detok_stream_push(muser_detok_stream *s, int32_t id, char *out, size_t cap)
{
    size_t bl;
    const char *b = muser_token_bytes(s->t, id, &bl);
    if (!b)
        return 0;
    if (s->first && strips_space(s->t, id)) {
        s->first = false;
        if (bl && b[0] == ' ') {
            b++;
            bl--;
        }
    }
    if (!s->n_pending) {
        /* fast path: the token's own bytes, no copy into a joint buffer */
        return stream_emit(s, (const uint8_t *)b, bl, false, out, cap);
    }
    /* Join pending + the head of the token until the pending character completes or fails. */
    uint8_t joint[8];
    size_t np = s->n_pending, take = bl < 4 ? bl : 4;
    memcpy(joint, s->pending, np);
    memcpy(joint + np, b, take);
    int l = utf8_seq(joint, np + take);
    if (l < 0 && take == bl) { /* still incomplete: keep waiting */
        memcpy(s->pending, joint, np + take);
        s->n_pending = np + take;
        return 0;
    }
    size_t o;
    size_t used; /* token bytes consumed by the joint character */
    if (l > 0) {
        if ((size_t)l > cap)
            return 0;
        memcpy(out, joint, (size_t)l);
        o = (size_t)l;
        used = (size_t)l - np;
    } else { /* the pending bytes were not the start of a character after all */
        o = stream_emit(s, joint, np, true, out, cap);
        used = 0;
    }
    s->n_pending = 0;
    return o + stream_emit(s, (const uint8_t *)b + used, bl - used, false, out + o, cap - o);
}

size_t muser_detok_stream_flush(muser_detok_stream *s, char *out, size_t cap)
{
    if (!s->n_pending)
        return 0;
    uint8_t p[16];
    size_t n = s->n_pending;
    memcpy(p, s->pending, n);
    return stream_emit(s, p, n, true, out, cap);
}
