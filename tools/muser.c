/* muser.c — the command-line tool: one binary, one sub-command per job, each with --help. */
#include "cli.h"
#include "util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const cli_command commands[] = {
    {"run", "generate text from a prompt, streaming", cmd_run},
    {"chat", "interactive chat with the model's template", cmd_chat},
    {"tokenize", "print the token ids of a text", cmd_tokenize},
    {"detokenize", "print the text of token ids", cmd_detokenize},
    {"inspect", "describe a GGUF: hyper-parameters, tokenizer, tensors", cmd_inspect},
    {"quantize", "convert a GGUF's matrices to f16/q8_0/q4_k/q6_k/mix", cmd_quantize},
    {"synth", "write a deterministic random model (tiny/small/glimmer presets)", cmd_synth},
    {"eval", "teacher-forced logits for a token list", cmd_eval},
    {"serve", "an OpenAI-compatible HTTP server", cmd_serve},
    {"prefill-serve", "the remote-prefill producer: stream prompts' KV caches over TLS", cmd_prefill_serve},
    {"parity", "compare a fast backend with the oracle (SPEC §4)", cmd_parity},
    {"bench", "prefill and decode speed", cmd_bench},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "muser %s — inference engine for the Muse Glimmer model family\n\n"
               "usage: muser <command> [options]    (muser <command> --help for details)\n\n"
               "commands:\n",
            MUSER_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\noptions:\n  -h, --help     this help\n  --version      print the version\n");
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "muser %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see: muser %s --help)\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return 1;
    return 0;
}

char *cli_read_file(const char *path, size_t *n)
{
    const bool std_in = !strcmp(path, "-");
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (size_t got; b && (got = fread(b + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    const bool failed = ferror(f);
    if (!std_in)
        fclose(f);
    if (failed) {
        free(b);
        return NULL;
    }
    if (b) {
        b[len] = 0;
        *n = len;
    }
    return b;
}

const char *cli_default_model(void)
{
    const char *env = getenv("MUSER_MODEL");
    if (env && *env)
        return env;
    return MUSER_DEFAULT_MODEL;
}

bool cli_parse_token_list(const char *s, int32_t **out, uint32_t *n)
{
    uint32_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return false;
    uint32_t k = 0;
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char buf[32];
        int64_t v;
        if (len == 0 || len >= sizeof buf)
            goto bad;
        memcpy(buf, p, len);
        buf[len] = 0;
        if (!muser_parse_i64(buf, &v) || v < 0 || v > INT32_MAX)
            goto bad;
        ids[k++] = (int32_t)v;
        if (!e)
            break;
        p = e + 1; /* a trailing comma ends the list: "5," is the one-id list */
    }
    if (k == 0)
        goto bad;
    *out = ids;
    *n = k;
    return true;
bad:
    free(ids);
    return false;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("muser %s\n", MUSER_VERSION);
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "muser: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
