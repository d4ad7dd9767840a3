/* test_tok.c — tokenizer behaviour on hostile input, for every vocabulary at hand (the built-in
 * o200k always; the GPT-2 and Phi-3 peer vocabularies when $MUSER_SHARED_DIR has them):
 *   - encode -> decode gives the input back: empty, whitespace runs, emoji + ZWJ sequences, CJK,
 *     mixed scripts, numbers, a 10k-character word, control characters;
 *   - invalid UTF-8 (stray continuation, overlong, surrogate, truncated) is MUSER_E_TOKENIZE
 *     naming the byte offset;
 *   - the streaming detokenizer, fed one token at a time, only ever emits whole UTF-8
 *     characters and concatenates to the same text (emoji split over byte tokens included);
 *   - special tokens are matched only with parse_special;
 *   - exact ids for a few strings on the GPT-2 vocabulary. */
#include "check.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

/* Is s[0..n) valid UTF-8 with nothing cut off? */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!need || i + need > n)
            return false;
        for (unsigned k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += need;
    }
    return true;
}

static void round_trip(const muser_tokenizer *t, const char *name, const char *text, size_t len)
{
    muser_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = muser_tokenize(t, text, len, false, false, &ids, &n, &err);
    CHECKF(rc == 0, "%s: tokenize '%.30s' failed: %s", name, text, err.msg);
    if (rc)
        return;
    CHECKF(len == 0 || n > 0, "%s: '%.30s' gave no tokens", name, text);
    char *back = NULL;
    CHECK_OK(muser_detokenize(t, ids, n, &back, &err), &err);
    CHECKF(back && strlen(back) == len && !memcmp(back, text, len), "%s: round trip of '%.30s'",
           name, text);
    free(back);

    /* stream it one token at a time */
    size_t cap = muser_detok_stream_min_cap(t);
    char *piece = malloc(cap), *joined = malloc(len + cap + 1);
    size_t o = 0;
    bool whole = true;
    muser_detok_stream s;
    muser_detok_stream_init(&s, t);
    for (size_t i = 0; i < n; i++) {
        size_t k = muser_detok_stream_push(&s, ids[i], piece, cap);
        whole = whole && valid_utf8((unsigned char *)piece, k) && o + k <= len;
        if (o + k <= len)
            memcpy(joined + o, piece, k);
        o += k;
    }
    size_t k = muser_detok_stream_flush(&s, piece, cap);
    CHECKF(k == 0, "%s: flush after valid text returned %zu bytes", name, k);
    CHECKF(whole, "%s: stream emitted broken UTF-8 for '%.30s'", name, text);
    CHECKF(o == len && !memcmp(joined, text, len), "%s: stream of '%.30s' differs", name, text);
    free(piece);
    free(joined);
    free(ids);
}

