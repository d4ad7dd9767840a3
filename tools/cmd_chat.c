/* cmd_chat.c — `muser chat`: an interactive conversation whose history lives in the KV cache.
 *
 * Each turn prefills only what is new: the previous reply's last token (sampled but never
 * forwarded, see generate.h), the end-of-turn text if the reply did not end with it, the user's
 * message in its template, and the assistant header. Template strings are tokenized with special
 * tokens parsed, message text as plain text. When a turn does not fit, the session is reset and
 * the conversation restarts from the system message.
 *
 * Input: libedit's readline() on a terminal when built with it, else lines from stdin (so tests
 * can pipe a conversation in). Ctrl-C stops the current reply; Ctrl-D (end of input) exits. */
#include "chat_template.h"
#include "generate.h"

#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MUSER_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static void chat_help(FILE *f)
{
    fprintf(f, "usage: muser chat [-m MODEL] [--template NAME] [--system TEXT] [options]\n\n"
               "Chat with the model. Each input line is one user message; the reply streams to\n"
               "stdout. Ctrl-C stops a reply, Ctrl-D exits; /reset forgets the conversation,\n"
               "/exit quits. Reads stdin line by line when it is not a terminal.\n\n"
               "options:\n"
               "  --template NAME         %s (default: recognised in the model's\n"
               "                          chat template metadata, else its special tokens)\n"
               "  --system TEXT           a system message opening the conversation\n",
            chat_template_names());
    gen_print_option_help(f);
    fprintf(f, "  -h, --help              this help\n\n"
               "Defaults: -n 512 tokens per reply; context: the model's limit capped at 8192.\n");
}

/* The template: asked for, else named by the model's metadata (tokenizer.chat_template, the
 * GGUF convention, or tokenizer.ggml.chat_template), else implied by its vocabulary, else muse
 * (its markers are then plain text). */
const chat_template *choose_template(const gen_ctx *g, const char **why)
{
    static const char *const keys[] = {"tokenizer.chat_template", "tokenizer.ggml.chat_template"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const gguf_kv *kv = gguf_find_kv(g->model->gguf, keys[i]);
        if (!kv || kv->type != GGUF_TYPE_STRING)
            continue;
        const chat_template *t = chat_template_detect(kv->str.ptr, kv->str.len);
        if (t) {
            *why = keys[i];
            return t;
        }
    }
    *why = "the vocabulary's special tokens";
    if (muser_token_find(g->tok, "<|start_header_id|>") >= 0)
        return chat_template_by_name("llama3");
    if (muser_token_find(g->tok, "<|im_start|>") >= 0)
        return chat_template_by_name("chatml");
    if (muser_token_find(g->tok, "<|assistant|>") >= 0)
        return chat_template_by_name("muse");
    *why = "fallback; the model has no chat markers";
    return chat_template_by_name("muse");
}

/* The end-of-turn marker: the template's, if it is a token of this model; else the model's EOT
 * token (a llama3-style model may name it differently); else the template's text, as plain text.
 * Writes the text to buf and returns the token id, or -1. */
int32_t resolve_end_of_turn(const gen_ctx *g, const chat_template *t, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", t->end_of_turn);
    int32_t id = muser_token_find(g->tok, t->end_of_turn);
    if (id >= 0)
        return id;
    int32_t eot = muser_token_eot(g->tok);
    size_t len = 0;
    const char *text = eot >= 0 ? muser_token_bytes(g->tok, eot, &len) : NULL;
    if (text && len > 0 && len < cap) {
        memcpy(buf, text, len);
        buf[len] = '\0';
        if (muser_token_find(g->tok, buf) == eot)
            return eot;
        snprintf(buf, cap, "%s", t->end_of_turn);
    }
    return -1;
}

typedef struct chat_state {
    gen_ctx *g;
    const chat_template *tpl;
    const char *system;
    const char *end_of_turn; /* resolved for this model (resolve_end_of_turn) */
    int32_t *vec;          /* tokens of the turn being built */
    size_t n, cap;
    bool started;          /* BOS and system message are in the cache */
    int32_t pending;       /* the last reply's unforwarded token, or -1 */
    bool closed;           /* the last reply ended with the end-of-turn token */
} chat_state;

