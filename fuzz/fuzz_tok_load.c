/* fuzz_tok_load.c — libFuzzer entry for tokenizer LOADING (muser_tokenizer_load) from hostile
 * tokenizer.ggml.* metadata. The input is an edit script applied to a small vocabulary
 * (fuzz_vocab.h: byte-level BPE or SentencePiece, picked by byte 0): each edit deletes a key,
 * retypes it (scalar or array of another type, strings included), resizes an array, or damages
 * one element — a token made empty, duplicated or replaced with arbitrary bytes, a token_type
 * out of range, a NaN/huge score, a merge naming unknown tokens or without a space, an id past
 * the vocabulary, an unknown model or pre-tokenizer name. The result is written with the real
 * GGUF writer (memfd) and loaded. Checks: a refusal is a negative status with a message that
 * names the file and no tokenizer; a tokenizer that loads is usable — tokenizing a few texts
 * (with and without parse_special) succeeds or says MUSER_E_TOKENIZE, every id is inside the
 * vocabulary, detokenizing them works, and the streaming detokenizer over them and over every
 * id emits only valid UTF-8 within its cap. Leaks are LeakSanitizer reports. */
#include "fuzz_common.h"
#include "fuzz_vocab.h"
#include "tokenizer.h"

#include <math.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define H "fuzz_tok_load"

enum { K_ABSENT, K_STR, K_U32, K_I32, K_U64, K_F32, K_BOOL, K_ASTR, K_AI32, K_AU32, K_AF32,
       K_AU8, K_COUNT };

/* One metadata value: scalars in u/f/s; arrays as strings or 4-byte elements (u8 uses the low
 * byte of each). */
typedef struct val {
    int kind;
    uint64_t u;
    float f;
    char s[64];
    uint32_t slen;
    uint32_t n;
    char *strs[TL_MAX + 8];
    uint32_t lens[TL_MAX + 8];
    uint32_t nums[TL_MAX + 8];
} val;

static const char *const keys[] = {
    "tokenizer.ggml.model",         "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",        "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",        "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",  "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",  "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
};
enum { MODEL, PRE, TOKENS, TYPES, SCORES, MERGES, BOS, EOS, EOT, EOM, UNK, ADD_BOS, ADD_SPACE,
       N_KEYS };

static const char *const names[] = {
    "gpt2", "llama", "bert", "", "gpt-2", "default", "llama3", "llama-bpe", "qwen2", "gpt-4o",
    "llama4", "llama-v3", "gpt2 ", "a-pre-tokenizer-name-longer-than-forty-eight-bytes-xx",
};

static tlist base[2];
static val vals[N_KEYS];
static char scratch_str[TL_MAX + 8][96];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    tl_build_bpe(&base[0]);
    tl_build_spm(&base[1]);
    return 0;
}

static void set_str(val *v, const char *s, uint32_t len)
{
    v->kind = K_STR;
    v->slen = len < sizeof v->s ? len : sizeof v->s - 1;
    memcpy(v->s, s, v->slen);
}

static void set_astr(val *v, char *const *s, uint32_t n)
{
    v->kind = K_ASTR;
    v->n = n;
    for (uint32_t i = 0; i < n; i++) {
        v->strs[i] = s[i];
        v->lens[i] = (uint32_t)strlen(s[i]);
    }
}

static void set_anum(val *v, int kind, const void *p, uint32_t n)
{
    v->kind = kind;
    v->n = n;
    memcpy(v->nums, p, 4 * (size_t)n);
}

/* The base vocabulary's keys, as tl_write would set them. */
static void load_base(const tlist *l, bool spm)
{
    memset(vals, 0, sizeof vals);
    set_str(&vals[MODEL], spm ? "llama" : "gpt2", spm ? 5 : 4);
    if (!spm)
        set_str(&vals[PRE], "gpt-2", 5);
    set_astr(&vals[TOKENS], l->s, l->n);
    set_anum(&vals[TYPES], K_AI32, l->type, l->n);
    if (spm) {
        set_anum(&vals[SCORES], K_AF32, l->score, l->n);
        vals[UNK] = (val){.kind = K_U32, .u = 0};
        vals[BOS] = (val){.kind = K_U32, .u = 1};
    } else {
        set_astr(&vals[MERGES], l->m, l->nm);
        vals[BOS] = (val){.kind = K_U32, .u = 0};
    }
    vals[EOS] = (val){.kind = K_U32, .u = 2};
}