static void hostile(const muser_tokenizer *t, const char *name)
{
    static const char *const cases[] = {
        "", " ", "  ", "     ", "\t", "\n", "\n\n\n\n", "\r\n\r\n", " \t \n \t\t\n  ",
        "Hello world", " leading space", "trailing space ", "multiple   inner   spaces",
        "👨‍👩‍👧‍👦", "🏳️‍🌈 and 👩🏽‍💻 and 🦙🦙🦙", "😶‍🌫️", "1️⃣#️⃣",
        "我想在apple工作1314151天～", "日本語のテキスト", "한국어", "ภาษาไทย",
        "mixed: Ελληνικά русский עברית العربية हिन्दी 中文 English",
        "0", "1234567890", "3.14159 -2e10 1,000,000 ¾", "e\xcc\x81 \xef\xac\x81" "x",
        "\x01\x02\x7f control bytes", "tab\there", "\xc2\xa0" "nbsp\xe2\x80\x83" "em",
        "<|endoftext|> <s> </s> [INST]", "''''\"\"\"```", "a'b's'S'LL",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        round_trip(t, name, cases[i], strlen(cases[i]));

    /* a 10k-character word, and a 10k run of one emoji (4-byte chars) */
    size_t n = 10000;
    const char *env = getenv("MUSER_SANITIZED");
    if (env && !strcmp(env, "1"))
        n = 3000;
    char *big = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + (i * 7 + i / 13) % 26);
    round_trip(t, name, big, n);
    for (size_t i = 0; i < n; i++)
        memcpy(big + 4 * i, "\xf0\x9f\xa6\x99", 4);
    round_trip(t, name, big, 4 * n);
    memset(big, ' ', n);
    round_trip(t, name, big, n);
    free(big);

    /* invalid UTF-8 */
    static const struct {
        const char *s;
        size_t len, offset;
    } bad[] = {
        {"ab\x80", 3, 2},          /* stray continuation */
        {"\xc0\xaf", 2, 0},        /* overlong '/' */
        {"ok \xed\xa0\x80", 6, 3}, /* UTF-16 surrogate */
        {"xyz\xe6\x97", 5, 3},     /* truncated at the end */
        {"\xf5\x80\x80\x80", 4, 0},/* above U+10FFFF */
        {"a\xffz", 3, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        muser_error err = {0};
        int32_t *ids = (int32_t *)1;
        size_t k = 7;
        int rc = muser_tokenize(t, bad[i].s, bad[i].len, false, false, &ids, &k, &err);
        char want[32];
        snprintf(want, sizeof want, "offset %zu", bad[i].offset);
        CHECKF(rc == MUSER_E_TOKENIZE && strstr(err.msg, want) && !ids && k == 0,
               "%s: invalid UTF-8 case %zu: rc %d, '%s'", name, i, rc, err.msg);
    }
}

/* Emoji whose bytes are spread over several tokens: the stream holds partial characters back. */
static void stream_partial(const muser_tokenizer *t, const char *name)
{
    muser_error err = {0};
    const char *text = "🦙 😶‍🌫️ ✅ 𝕎";
    int32_t *ids;
    size_t n;
    CHECK_OK(muser_tokenize(t, text, strlen(text), false, false, &ids, &n, &err), &err);
    size_t held = 0;
    muser_detok_stream s;
    muser_detok_stream_init(&s, t);
    char out[1024];
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        muser_token_bytes(t, ids[i], &bl);
        size_t k = muser_detok_stream_push(&s, ids[i], out, sizeof out);
        if (k < bl)
            held++;
        CHECK(valid_utf8((unsigned char *)out, k));
    }
    CHECKF(n > 8 && held > 0, "%s: expected emoji split over tokens (n=%zu, held=%zu)", name, n,
           held);
    free(ids);

    /* a broken sequence: lead byte, then a byte that cannot continue it -> U+FFFD, then text */
    if (!strcmp(muser_tokenizer_model(t), "gpt2")) {
        int32_t lead = muser_token_find(t, "\xc3\xb0"); /* GPT-2 form of byte 0xF0 */
        int32_t a = muser_token_find(t, "a");
        CHECK(lead >= 0 && a >= 0);
        if (lead >= 0 && a >= 0) {
            muser_detok_stream_init(&s, t);
            CHECK(muser_detok_stream_push(&s, lead, out, sizeof out) == 0);
            size_t k = muser_detok_stream_push(&s, a, out, sizeof out);
            CHECKF(k == 4 && !memcmp(out, "\xef\xbf\xbd" "a", 4), "%s: broken lead byte", name);
            CHECK(muser_detok_stream_push(&s, lead, out, sizeof out) == 0);
            k = muser_detok_stream_flush(&s, out, sizeof out);
            CHECKF(k == 3 && !memcmp(out, "\xef\xbf\xbd", 3), "%s: flush of a lone lead", name);
        }
    }
}

static void specials(const muser_tokenizer *t, const char *name, const char *special_text)
{
    muser_error err = {0};
    int32_t sid = muser_token_find(t, special_text);
    CHECKF(sid >= 0, "%s: %s not found", name, special_text);
    char text[128];
    snprintf(text, sizeof text, "x%sy", special_text);
    int32_t *ids;
    size_t n;
    CHECK_OK(muser_tokenize(t, text, strlen(text), false, true, &ids, &n, &err), &err);
    int hits = 0;
    for (size_t i = 0; i < n; i++)
        hits += ids[i] == sid;
    CHECKF(hits == 1, "%s: parse_special found %d of %s", name, hits, special_text);
    free(ids);
    CHECK_OK(muser_tokenize(t, text, strlen(text), false, false, &ids, &n, &err), &err);
    hits = 0;
    for (size_t i = 0; i < n; i++)
        hits += ids[i] == sid;
    CHECKF(hits == 0, "%s: %s matched without parse_special", name, special_text);
    free(ids);
    /* BOS only when asked, and only if there is one */
    CHECK_OK(muser_tokenize(t, "hi", 2, true, false, &ids, &n, &err), &err);
    int32_t bos = muser_token_bos(t);
    CHECK(bos < 0 || (n >= 1 && ids[0] == bos));
    free(ids);
}

