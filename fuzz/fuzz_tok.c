/* fuzz_tok.c — libFuzzer entry for the tokenizers (src/tokenizer.c): arbitrary bytes into
 * muser_tokenize, against several vocabularies loaded once in LLVMFuzzerInitialize:
 *   0  models/default.gguf's byte-level BPE (gpt2, pre "gpt-2", 4096 tokens);
 *   1  a small SentencePiece vocabulary built here (byte fallback <0xNN>, scores, '▁');
 *   2  a small byte-level BPE with pre "gpt-4o" (the o200k regex, ignore_merges);
 *   3  the same vocabulary with pre "llama3";   4  with pre "qwen2";
 *   5  the peer Phi-3 SentencePiece vocabulary when $MUSER_SHARED_DIR has it (else vocab 1);
 *   6  the real o200k vocabulary (src/vocab.h, 200k tokens) when MUSER_FUZZ_O200K=1 — a few
 *      seconds to build, so long runs only — else vocab 2.
 * Input: byte 0 picks the vocabulary (low bits), parse_special (bit 4) and add_bos (bit 5); the
 * rest is the text. Checks (a failure aborts):
 *   - invalid UTF-8 (judged by fuzz_common.h's own validator) -> MUSER_E_TOKENIZE, nothing out;
 *   - valid UTF-8 -> success, every id inside the vocabulary;
 *   - byte-level BPE: muser_detokenize gives the text back exactly (after the BOS, if added);
 *     SentencePiece without parse_special and without '▁' in the text: the same;
 *   - the streaming detokenizer over the produced ids, and over arbitrary ids made from the
 *     input, emits only valid UTF-8 and never more than its cap; over the produced ids it
 *     concatenates to muser_detokenize's text. */
#include "fuzz_common.h"
#include "fuzz_vocab.h"
#include "tokenizer.h"
#include "vocab.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define H "fuzz_tok"
#define N_VOCABS 7

static muser_tokenizer *vocabs[N_VOCABS];
static bool byte_level[N_VOCABS];

static void die_err(const char *what, const muser_error *err)
{
    fprintf(stderr, H ": init: %s: %s\n", what, err->msg);
    abort();
}

static muser_tokenizer *load_from_writer(gguf_writer *w)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    muser_tokenizer *t = NULL;
    if (fuzz_write_open(w, &f, &err) || muser_tokenizer_load(&t, f, &err))
        die_err("small vocabulary", &err);
    gguf_close(f);
    return t;
}

/* Load a small vocabulary of fuzz_vocab.h. */
static muser_tokenizer *small_vocab(bool spm, const char *pre)
{
    tlist *l = calloc(1, sizeof *l);
    if (spm)
        tl_build_spm(l);
    else
        tl_build_bpe(l);
    gguf_writer *w = gguf_writer_new(0);
    tl_write(l, w, spm, pre);
    tl_free(l);
    free(l);
    return load_from_writer(w);
}

static muser_tokenizer *from_file(const char *path)
{
    muser_error err = {0};
    gguf_file *f = NULL;
    muser_tokenizer *t = NULL;
    if (gguf_open(&f, path, &err) || muser_tokenizer_load(&t, f, &err))
        die_err(path, &err);
    gguf_close(f);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char path[1024];
    const char *root = getenv("MUSER_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/models/default.gguf", root ? root : MUSER_FUZZ_ROOT);
    vocabs[0] = from_file(path);
    if (strcmp(muser_tokenizer_pre(vocabs[0]), "gpt-2"))
        fprintf(stderr, H ": note: %s has pre '%s'\n", path, muser_tokenizer_pre(vocabs[0]));
    vocabs[1] = small_vocab(true, NULL);
    vocabs[2] = small_vocab(false, "gpt-4o");
    vocabs[3] = small_vocab(false, "llama3");
    vocabs[4] = small_vocab(false, "qwen2");
    const char *shared = getenv("MUSER_SHARED_DIR");
    snprintf(path, sizeof path, "%s/peer-tests/tokenizer/ggml-vocab-phi-3.gguf",
             shared ? shared : "");
    if (shared && access(path, R_OK) == 0) {
        vocabs[5] = from_file(path);
        fprintf(stderr, H ": vocabulary 5 is %s\n", path);
    } else {
        vocabs[5] = vocabs[1];
        fprintf(stderr, H ": no $MUSER_SHARED_DIR Phi-3 vocabulary; vocabulary 5 = the small "
                        "SentencePiece one\n");
    }
    vocabs[6] = vocabs[2];
    const char *o200k = getenv("MUSER_FUZZ_O200K");
    if (o200k && !strcmp(o200k, "1")) {
        muser_vocab v;
        muser_error err = {0};
        if (muser_vocab_o200k(NULL, &v, &err) || muser_tokenizer_load_vocab(&vocabs[6], &v, &err))
            die_err("o200k", &err);
        muser_vocab_free(&v);
        fprintf(stderr, H ": vocabulary 6 is o200k (%u tokens)\n",
                muser_tokenizer_n_vocab(vocabs[6]));
    }
    for (int i = 0; i < N_VOCABS; i++)
        byte_level[i] = !strcmp(muser_tokenizer_model(vocabs[i]), "gpt2");
    return 0;
}