static int add_text(chat_state *c, const char *text, bool special, bool bos, muser_error *err)
{
    return gen_tokenize_append(c->g, text, bos, special, &c->vec, &c->n, &c->cap, err);
}

/* The tokens of one user turn: what closes the previous reply (or opens the conversation), the
 * message, the assistant header. */
static int build_turn(chat_state *c, const char *msg, muser_error *err)
{
    const chat_template *t = c->tpl;
    int rc = MUSER_OK;
    c->n = 0;
    if (!c->started) {
        if (t->add_bos && muser_token_bos(c->g->tok) >= 0)
            rc = add_text(c, "", true, true, err);
        if (!rc && c->system && *c->system) {
            rc = add_text(c, t->system_prefix, true, false, err);
            if (!rc)
                rc = add_text(c, c->system, false, false, err);
            if (!rc)
                rc = add_text(c, c->end_of_turn, true, false, err);
            if (!rc)
                rc = add_text(c, t->after_end, true, false, err);
        }
    } else {
        if (c->pending >= 0) {
            if (c->n + 1 > c->cap) {
                int32_t *grown = realloc(c->vec, (c->cap * 2 + 16) * sizeof *grown);
                if (!grown)
                    return muser_errorf(err, MUSER_E_NOMEM, "out of memory for a turn");
                c->vec = grown;
                c->cap = c->cap * 2 + 16;
            }
            c->vec[c->n++] = c->pending;
        }
        if (!rc && !c->closed)
            rc = add_text(c, c->end_of_turn, true, false, err);
        if (!rc)
            rc = add_text(c, t->after_end, true, false, err);
    }
    if (!rc)
        rc = add_text(c, t->user_prefix, true, false, err);
    if (!rc)
        rc = add_text(c, msg, false, false, err);
    if (!rc)
        rc = add_text(c, c->end_of_turn, true, false, err);
    if (!rc)
        rc = add_text(c, t->after_end, true, false, err);
    if (!rc)
        rc = add_text(c, t->assistant_prefix, true, false, err);
    return rc;
}

/* One line of input without its newline, kept in *buf; NULL at end of input. */
static char *read_line(bool interactive, char **buf, size_t *cap)
{
#ifdef MUSER_HAVE_LIBEDIT
    if (interactive) {
        char *line = readline("> ");
        if (line && *line)
            add_history(line);
        if (line) {
            free(*buf);
            *buf = line;
            *cap = strlen(line) + 1;
        }
        return line;
    }
#endif
    if (interactive) {
        fputs("> ", stdout);
        fflush(stdout);
    }
    ssize_t got = getline(buf, cap, stdin);
    if (got < 0)
        return NULL;
    while (got > 0 && ((*buf)[got - 1] == '\n' || (*buf)[got - 1] == '\r'))
        (*buf)[--got] = '\0';
    return *buf;
}