static muser_tokenizer *open_peer(const char *dir, const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *p = fopen(path, "rb");
    if (!p) {
        printf("note: %s absent, its cases skipped\n", path);
        return NULL;
    }
    fclose(p);
    muser_error err = {0};
    muser_tokenizer *t = NULL;
    CHECK_OK(muser_tokenizer_open(&t, path, NULL, &err), &err);
    return t;
}

int main(void)
{
    muser_error err = {0};
    muser_tokenizer *o200k = NULL;
    CHECK_OK(muser_tokenizer_open(&o200k, NULL, "o200k", &err), &err);
    if (o200k) {
        hostile(o200k, "o200k");
        stream_partial(o200k, "o200k");
        specials(o200k, "o200k", "<|endoftext|>");
        muser_tokenizer_free(o200k);
    }

    const char *shared = getenv("MUSER_SHARED_DIR");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/peer-tests/tokenizer", shared ? shared : "../shared");
    muser_tokenizer *gpt2 = open_peer(dir, "ggml-vocab-gpt-2.gguf");
    if (gpt2) {
        hostile(gpt2, "gpt-2");
        stream_partial(gpt2, "gpt-2");
        specials(gpt2, "gpt-2", "<|endoftext|>");
        static const struct {
            const char *text;
            int32_t ids[8];
            size_t n;
        } exact[] = {
            {"Hello world", {15496, 995}, 2},
            {" Hello, world!", {18435, 11, 995, 0}, 4},
            {"   Hello", {220, 220, 18435}, 3},
            {"333333333", {24840, 2091, 20370}, 3},
        };
        for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
            int32_t *ids;
            size_t n;
            CHECK_OK(muser_tokenize(gpt2, exact[i].text, strlen(exact[i].text), false, false, &ids,
                                    &n, &err),
                     &err);
            CHECKF(n == exact[i].n && !memcmp(ids, exact[i].ids, n * sizeof *ids), "gpt-2: '%s'",
                   exact[i].text);
            free(ids);
        }
        CHECK(!strcmp(muser_tokenizer_model(gpt2), "gpt2"));
        CHECK(!strcmp(muser_tokenizer_pre(gpt2), "gpt-2"));
        CHECK(muser_token_eos(gpt2) == 50256 && muser_token_is_eog(gpt2, 50256));
        CHECK(!muser_tokenizer_add_bos(gpt2));
        char *text = NULL;
        int32_t bad_id = 50257;
        CHECK(muser_detokenize(gpt2, &bad_id, 1, &text, &err) == MUSER_E_ARG && !text);
        muser_tokenizer_free(gpt2);
    }
    muser_tokenizer *phi3 = open_peer(dir, "ggml-vocab-phi-3.gguf");
    if (phi3) {
        hostile(phi3, "phi-3");
        stream_partial(phi3, "phi-3");
        specials(phi3, "phi-3", "<|end|>");
        CHECK(!strcmp(muser_tokenizer_model(phi3), "llama"));
        CHECK(muser_tokenizer_add_bos(phi3) && muser_token_bos(phi3) == 1);
        CHECK(muser_token_is_eog(phi3, 32000) && muser_token_is_eog(phi3, 32007));
        /* BOS then text: the space SentencePiece added is still stripped */
        int32_t *ids;
        size_t n;
        char *text = NULL;
        CHECK_OK(muser_tokenize(phi3, "Hi there", 8, true, false, &ids, &n, &err), &err);
        CHECK(n >= 2 && ids[0] == 1);
        CHECK_OK(muser_detokenize(phi3, ids + 1, n - 1, &text, &err), &err);
        CHECK(text && !strcmp(text, "Hi there"));
        free(text);
        free(ids);
        muser_tokenizer_free(phi3);
    }
    return check_report("tok");
}