/* Stream ids through the detokenizer: every piece valid UTF-8 and within the cap; the joined
 * text into *joined (malloc'ed) when asked. */
static void stream_check(const muser_tokenizer *t, const int32_t *ids, size_t n, char **joined,
                         size_t *joined_len)
{
    size_t cap = muser_detok_stream_min_cap(t);
    char *piece = malloc(cap + 8);
    size_t total = 0, room = 0;
    char *all = NULL;
    muser_detok_stream s;
    muser_detok_stream_init(&s, t);
    for (size_t i = 0; i <= n; i++) {
        memset(piece + cap, 0x5A, 8);
        size_t k = i < n ? muser_detok_stream_push(&s, ids[i], piece, cap)
                         : muser_detok_stream_flush(&s, piece, cap);
        if (k > cap)
            fuzz_fail(H, "stream piece longer than its cap");
        for (int g = 0; g < 8; g++)
            if ((uint8_t)piece[cap + g] != 0x5A)
                fuzz_fail(H, "stream wrote past its cap");
        if (!fuzz_utf8_valid((const uint8_t *)piece, k))
            fuzz_fail(H, "stream emitted invalid UTF-8");
        if (joined) {
            if (total + k + 1 > room) {
                room = (total + k + 1) * 2;
                all = realloc(all, room);
            }
            memcpy(all + total, piece, k);
            total += k;
        }
    }
    free(piece);
    if (joined) {
        if (!all)
            all = calloc(1, 1);
        *joined = all;
        *joined_len = total;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const int v = (data[0] & 15) % N_VOCABS;
    const bool parse_special = data[0] & 16, add_bos = data[0] & 32;
    const muser_tokenizer *t = vocabs[v];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const uint32_t nv = muser_tokenizer_n_vocab(t);

    int32_t *ids = NULL;
    size_t n = 0;
    muser_error err = {0};
    int rc = muser_tokenize(t, text, len, add_bos, parse_special, &ids, &n, &err);
    const bool valid = fuzz_utf8_valid((const uint8_t *)text, len);
    if (!valid) {
        if (rc != MUSER_E_TOKENIZE || ids || n)
            fuzz_fail(H, "invalid UTF-8 not refused with MUSER_E_TOKENIZE");
        if (!strstr(err.msg, "invalid UTF-8"))
            fuzz_fail(H, "invalid UTF-8 refused without saying so");
    } else {
        if (rc != 0) {
            fprintf(stderr, H ": vocab %d: %s\n", v, err.msg);
            fuzz_fail(H, "valid UTF-8 not tokenized");
        }
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= nv)
                fuzz_fail(H, "id outside the vocabulary");
        size_t skip = 0;
        if (add_bos && muser_token_bos(t) >= 0) {
            if (n == 0 || ids[0] != muser_token_bos(t))
                fuzz_fail(H, "add_bos without BOS first");
            skip = 1;
        }
        char *back = NULL;
        if (muser_detokenize(t, ids + skip, n - skip, &back, &err))
            fuzz_fail(H, "detokenize refused the tokenizer's own ids");
        /* The text may hold NULs: lengths come from the token bytes and the stream. */
        size_t sum = 0, bl;
        for (size_t i = skip; i < n; i++)
            if (muser_token_bytes(t, ids[i], &bl))
                sum += bl;
        char *joined = NULL;
        size_t jl = 0;
        stream_check(t, ids + skip, n - skip, &joined, &jl);
        if (!(jl == sum || (!byte_level[v] && jl + 1 == sum)) || memcmp(joined, back, jl) ||
            back[jl] != 0)
            fuzz_fail(H, "the streamed text differs from muser_detokenize's");
        const bool must_round_trip =
            byte_level[v] || (!parse_special && !memmem(text, len, "\xe2\x96\x81", 3));
        if (must_round_trip && (jl != len || memcmp(joined, text, len))) {
            fprintf(stderr, H ": vocab %d: '%.*s' came back as '%.*s'\n", v, (int)len, text,
                    (int)jl, joined);
            fuzz_fail(H, "detokenize(tokenize(text)) != text");
        }
        free(joined);
        free(back);
    }
    free(ids);

    /* Arbitrary ids (byte tokens that split characters, specials, out-of-range ids). */
    size_t na = len / 2;
    int32_t *arb = malloc((na ? na : 1) * sizeof *arb);
    for (size_t i = 0; i < na; i++) {
        uint32_t x = (uint32_t)(uint8_t)text[2 * i] | (uint32_t)(uint8_t)text[2 * i + 1] << 8;
        arb[i] = (x == 0xFFFF) ? -1 : (int32_t)(x % (nv + 1)); /* nv itself is out of range */
    }
    stream_check(t, arb, na, NULL, NULL);
    free(arb);
    return 0;
}
