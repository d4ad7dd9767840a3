/* cmd_tokenize.c — `muser tokenize`: the token ids of a text, on one line, nothing else on stdout.
 * Needs only a GGUF's vocabulary (vocab-only files work) or a built-in vocabulary (--vocab o200k).
 * --batch FILE tokenizes many strings in one run: FILE holds them separated by lines reading
 * __ggml_vocab_test__ (the format of the peer test vectors), and each string's ids go on their
 * own output line. --export-vocab OUT writes the chosen vocabulary as a vocabulary-only GGUF. */
#include "cli.h"
#include "tokenizer.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: muser tokenize [-m MODEL | --vocab o200k] [--bos] [--special] TEXT\n"
            "       muser tokenize [-m MODEL | --vocab o200k] [--bos] [--special] -f FILE\n"
            "       muser tokenize [-m MODEL | --vocab o200k] [--bos] [--special] --batch FILE\n"
            "       muser tokenize --vocab o200k --export-vocab OUT.gguf\n\n"
            "Prints the token ids of TEXT separated by spaces on one line.\n\n"
            "  -m MODEL         GGUF with tokenizer.ggml.* metadata (default: $MUSER_MODEL or\n"
            "                   %s)\n"
            "  --vocab o200k    use the built-in o200k vocabulary instead of a model\n"
            "  --bos            prepend the BOS token (if the vocabulary has one)\n"
            "  --special        match control/special token texts such as <|endoftext|>\n"
            "  -f FILE          tokenize the whole content of FILE\n"
            "  --batch FILE     strings separated by lines '__ggml_vocab_test__'; one line of ids\n"
            "                   per string\n"
            "  --export-vocab OUT  write the vocabulary as a vocabulary-only GGUF and exit\n",
            cli_default_model());
}

static int print_ids(const muser_tokenizer *t, const char *text, size_t len, bool bos,
                     bool special)
{
    int32_t *ids;
    size_t n;
    muser_error err = {0};
    if (muser_tokenize(t, text, len, bos, special, &ids, &n, &err)) {
        fprintf(stderr, "muser tokenize: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}

static int export_vocab(const char *vocab, const char *out)
{
    if (!vocab || strcmp(vocab, "o200k"))
        return cli_usage_error("tokenize", "--export-vocab needs --vocab o200k");
    muser_error err = {0};
    muser_vocab v;
    if (muser_vocab_o200k(NULL, &v, &err)) {
        fprintf(stderr, "muser tokenize: %s\n", err.msg);
        return 1;
    }
    gguf_writer *w = gguf_writer_new(0);
    int rc = w ? muser_vocab_write_gguf(&v, w, &err) : MUSER_E_NOMEM;
    if (!rc)
        rc = gguf_writer_set_str(w, "general.architecture", "vocab-only");
    if (!rc)
        rc = gguf_writer_begin(w, out, &err);
    if (!rc)
        rc = gguf_writer_finish(w, &err);
    gguf_writer_free(w);
    muser_vocab_free(&v);
    if (rc) {
        fprintf(stderr, "muser tokenize: %s: %s\n", out, err.msg[0] ? err.msg : "write failed");
        return 1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *model = NULL, *vocab = NULL, *text = NULL, *file = NULL, *batch = NULL,
               *export_to = NULL;
    bool bos = false, special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **val = !strcmp(a, "-m") || !strcmp(a, "--model") ? &model
                           : !strcmp(a, "--vocab")                   ? &vocab
                           : !strcmp(a, "-f") || !strcmp(a, "--file") ? &file
                           : !strcmp(a, "--batch")                   ? &batch
                           : !strcmp(a, "--export-vocab")            ? &export_to
                                                                     : NULL;
        if (val) {
            if (i + 1 >= argc)
                return cli_usage_error("tokenize", "%s needs a value", a);
            *val = argv[++i];
        } else if (!strcmp(a, "--bos"))
            bos = true;
        else if (!strcmp(a, "--special"))
            special = true;
        else if (a[0] == '-' && a[1] && strcmp(a, "--"))
            return cli_usage_error("tokenize", "unknown option '%s'", a);
        else {
            if (!strcmp(a, "--")) {
                if (++i >= argc)
                    break;
                a = argv[i];
            }
            if (text)
                return cli_usage_error("tokenize", "one TEXT only (quote it): '%s'", a);
            text = a;
        }
    }
    if (model && vocab)
        return cli_usage_error("tokenize", "give -m or --vocab, not both");
    if (vocab && strcmp(vocab, "o200k"))
        return cli_usage_error("tokenize", "unknown vocabulary '%s' (o200k)", vocab);
    if (export_to)
        return export_vocab(vocab, export_to);
    if (!!text + !!file + !!batch != 1)
        return cli_usage_error("tokenize", "give exactly one of TEXT, -f FILE, --batch FILE");

    char *content = NULL;
    size_t clen = 0;
    if (file || batch) {
        content = cli_read_file(file ? file : batch, &clen);
        if (!content) {
            fprintf(stderr, "muser tokenize: %s: cannot read\n", file ? file : batch);
            return 1;
        }
    }
    muser_error err = {0};
    muser_tokenizer *t = NULL;
    if (muser_tokenizer_open(&t, vocab ? NULL : (model ? model : cli_default_model()), vocab,
                             &err)) {
        fprintf(stderr, "muser tokenize: %s\n", err.msg);
        free(content);
        return 1;
    }
    int rc = 0;
    if (text)
        rc = print_ids(t, text, strlen(text), bos, special);
    else if (file)
        rc = print_ids(t, content, clen, bos, special);
    else {
        static const char sep[] = "\n__ggml_vocab_test__\n";
        for (char *s = content; !rc;) {
            char *e = strstr(s, sep);
            if (!e)
                break; /* text after the last separator is not a case */
            rc = print_ids(t, s, (size_t)(e - s), bos, special);
            s = e + sizeof sep - 1;
        }
    }
    muser_tokenizer_free(t);
    free(content);
    return rc;
}
