/* serve_req.h — `muser serve`'s request decoding: an OpenAI-style JSON body (completions or chat
 * completions) into a validated request, or an error naming the field. Pure: no model, no I/O, so
 * the fuzzer (fuzz/fuzz_serve.c) drives it as it is.
 *
 * Supported fields: model, prompt (a string, or an array of one string) / messages (role system,
 * user or assistant; content a string), max_tokens, max_completion_tokens, temperature, top_p,
 * top_k, min_p, presence_penalty, frequency_penalty, seed, stop (a string or up to 4), stream,
 * stream_options.include_usage, logprobs (completions: 0..20; chat: a boolean), top_logprobs
 * (chat: 0..20), n (1 only), user (kept for the log). Anything else is refused by name. */
#ifndef MUSER_TOOLS_SERVE_REQ_H
#define MUSER_TOOLS_SERVE_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERVE_MAX_STOP 4
#define SERVE_MAX_MESSAGES 256
#define SERVE_MAX_LOGPROBS 20

typedef enum { SERVE_COMPLETIONS, SERVE_CHAT } serve_kind;
typedef enum { SERVE_ROLE_SYSTEM, SERVE_ROLE_USER, SERVE_ROLE_ASSISTANT } serve_role;

typedef struct serve_msg {
    serve_role role;
    char *content;
} serve_msg;

typedef struct serve_req {
    serve_kind kind;
    char *prompt;                 /* completions */
    serve_msg *messages;          /* chat */
    uint32_t n_messages, messages_cap;
    uint32_t max_tokens;          /* 0: not given (the server's default) */
    float temperature, top_p, min_p, presence_penalty, frequency_penalty;
    uint32_t top_k;
    bool has_seed;
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    uint32_t n_stop;
    bool stream, include_usage;
    bool logprobs;                /* report the chosen token's logprob */
    uint32_t top_logprobs;        /* alternatives per token */
    char *user;
} serve_req;

typedef struct serve_err {
    int status;                   /* HTTP status */
    char type[48];                /* invalid_request_error, ... */
    char code[48];                /* e.g. context_length_exceeded; may be empty */
    char param[48];               /* the field at fault; may be empty */
    char msg[256];
} serve_err;

/* Decode body (len bytes, not NUL-terminated) for kind. 0 and *req filled, or -1 and *err. */
int serve_req_parse(serve_kind kind, const char *body, size_t len, serve_req *req, serve_err *err);
void serve_req_free(serve_req *req);
/* Fill an error (returns -1). */
int serve_err_set(serve_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