static const float odd_floats[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 0.0f, -0.0f,
                                   1e-45f, 1.0f, -1e9f};

/* Bytes from the input as a string (length byte first) into a scratch slot. */
static char *input_str(fuzz_in *in, uint32_t slot, uint32_t *len)
{
    uint32_t n = fuzz_u8(in) % 48;
    char *s = scratch_str[slot];
    for (uint32_t i = 0; i < n; i++)
        s[i] = (char)fuzz_u8(in);
    s[n] = 0;
    *len = n;
    return s;
}

static void apply_edit(fuzz_in *in, uint32_t n_base)
{
    const uint8_t op = fuzz_u8(in) % 10;
    val *v = &vals[fuzz_u8(in) % N_KEYS];
    const uint32_t x = fuzz_u32(in);
    switch (op) {
    case 0: /* delete */
        v->kind = K_ABSENT;
        break;
    case 1: { /* retype as a scalar */
        int kind = 1 + (int)(x % 6);
        v->kind = kind;
        v->u = fuzz_u32(in);
        v->f = (x & 0x100) ? odd_floats[(x >> 9) % 10] : (float)v->u;
        if (kind == K_STR) {
            const char *s = names[(x >> 3) % (sizeof names / sizeof names[0])];
            set_str(v, s, (uint32_t)strlen(s));
        }
        break;
    }
    case 2: { /* retype as a numeric array of a length near the vocabulary's */
        static const int kinds[4] = {K_AI32, K_AU32, K_AF32, K_AU8};
        const uint32_t lens[6] = {0, 1, n_base - 1, n_base, n_base + 1, n_base + 8};
        v->kind = kinds[x % 4];
        v->n = lens[(x >> 2) % 6];
        for (uint32_t i = 0; i < v->n; i++)
            v->nums[i] = (x >> 5) & 1 ? x * (i + 1) : (uint32_t)(i % 7);
        break;
    }
    case 3: { /* resize an array (shrinking, or growing with copies of element 0) */
        if (v->kind < K_ASTR || v->n == 0)
            break;
        uint32_t n = x % (TL_MAX + 8);
        for (uint32_t i = v->n; i < n; i++) {
            v->strs[i] = v->strs[0];
            v->lens[i] = v->lens[0];
            v->nums[i] = v->nums[0];
        }
        v->n = n;
        break;
    }
    case 4: { /* one string element: arbitrary bytes, empty, or a copy of another */
        val *t = &vals[(x & 1) ? TOKENS : MERGES];
        if (t->kind != K_ASTR || t->n == 0)
            break;
        uint32_t i = (x >> 1) % t->n, mode = (x >> 20) % 3;
        if (mode == 0)
            t->strs[i] = input_str(in, i, &t->lens[i]);
        else if (mode == 1)
            t->lens[i] = 0;
        else {
            uint32_t j = fuzz_u32(in) % t->n;
            t->strs[i] = t->strs[j];
            t->lens[i] = t->lens[j];
        }
        break;
    }
    case 5: { /* a merge of two arbitrary tokens, maybe unknown, maybe with more spaces */
        val *t = &vals[MERGES], *tok = &vals[TOKENS];
        if (t->kind != K_ASTR || t->n == 0 || tok->kind != K_ASTR || tok->n == 0)
            break;
        uint32_t i = x % t->n, a = fuzz_u32(in) % tok->n, b = fuzz_u32(in) % tok->n;
        char *s = scratch_str[i];
        int len = snprintf(s, sizeof scratch_str[0], "%.*s%s%.*s", (int)(tok->lens[a] % 40),
                           tok->strs[a], (x & 0x1000) ? "  " : " ", (int)(tok->lens[b] % 40),
                           tok->strs[b]);
        t->strs[i] = s;
        t->lens[i] = (uint32_t)(len < 0 ? 0 : len >= (int)sizeof scratch_str[0]
                                                   ? (int)sizeof scratch_str[0] - 1 : len);
        break;
    }
    case 6: { /* one numeric element: token_type anything, score odd */
        val *t = &vals[(x & 1) ? TYPES : SCORES];
        if (t->kind < K_AI32 || t->n == 0)
            break;
        uint32_t i = (x >> 1) % t->n, y = fuzz_u32(in);
        if (t == &vals[SCORES] && (y & 1)) {
            float f = odd_floats[(y >> 1) % 10];
            memcpy(&t->nums[i], &f, 4);
        } else
            t->nums[i] = (y & 2) ? y >> 2 : (y >> 2) % 9;
        break;
    }
    case 7: { /* an id key: inside, at the edge or past the vocabulary */
        val *t = &vals[BOS + (x % 5)];
        const uint64_t ids[6] = {0, 3, n_base - 1, n_base, UINT32_MAX, (uint64_t)1 << 40};
        t->kind = (x & 8) ? K_I32 : (x & 16) ? K_U64 : K_U32;
        t->u = ids[(x >> 5) % 6];
        if (t->kind == K_I32 && (x & 32))
            t->u = (uint64_t)-1;
        break;
    }
    case 8: /* model or pre name */
        set_str(&vals[(x & 1) ? PRE : MODEL], names[(x >> 1) % (sizeof names / sizeof names[0])],
                (uint32_t)strlen(names[(x >> 1) % (sizeof names / sizeof names[0])]));
        break;
    case 9: /* a boolean key as a bool of either value */
        vals[(x & 1) ? ADD_BOS : ADD_SPACE] = (val){.kind = K_BOOL, .u = (x >> 1) & 1};
        break;
    }
}

