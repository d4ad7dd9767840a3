/* cmd_run.c — `muser run`: generate text from a prompt and stream it to stdout.
 *
 * Load (progress on stderr) -> tokenize -> prefill through the batch route (or, with
 * --remote-prefill, install the cache a producer prefilled: handoff_cli.h) -> sample/print/forward
 * until EOS/EOT, -n tokens, a full context or Ctrl-C -> speeds on stderr. stdout carries only the
 * generated text (the prompt too with --echo), so the output can be piped. */
#include "generate.h"
#include "handoff_cli.h"

#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void run_help(FILE *f)
{
    fprintf(f, "usage: muser run [-m MODEL] (-p PROMPT | -f FILE) [options]\n\n"
               "Generate text from PROMPT and stream it to stdout; progress, the seed and speeds\n"
               "go to stderr. Stops at an end-of-generation token, after -n tokens, when the\n"
               "context is full, or on Ctrl-C.\n\n"
               "options:\n"
               "  -p, --prompt TEXT       the prompt\n"
               "  -f, --file FILE         the prompt is FILE's content (- : standard input)\n"
               "  --special               parse special-token texts (e.g. <|end|>) in the prompt\n"
               "  --no-bos                do not prepend the BOS token\n"
               "  --echo                  print the prompt before the generation\n");
    gen_print_draft_help(f);
    cli_remote_help(f);
    gen_print_option_help(f);
    fprintf(f, "  -h, --help              this help\n\n"
               "Defaults: -n 256; context: the model's limit capped at max(4096, prompt + n).\n");
}

