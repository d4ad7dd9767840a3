/* serve_req.c — see serve_req.h. Every field is checked for its type and range; a field not
 * listed there is refused by name (never silently ignored). */
#include "serve_req.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_err_set(serve_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int bad(serve_err *e, const char *param, const char *fmt, const char *what)
{
    return serve_err_set(e, 400, "invalid_request_error", NULL, param, fmt, param, what);
}

static char *dup_str(const char *s)
{
    const size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int get_number(const cJSON *v, const char *name, double lo, double hi, double *out, serve_err *e)
{
    if (!cJSON_IsNumber(v)) return bad(e, name, "'%s' must be %s", "a number");
    const double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi)
        return serve_err_set(e, 400, "invalid_request_error", NULL, name, "'%s' must be in [%g, %g], got %g", name, lo,
                             hi, d);
    *out = d;
    return 0;
}

static int get_uint(const cJSON *v, const char *name, double lo, double hi, uint64_t *out, serve_err *e)
{
    double d;
    if (get_number(v, name, lo, hi, &d, e)) return -1;
    if (d != floor(d)) return bad(e, name, "'%s' must be %s", "an integer");
    *out = (uint64_t)d;
    return 0;
}

static int get_bool(const cJSON *v, const char *name, bool *out, serve_err *e)
{
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be %s", "a boolean");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_text(const cJSON *v, const char *name, char **out, serve_err *e)
{
    if (!cJSON_IsString(v) || !v->valuestring) return bad(e, name, "'%s' must be %s", "a string");
    if (!(*out = dup_str(v->valuestring)))
        return serve_err_set(e, 500, "server_error", NULL, name, "out of memory");
    return 0;
}

static int parse_messages(const cJSON *v, serve_req *r, serve_err *e)
{
    if (!cJSON_IsArray(v)) return bad(e, "messages", "'%s' must be %s", "an array of messages");
    const int n = cJSON_GetArraySize(v);
    if (n < 1 || n > SERVE_MAX_MESSAGES)
        return serve_err_set(e, 400, "invalid_request_error", NULL, "messages", "'messages' must hold 1..%d messages",
                             SERVE_MAX_MESSAGES);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return serve_err_set(e, 500, "server_error", NULL, "messages", "out of memory");
    r->messages_cap = (uint32_t)n; /* serve_req_free frees every slot, filled or not */
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        if (!cJSON_IsObject(m)) return bad(e, "messages", "'%s' must be %s", "an array of objects");
        serve_msg *out = &r->messages[r->n_messages];
        bool has_role = false, has_content = false;
        const cJSON *f;
        cJSON_ArrayForEach(f, m)
        {
            if (!strcmp(f->string, "role")) {
                if (!cJSON_IsString(f)) return bad(e, "messages.role", "'%s' must be %s", "a string");
                if (!strcmp(f->valuestring, "system")) out->role = SERVE_ROLE_SYSTEM;
                else if (!strcmp(f->valuestring, "user")) out->role = SERVE_ROLE_USER;
                else if (!strcmp(f->valuestring, "assistant")) out->role = SERVE_ROLE_ASSISTANT;
                else
                    return serve_err_set(e, 400, "invalid_request_error", NULL, "messages.role",
                                         "role '%.32s' is not supported (system, user, assistant)", f->valuestring);
                has_role = true;
            } else if (!strcmp(f->string, "content")) {
                if (has_content)
                    return serve_err_set(e, 400, "invalid_request_error", NULL, "messages.content",
                                         "'content' is given twice in message %u", r->n_messages);
                if (get_text(f, "messages.content", &out->content, e)) return -1;
                has_content = true;
            } else if (!strcmp(f->string, "name")) {
                /* a speaker name: the templates have no place for it */
                return serve_err_set(e, 400, "invalid_request_error", "unsupported_field", "messages.name",
                                     "'messages.name' is not supported");
            } else {
                return serve_err_set(e, 400, "invalid_request_error", "unsupported_field", "messages",
                                     "message field '%.40s' is not supported", f->string);
            }
        }
        if (!has_role || !has_content)
            return serve_err_set(e, 400, "invalid_request_error", NULL, "messages",
                                 "message %u needs a role and a string content", r->n_messages);
        r->n_messages++;
    }
    return 0;
}