static void write_vals(gguf_writer *w)
{
    for (int k = 0; k < N_KEYS; k++) {
        const val *v = &vals[k];
        const char *key = keys[k];
        switch (v->kind) {
        case K_ABSENT: break;
        case K_STR: {
            char s[sizeof v->s + 1];
            memcpy(s, v->s, v->slen);
            s[v->slen] = 0;
            gguf_writer_set_str(w, key, s);
            break;
        }
        case K_U32: gguf_writer_set_u32(w, key, (uint32_t)v->u); break;
        case K_I32: gguf_writer_set_i32(w, key, (int32_t)(uint32_t)v->u); break;
        case K_U64: gguf_writer_set_u64(w, key, v->u); break;
        case K_F32: gguf_writer_set_f32(w, key, v->f); break;
        case K_BOOL: gguf_writer_set_bool(w, key, v->u & 1); break;
        case K_ASTR: {
            uint64_t lens[TL_MAX + 8];
            for (uint32_t i = 0; i < v->n; i++)
                lens[i] = v->lens[i];
            gguf_writer_set_arr_str(w, key, (const char *const *)v->strs, lens, v->n);
            break;
        }
        case K_AI32: gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, v->nums, v->n); break;
        case K_AU32: gguf_writer_set_arr(w, key, GGUF_TYPE_UINT32, v->nums, v->n); break;
        case K_AF32: gguf_writer_set_arr(w, key, GGUF_TYPE_FLOAT32, v->nums, v->n); break;
        case K_AU8: {
            uint8_t b[TL_MAX + 8];
            for (uint32_t i = 0; i < v->n; i++)
                b[i] = (uint8_t)v->nums[i];
            gguf_writer_set_arr(w, key, GGUF_TYPE_UINT8, b, v->n);
            break;
        }
        }
    }
}

static const char *const texts[] = {
    "hello world, the 2024 \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82"
    " \xe4\xbd\xa0\xe5\xa5\xbd",
    "<|im_start|>user\n<tool>hi<|im_end|><s> </s><|user|>",
    "\xf0\x9f\x98\x80  \n\n e\xcc\x81...'s",
    "",
};

