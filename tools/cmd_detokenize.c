/* cmd_detokenize.c — `muser detokenize`: the text of token ids, given as separate arguments or as
 * one string of ids separated by spaces and/or commas. Prints the text and a newline. */
#include "cli.h"
#include "tokenizer.h"
#include "util.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: muser detokenize [-m MODEL | --vocab o200k] IDS...\n\n"
            "Prints the text of the token ids (separate arguments, or one string such as\n"
            "\"15496, 995\"), followed by a newline.\n\n"
            "  -m MODEL         GGUF with tokenizer.ggml.* metadata (default: $MUSER_MODEL or\n"
            "                   %s)\n"
            "  --vocab o200k    use the built-in o200k vocabulary instead of a model\n",
            cli_default_model());
}

/* Append the ids in s (separated by spaces/commas) to ids; false on anything else. */
static bool parse_ids(const char *s, int32_t **ids, size_t *n, size_t *cap)
{
    char tok[32];
    for (;;) {
        while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n')
            s++;
        if (!*s)
            return true;
        size_t l = strcspn(s, " ,\t\n");
        if (l >= sizeof tok)
            return false;
        memcpy(tok, s, l);
        tok[l] = 0;
        int64_t v;
        if (!muser_parse_i64(tok, &v) || v < 0 || v > INT32_MAX)
            return false;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            int32_t *p = realloc(*ids, nc * sizeof *p);
            if (!p)
                return false;
            *ids = p;
            *cap = nc;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s += l;
    }
}

int cmd_detokenize(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *model = NULL, *vocab = NULL;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    bool any = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--vocab")) {
            if (i + 1 >= argc) {
                free(ids);
                return cli_usage_error("detokenize", "%s needs a value", a);
            }
            *(strcmp(a, "--vocab") ? &model : &vocab) = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            free(ids);
            return cli_usage_error("detokenize", "unknown option '%s'", a);
        } else {
            any = true;
            if (!parse_ids(a, &ids, &n, &cap)) {
                free(ids);
                return cli_usage_error("detokenize", "not a list of token ids: '%s'", a);
            }
        }
    }
    if (!any) {
        free(ids);
        return cli_usage_error("detokenize", "no token ids given");
    }
    if (model && vocab) {
        free(ids);
        return cli_usage_error("detokenize", "give -m or --vocab, not both");
    }
    if (vocab && strcmp(vocab, "o200k")) {
        free(ids);
        return cli_usage_error("detokenize", "unknown vocabulary '%s' (o200k)", vocab);
    }
    muser_error err = {0};
    muser_tokenizer *t = NULL;
    char *text = NULL;
    int rc = muser_tokenizer_open(&t, vocab ? NULL : (model ? model : cli_default_model()), vocab,
                                  &err);
    if (!rc)
        rc = muser_detokenize(t, ids, n, &text, &err);
    if (rc)
        fprintf(stderr, "muser detokenize: %s\n", err.msg);
    else {
        fputs(text, stdout);
        putchar('\n');
    }
    free(text);
    free(ids);
    muser_tokenizer_free(t);
    return rc ? 1 : 0;
}
