/* test_tok_peer.c — muser's tokenizers against another engine's test vectors: the vocabulary-only
 * GGUFs in $MUSER_SHARED_DIR/peer-tests/tokenizer (GPT-2 byte-level BPE, Phi-3 SentencePiece)
 * with the ids Hugging Face `tokenizers` produced for each input string. Every case must match
 * exactly, and every case must also round-trip (decode(encode(s)) == s). Skips (77) when the
 * shared directory is absent; the vectors are never copied into the repository. */
#include "check.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const char SEP[] = "\n__ggml_vocab_test__\n";

static void run_vocab(const char *dir, const char *name, int *n_cases)
{
    char path[1024], inp_path[1100], out_path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    muser_error err = {0};
    gguf_file *f = NULL;
    CHECK_OK(gguf_open(&f, path, &err), &err);
    if (!f)
        return;
    muser_tokenizer *t = NULL;
    CHECK_OK(muser_tokenizer_load(&t, f, &err), &err);
    gguf_close(f); /* the tokenizer must not point into the map */
    if (!t)
        return;
    size_t ni, no;
    char *inp = check_read_file(inp_path, &ni), *outs = check_read_file(out_path, &no);
    CHECKF(inp && outs, "%s: cannot read .inp/.out", name);
    if (!inp || !outs) {
        free(inp);
        free(outs);
        muser_tokenizer_free(t);
        return;
    }
    char *text = inp, *line = outs;
    int k = 0;
    for (;;) {
        char *sep = strstr(text, SEP);
        if (!sep)
            break;
        *sep = 0;
        char *eol = strchr(line, '\n');
        CHECKF(eol != NULL, "%s: .out has fewer lines than .inp has strings", name);
        if (!eol)
            break;
        *eol = 0;
        int32_t want[4096];
        size_t nw = 0;
        for (char *p = line, *end; *p && nw < 4096; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        size_t len = strlen(text);
        CHECK_OK(muser_tokenize(t, text, len, false, false, &ids, &n, &err), &err);
        bool same = n == nw && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
        CHECKF(same, "%s case %d ('%.40s'): %zu ids, want %zu", name, k, text, n, nw);
        if (!same) {
            fprintf(stderr, "  got: ");
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, "%d ", ids[i]);
            fprintf(stderr, "\n  want: %s\n", line);
        }
        char *back = NULL;
        CHECK_OK(muser_detokenize(t, ids, n, &back, &err), &err);
        CHECKF(back && !strcmp(back, text), "%s case %d: round trip gave '%.40s'", name, k,
               back ? back : "(null)");
        free(back);
        free(ids);
        k++;
        text = sep + strlen(SEP);
        line = eol + 1;
    }
    CHECKF(k >= 40, "%s: only %d cases read", name, k);
    *n_cases += k;
    free(inp);
    free(outs);
    muser_tokenizer_free(t);
}

int main(void)
{
    const char *shared = getenv("MUSER_SHARED_DIR");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/peer-tests/tokenizer", shared ? shared : "../shared");
    char probe[1000];
    snprintf(probe, sizeof probe, "%s/ggml-vocab-gpt-2.gguf", dir);
    FILE *p = fopen(probe, "rb");
    if (!p)
        SKIP("peer tokenizer vectors not found at %s (set MUSER_SHARED_DIR)", dir);
    fclose(p);
    int n_cases = 0;
    run_vocab(dir, "ggml-vocab-gpt-2.gguf", &n_cases);
    run_vocab(dir, "ggml-vocab-phi-3.gguf", &n_cases);
    printf("peer cases: %d\n", n_cases);
    return check_report("tok_peer");
}