static void stream_all(const muser_tokenizer *t, const int32_t *ids, size_t n)
{
    size_t cap = muser_detok_stream_min_cap(t);
    char *piece = malloc(cap);
    muser_detok_stream s;
    muser_detok_stream_init(&s, t);
    for (size_t i = 0; i <= n; i++) {
        size_t k = i < n ? muser_detok_stream_push(&s, ids[i], piece, cap)
                         : muser_detok_stream_flush(&s, piece, cap);
        if (k > cap || !fuzz_utf8_valid((const uint8_t *)piece, k))
            fuzz_fail(H, "stream emitted invalid UTF-8 or more than its cap");
    }
    free(piece);
}

static void use(const muser_tokenizer *t)
{
    const uint32_t nv = muser_tokenizer_n_vocab(t);
    if (nv == 0)
        fuzz_fail(H, "empty vocabulary loaded");
    const int32_t specials[4] = {muser_token_bos(t), muser_token_eos(t), muser_token_eot(t), -1};
    for (int i = 0; i < 3; i++)
        if (specials[i] < -1 || specials[i] >= (int32_t)nv)
            fuzz_fail(H, "a special id outside the vocabulary");
    (void)muser_token_is_eog(t, specials[0]);
    (void)muser_token_find(t, "<s>");
    (void)muser_tokenizer_add_bos(t);
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        for (int ps = 0; ps < 2; ps++) {
            int32_t *ids = NULL;
            size_t n = 0;
            muser_error err = {0};
            int rc = muser_tokenize(t, texts[k], strlen(texts[k]), ps, ps, &ids, &n, &err);
            if (rc != 0 && rc != MUSER_E_TOKENIZE) {
                fprintf(stderr, H ": %s\n", err.msg);
                fuzz_fail(H, "tokenize failed with something other than MUSER_E_TOKENIZE");
            }
            if (rc == 0) {
                for (size_t i = 0; i < n; i++)
                    if (ids[i] < 0 || (uint32_t)ids[i] >= nv)
                        fuzz_fail(H, "id outside the vocabulary");
                char *back = NULL;
                if (muser_detokenize(t, ids, n, &back, &err))
                    fuzz_fail(H, "detokenize refused the tokenizer's own ids");
                free(back);
                stream_all(t, ids, n);
            }
            free(ids);
        }
    int32_t all[TL_MAX + 16];
    uint32_t n = nv < TL_MAX + 8 ? nv : TL_MAX + 8;
    for (uint32_t i = 0; i < n; i++)
        all[i] = (int32_t)i;
    stream_all(t, all, n);
    for (uint32_t i = 0; i < n; i++)
        all[i] = (int32_t)(n - 1 - i);
    stream_all(t, all, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size, 0};
    const bool spm = fuzz_u8(&in) & 1;
    load_base(&base[spm], spm);
    for (int e = 0; e < 32 && fuzz_more(&in); e++)
        apply_edit(&in, base[spm].n);
    gguf_writer *w = gguf_writer_new(0);
    write_vals(w);
    gguf_file *f = NULL;
    muser_error err = {0};
    if (fuzz_write_open(w, &f, &err)) {
        fprintf(stderr, H ": writing the edited vocabulary failed: %s\n", err.msg);
        fuzz_fail(H, "the GGUF writer or reader refused the harness's own file");
    }
    muser_tokenizer *t = NULL;
    int rc = muser_tokenizer_load(&t, f, &err);
    if (rc) {
        if (rc > 0 || t || strncmp(err.msg, f->path, strlen(f->path)))
            fuzz_fail(H, "a refusal without a negative status and a message naming the file");
    } else {
        if (!t)
            fuzz_fail(H, "success without a tokenizer");
        gguf_close(f); /* nothing may point into the map after load */
        f = NULL;
        use(t);
        muser_tokenizer_free(t);
    }
    gguf_close(f);
    return 0;
}
