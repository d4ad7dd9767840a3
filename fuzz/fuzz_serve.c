/* fuzz_serve.c — libFuzzer entry for `muser serve`'s request decoding (tools/serve_req.c): arbitrary
 * bytes as a completions or chat body (byte 0's low bit picks the kind; the rest is the body).
 * Checks (a failure aborts): a body is either accepted with every field in its documented range
 * (the text fields NUL-terminated, at most 4 stops, messages with a role and content, logprobs
 * options consistent) or refused with a 4xx/5xx status and a message; nothing leaks (ASan). */
#include "../tools/serve_req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_serve: %s failed\n", #c);                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const serve_kind kind = (data[0] & 1) ? SERVE_CHAT : SERVE_COMPLETIONS;
    serve_req r;
    serve_err e;
    memset(&e, 0, sizeof e);
    if (serve_req_parse(kind, (const char *)data + 1, size - 1, &r, &e)) {
        CHECK(e.status >= 400 && e.status < 600);
        CHECK(e.msg[0] != 0);
        CHECK(memchr(e.msg, 0, sizeof e.msg) != NULL);
        return 0;
    }
    CHECK(r.kind == kind);
    CHECK(kind == SERVE_CHAT ? r.n_messages >= 1 && r.messages != NULL : r.prompt != NULL);
    for (uint32_t i = 0; i < r.n_messages; i++) {
        CHECK(r.messages[i].content != NULL);
        CHECK(r.messages[i].role <= SERVE_ROLE_ASSISTANT);
    }
    CHECK(r.n_stop <= SERVE_MAX_STOP);
    for (uint32_t i = 0; i < r.n_stop; i++) CHECK(r.stop[i] && r.stop[i][0]);
    CHECK(r.temperature >= 0 && r.temperature <= 2);
    CHECK(r.top_p > 0 && r.top_p <= 1);
    CHECK(r.top_logprobs <= SERVE_MAX_LOGPROBS);
    CHECK(!r.top_logprobs || r.logprobs);
    CHECK(r.max_tokens <= (1u << 20));
    serve_req_free(&r);
    return 0;
}
