/* handoff_cli.h — the consumer side of remote prefill on the command line, shared by `muser run`
 * and `muser serve`: the --remote-prefill options, the client they make, and a prefill of the
 * prompt through it (docs/handoff.md). */
#ifndef MUSER_TOOLS_HANDOFF_CLI_H
#define MUSER_TOOLS_HANDOFF_CLI_H

#include "generate.h"
#include "handoff/handoff.h"

typedef struct cli_remote {
    const char *addr;            /* --remote-prefill HOST:PORT; NULL: prefill here */
    const char *tls_dir;         /* --tls-dir */
    const char *key_file;        /* --hmac-key-file */
    const char *ledger;          /* --ledger; NULL: the default */
    uint32_t timeout_ms;         /* --handoff-timeout-ms; 0: the default */
} cli_remote;

/* If argv[*i] is one of the options, consume it and its value and return 1; 0 if it is not one;
 * -1 after a usage error. */
int cli_remote_parse(const char *cmd, int argc, char **argv, int *i, cli_remote *r);
/* After parsing: the options that need each other (a usage error: CLI_EXIT_USAGE; else 0). */
int cli_remote_check(const char *cmd, const cli_remote *r);
void cli_remote_help(FILE *f);
/* The client for r (*out NULL without --remote-prefill), its model identity from m and the file at
 * model_path, a wait ending when *interrupt is set (may be NULL); errors printed as one line.
 * Returns 0 or 1. */
int cli_remote_client(const char *cmd, const cli_remote *r, const muser_model *m, const char *model_path,
                      volatile sig_atomic_t *interrupt, handoff_client **out);
/* gen_prefill through the producer: the prompt's cache installed in g's sequence, its last row's
 * logits in g->logits, the sampler told about the tokens. */
int gen_prefill_remote(gen_ctx *g, handoff_client *c, const int32_t *toks, size_t n, handoff_stats *st,
                       muser_error *err);

#endif