int serve_req_parse(serve_kind kind, const char *body, size_t len, serve_req *r, serve_err *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return serve_err_set(e, 400, "invalid_request_error", NULL, NULL, "the body is not valid JSON");
    int rc = 0;
    bool has_input = false;
    if (!cJSON_IsObject(root)) {
        rc = serve_err_set(e, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
        goto done;
    }
    const cJSON *f;
    bool seen_stop = false;
    cJSON_ArrayForEach(f, root)
    {
        const char *k = f->string;
        double d;
        uint64_t u;
        /* a field given twice: refused (the fields that hold memory would otherwise leak) */
        if ((!strcmp(k, "prompt") && r->prompt) || (!strcmp(k, "messages") && r->messages) ||
            (!strcmp(k, "user") && r->user) || (!strcmp(k, "stop") && seen_stop)) {
            rc = serve_err_set(e, 400, "invalid_request_error", NULL, k, "'%.48s' is given twice", k);
            goto done;
        }
        if (!strcmp(k, "stop")) seen_stop = true;
        if (!strcmp(k, "model")) {
            if (!cJSON_IsString(f)) rc = bad(e, "model", "'%s' must be %s", "a string");
        } else if (!strcmp(k, "prompt") && kind == SERVE_COMPLETIONS) {
            if (cJSON_IsArray(f) && cJSON_GetArraySize(f) == 1 && cJSON_IsString(cJSON_GetArrayItem(f, 0)))
                rc = get_text(cJSON_GetArrayItem(f, 0), "prompt", &r->prompt, e);
            else if (cJSON_IsArray(f))
                rc = serve_err_set(e, 400, "invalid_request_error", "unsupported_value", "prompt",
                                   "'prompt' as an array must hold one string (a batch of prompts is not supported)");
            else
                rc = get_text(f, "prompt", &r->prompt, e);
            has_input = true;
        } else if (!strcmp(k, "messages") && kind == SERVE_CHAT) {
            rc = parse_messages(f, r, e);
            has_input = true;
        } else if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens")) {
            if (cJSON_IsNull(f)) continue;
            if (!(rc = get_uint(f, k, 1, 1 << 20, &u, e))) r->max_tokens = (uint32_t)u;
        } else if (!strcmp(k, "temperature")) {
            if (!(rc = get_number(f, k, 0, 2, &d, e))) r->temperature = (float)d;
        } else if (!strcmp(k, "top_p")) {
            if (!(rc = get_number(f, k, 0, 1, &d, e))) r->top_p = d < 1e-6 ? 1e-6f : (float)d; /* 0: the best token alone */
        } else if (!strcmp(k, "min_p")) {
            if (!(rc = get_number(f, k, 0, 1, &d, e))) r->min_p = (float)d;
        } else if (!strcmp(k, "top_k")) {
            if (!(rc = get_uint(f, k, 0, 1 << 20, &u, e))) r->top_k = (uint32_t)u;
        } else if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty")) {
            if (!(rc = get_number(f, k, -2, 2, &d, e))) {
                if (k[0] == 'p') r->presence_penalty = (float)d;
                else r->frequency_penalty = (float)d;
            }
        } else if (!strcmp(k, "seed")) {
            if (cJSON_IsNull(f)) continue;
            if (!(rc = get_uint(f, k, 0, 9007199254740991.0, &u, e))) {
                r->seed = u;
                r->has_seed = true;
            }
        } else if (!strcmp(k, "stop")) {
            if (cJSON_IsNull(f)) continue;
            if (cJSON_IsString(f)) {
                if (!*f->valuestring) continue;
                rc = get_text(f, "stop", &r->stop[r->n_stop++], e);
            } else if (cJSON_IsArray(f) && cJSON_GetArraySize(f) <= SERVE_MAX_STOP) {
                const cJSON *s;
                cJSON_ArrayForEach(s, f)
                {
                    if (rc) break;
                    if (cJSON_IsString(s) && !*s->valuestring) continue;
                    rc = get_text(s, "stop", &r->stop[r->n_stop], e);
                    if (!rc) r->n_stop++;
                }
            } else {
                rc = bad(e, "stop", "'%s' must be %s", "a string or an array of up to 4 strings");
            }
        } else if (!strcmp(k, "stream")) {
            rc = get_bool(f, k, &r->stream, e);
        } else if (!strcmp(k, "stream_options")) {
            if (cJSON_IsNull(f)) continue;
            if (!cJSON_IsObject(f)) {
                rc = bad(e, k, "'%s' must be %s", "an object");
            } else {
                const cJSON *o;
                cJSON_ArrayForEach(o, f)
                {
                    if (rc) break;
                    if (!strcmp(o->string, "include_usage")) rc = get_bool(o, "stream_options.include_usage", &r->include_usage, e);
                    else
                        rc = serve_err_set(e, 400, "invalid_request_error", "unsupported_field", "stream_options",
                                           "stream option '%.40s' is not supported", o->string);
                }
            }
        } else if (!strcmp(k, "logprobs")) {
            if (cJSON_IsNull(f)) continue;
            if (kind == SERVE_CHAT) {
                rc = get_bool(f, k, &r->logprobs, e);
            } else if (!(rc = get_uint(f, k, 0, SERVE_MAX_LOGPROBS, &u, e))) {
                r->logprobs = true; /* completions: the integer is the number of alternatives */
                r->top_logprobs = (uint32_t)u;
            }
        } else if (!strcmp(k, "top_logprobs") && kind == SERVE_CHAT) {
            if (cJSON_IsNull(f)) continue;
            if (!(rc = get_uint(f, k, 0, SERVE_MAX_LOGPROBS, &u, e))) r->top_logprobs = (uint32_t)u;
        } else if (!strcmp(k, "n")) {
            if (!(rc = get_uint(f, k, 1, 1, &u, e))) continue;
            snprintf(e->msg, sizeof e->msg, "'n' must be 1: one choice per request");
        } else if (!strcmp(k, "user")) {
            rc = get_text(f, k, &r->user, e);
        } else {
            rc = serve_err_set(e, 400, "invalid_request_error", "unsupported_field", k,
                               "field '%.48s' is not supported", k);
        }
        if (rc) goto done;
    }
    if (!has_input)
        rc = serve_err_set(e, 400, "invalid_request_error", NULL, kind == SERVE_CHAT ? "messages" : "prompt",
                           "'%s' is required", kind == SERVE_CHAT ? "messages" : "prompt");
    if (!rc && r->top_logprobs && !r->logprobs)
        rc = serve_err_set(e, 400, "invalid_request_error", NULL, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
done:
    cJSON_Delete(root);
    if (rc) serve_req_free(r);
    return rc;
}

void serve_req_free(serve_req *r)
{
    free(r->prompt);
    for (uint32_t i = 0; r->messages && i < r->messages_cap; i++) free(r->messages[i].content);
    free(r->messages);
    for (uint32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->user);
    memset(r, 0, sizeof *r);
}