int cmd_chat(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        chat_help(stdout);
        return 0;
    }
    gen_opts o;
    gen_opts_default(&o, 512);
    const chat_template *forced = NULL;
    const char *system = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = gen_parse_option("chat", argc, argv, &i, &o);
        if (rc < 0)
            return CLI_EXIT_USAGE;
        if (rc > 0)
            continue;
        if (!strcmp(a, "--template")) {
            if (i + 1 >= argc)
                return cli_usage_error("chat", "--template needs a name (%s)",
                                       chat_template_names());
            forced = chat_template_by_name(argv[++i]);
            if (!forced)
                return cli_usage_error("chat", "unknown template '%s' (known: %s)", argv[i],
                                       chat_template_names());
        } else if (!strcmp(a, "--system")) {
            if (i + 1 >= argc)
                return cli_usage_error("chat", "--system needs a text");
            system = argv[++i];
        } else {
            return cli_usage_error("chat", "unknown option '%s'", a);
        }
    }

    gen_ctx g;
    if (gen_open(&g, "chat", &o))
        return 1;
    const char *why = "--template";
    const chat_template *tpl = forced ? forced : choose_template(&g, &why);
    char end_text[64];
    int32_t stop_id = resolve_end_of_turn(&g, tpl, end_text, sizeof end_text);
    fprintf(stderr, "muser chat: template %s (%s), end of turn %s%s\n", tpl->name, why,
            end_text, stop_id < 0 ? " (not a token of this model: plain text)" : "");
    uint64_t n_ctx = o.sess.n_ctx;
    if (!n_ctx) {
        n_ctx = g.model->hp.n_ctx_train ? g.model->hp.n_ctx_train : 8192;
        if (n_ctx > 8192)
            n_ctx = 8192;
    }
    if (gen_start_session(&g, &o, n_ctx)) {
        gen_close(&g);
        return 1;
    }

    chat_state c = {.g = &g, .tpl = tpl, .system = system, .end_of_turn = end_text,
                    .pending = -1};
    bool interactive = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    int status = 0;
    uint64_t total_tokens = 0, prefill_tokens = 0;
    double total_s = 0.0, prefill_s = 0.0;
    muser_error err = {0};
    for (;;) {
        char *msg = read_line(interactive, &line, &line_cap);
        if (!msg)
            break;
        if (!*msg)
            continue;
        if (!strcmp(msg, "/exit") || !strcmp(msg, "/quit"))
            break;
        if (!strcmp(msg, "/reset")) {
            if (gen_reset(&g, &err)) {
                fprintf(stderr, "muser chat: %s\n", err.msg);
                status = 1;
                break;
            }
            c.started = false;
            c.pending = -1;
            fprintf(stderr, "muser chat: conversation reset\n");
            continue;
        }
        double t0 = muser_now_s();
        uint64_t past0 = gen_pos(&g);
        int rc = build_turn(&c, msg, &err);
        if (!rc) {
            rc = gen_prefill(&g, c.vec, c.n, &err);
            if (rc == MUSER_E_CONTEXT_FULL && c.started) {
                fprintf(stderr, "muser chat: context full (%llu tokens); starting over from the "
                                "system message\n",
                        (unsigned long long)g.n_ctx);
                rc = gen_reset(&g, &err);
                c.started = false;
                c.pending = -1;
                if (!rc)
                    rc = build_turn(&c, msg, &err);
                if (!rc)
                    rc = gen_prefill(&g, c.vec, c.n, &err);
            }
        }
        if (rc == MUSER_E_CONTEXT_FULL || rc == MUSER_E_TOKENIZE) {
            fprintf(stderr, "muser chat: message skipped: %s\n", err.msg);
            continue;
        }
        if (rc) {
            fprintf(stderr, "muser chat: %s\n", err.msg);
            status = 1;
            break;
        }
        c.started = true;
        prefill_tokens += gen_pos(&g) > past0 ? gen_pos(&g) - past0 : gen_pos(&g);
        prefill_s += muser_now_s() - t0;
        gen_interrupted = 0;
        gen_catch_sigint(true);
        gen_reply r;
        rc = gen_generate(&g, o.n_predict, stop_id, stdout, &gen_interrupted, &r, &err);
        gen_catch_sigint(false);
        fputc('\n', stdout);
        fflush(stdout);
        total_tokens += r.n_tokens;
        total_s += r.seconds;
        if (r.stop == GEN_STOP_INTERRUPT)
            fprintf(stderr, "muser chat: reply stopped\n");
        if (rc) {
            fprintf(stderr, "muser chat: %s\n", err.msg);
            status = 1;
            break;
        }
        /* Ended on the template's marker: it goes into the cache and closes the turn. Ended on
         * another end token (EOS): drop it and close with the template's text instead. */
        c.closed = r.stop == GEN_STOP_END && r.pending == stop_id;
        c.pending = r.stop == GEN_STOP_END && !c.closed ? -1 : r.pending;
    }
    fprintf(stderr,
            "muser chat: prefilled %llu tokens in %.3f s (%.1f tok/s); %llu tokens generated in "
            "%.3f s (%.1f tok/s)\n",
            (unsigned long long)prefill_tokens, prefill_s,
            prefill_s > 0 ? (double)prefill_tokens / prefill_s : 0.0,
            (unsigned long long)total_tokens, total_s,
            total_s > 0 ? (double)total_tokens / total_s : 0.0);
    free(line);
    free(c.vec);
    gen_close(&g);
    return status;
}