int cmd_run(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        run_help(stdout);
        return 0;
    }
    gen_opts o;
    gen_opts_default(&o, 256);
    const char *prompt = NULL, *prompt_file = NULL;
    char *file_text = NULL;
    bool special = false, no_bos = false, echo = false;
    gen_draft dr = GEN_DRAFT_DEFAULT;
    cli_remote remote = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = gen_parse_option("run", argc, argv, &i, &o);
        if (rc == 0)
            rc = cli_remote_parse("run", argc, argv, &i, &remote);
        if (rc == 0)
            rc = gen_parse_draft_option("run", argc, argv, &i, &dr);
        if (rc < 0)
            return CLI_EXIT_USAGE;
        if (rc > 0)
            continue;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (i + 1 >= argc)
                return cli_usage_error("run", "%s needs a text", a);
            prompt = argv[++i];
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (i + 1 >= argc)
                return cli_usage_error("run", "%s needs a file", a);
            prompt_file = argv[++i];
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--echo")) {
            echo = true;
        } else {
            return cli_usage_error("run", "unknown option '%s'", a);
        }
    }
    if (!prompt == !prompt_file)
        return cli_usage_error("run", "give the prompt once: -p TEXT or -f FILE");
    if (gen_draft_check("run", &dr, o.sess.backend))
        return CLI_EXIT_USAGE;
    if (dr.dflash_path && remote.addr)
        return cli_usage_error("run", "--draft-dflash needs the prompt's hidden states, which a remote prefill does "
                                      "not carry");
    if (cli_remote_check("run", &remote))
        return CLI_EXIT_USAGE;
    if (prompt_file) {
        size_t len = 0;
        if (!(file_text = cli_read_file(prompt_file, &len))) {
            fprintf(stderr, "muser run: cannot read the prompt file '%s': %s\n", prompt_file, strerror(errno));
            return 1;
        }
        if (strlen(file_text) != len) {
            fprintf(stderr, "muser run: the prompt file '%s' holds a NUL byte\n", prompt_file);
            free(file_text);
            return 1;
        }
        prompt = file_text;
    }

    gen_ctx g;
    if (gen_open(&g, "run", &o)) {
        free(file_text);
        return 1;
    }
    int status = 1;
    muser_error err = {0};
    int32_t *toks = NULL;
    size_t n_toks = 0, cap = 0;
    handoff_client *producer = NULL;
    gen_drafter gd = {0};
    if (gen_tokenize_append(&g, prompt, !no_bos, special, &toks, &n_toks, &cap, &err)) {
        fprintf(stderr, "muser run: cannot tokenize the prompt: %s\n", err.msg);
        goto out;
    }
    if (n_toks == 0) {
        fprintf(stderr, "muser run: the prompt is empty and the vocabulary has no BOS token\n");
        goto out;
    }
    uint64_t n_train = g.model->hp.n_ctx_train ? g.model->hp.n_ctx_train : 4096;
    uint64_t n_ctx = o.sess.n_ctx;
    if (!n_ctx) {
        n_ctx = n_toks + o.n_predict;
        if (n_ctx < 4096)
            n_ctx = 4096;
        if (n_ctx > n_train)
            n_ctx = n_train;
    }
    if (n_toks >= n_ctx) {
        fprintf(stderr, "muser run: the prompt is %zu tokens; the context holds %llu\n", n_toks,
                (unsigned long long)n_ctx);
        goto out;
    }
    if (gen_start_session(&g, &o, n_ctx) ||
        cli_remote_client("run", &remote, g.model, o.model_path ? o.model_path : cli_default_model(), &gen_interrupted,
                          &producer))
        goto out;

    if (gen_drafter_open(&g, &dr, &o, n_ctx, &gd, &err)) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        goto out;
    }
    gen_interrupted = 0;
    gen_catch_sigint(true);
    double t0 = muser_now_s();
    handoff_stats hst;
    if (producer ? gen_prefill_remote(&g, producer, toks, n_toks, &hst, &err)
                 : gen_prefill_spec(&g, gd.d, toks, n_toks, &err)) {
        fprintf(stderr, "muser run: %s failed: %s\n", producer ? "remote prefill" : "prefill", err.msg);
        goto out_sig;
    }
    double t_prompt = muser_now_s() - t0;
    if (producer)
        fprintf(stderr,
                "muser run: remote prefill from %s: session %.8s, %u tiles, %.2f MB in, first tile at %.3f s, "
                "installed at %.3f s\n",
                remote.addr, hst.session, hst.tiles, hst.bytes_in / 1e6, hst.first_tile_s, hst.total_s);
    if (echo) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    gen_reply r;
    muser_spec_stats sst;
    memset(&sst, 0, sizeof sst);
    int rc = gd.d ? gen_generate_spec(&g, gd.d, dr.max, !dr.fixed, toks, n_toks, o.n_predict, stdout, &gen_interrupted,
                                         &r, &sst, &err)
                     : gen_generate(&g, o.n_predict, -1, stdout, &gen_interrupted, &r, &err);
    if (r.n_tokens || echo)
        fputc('\n', stdout);
    fflush(stdout);
    static const char *why[] = {"limit", "end token", "interrupted", "context full"};
    fprintf(stderr,
            "muser run: prompt %zu tokens in %.3f s (%.1f tok/s); generated %u tokens in %.3f s "
            "(%.1f tok/s); stop: %s\n",
            n_toks, t_prompt, t_prompt > 0 ? (double)n_toks / t_prompt : 0.0, r.n_tokens,
            r.seconds, r.seconds > 0 ? (double)r.n_tokens / r.seconds : 0.0, why[r.stop]);
    if (sst.rounds)
        fprintf(stderr,
                "muser run: speculation (%s, %s %u drafts): %llu verify passes, %llu of %llu drafts accepted "
                "(%.1f%%), %.2f tokens per pass\n",
                gen_draft_name(&dr), dr.fixed ? "always" : "up to", dr.max, (unsigned long long)sst.rounds,
                (unsigned long long)sst.accepted, (unsigned long long)sst.drafted,
                sst.drafted ? 100.0 * sst.accepted / sst.drafted : 0.0, (double)sst.emitted / sst.rounds);
    if (rc) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        goto out_sig;
    }
    status = r.stop == GEN_STOP_INTERRUPT ? 130 : 0;
out_sig:
    gen_catch_sigint(false);
out:
    gen_drafter_close(&gd);
    free(toks);
    handoff_client_free(producer);
    gen_close(&g);
    free(file_text);
    return status;
}
