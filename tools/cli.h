/* cli.h — what the sub-commands of tools/muser.c share: usage errors exit 2, a missing or corrupt
 * model is a one-line error and exit 1. Each sub-command lives in tools/cmd_<name>.c and has
 * --help. */
#ifndef MUSER_CLI_H
#define MUSER_CLI_H

#include "muser.h"

#include <stdio.h>

#define CLI_EXIT_USAGE 2

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv); /* argv[0] is the sub-command name */
} cli_command;

int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_prefill_serve(int argc, char **argv);
int cmd_parity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);

/* Print "muser <cmd>: <message>" and the hint to stderr; return CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True if argv has -h or --help. */
int cli_wants_help(int argc, char **argv);
/* "1,2,3" -> malloc'ed ids. False on garbage, empty items, values outside [0, INT32_MAX] or an
 * empty list; a trailing comma ends the list ("5," is one id). */
bool cli_parse_token_list(const char *s, int32_t **out, uint32_t *n);
/* The model path: -m value, else $MUSER_MODEL, else the embedded default (models/default.gguf). */
const char *cli_default_model(void);
/* The whole content of path ("-": standard input), NUL-terminated, its length in *n; NULL (errno
 * set) when it cannot be read. Free with free(). */
char *cli_read_file(const char *path, size_t *n);

#endif
