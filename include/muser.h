/* muser.h — the public API of muser, an inference engine for the Muse Glimmer model family.
 *
 * Three kinds of state, no globals:
 *   muser_model    read-only weights (an mmap'ed GGUF) and hyper-parameters, shared by sessions;
 *   muser_session  one sequence: its KV cache, activations and backend context;
 *   muser_error    filled by every call that can fail, naming the file, tensor or field at fault.
 * Library functions return MUSER_OK (0) or a negative muser_status; they never exit or abort on
 * bad input. */
#ifndef MUSER_H
#define MUSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSER_VERSION "0.1.0"

typedef enum {
    MUSER_OK = 0,
    MUSER_E_IO = -1,                  /* open/read/mmap/write failed */
    MUSER_E_FORMAT = -2,              /* malformed file or data */
    MUSER_E_UNSUPPORTED = -3,         /* valid but not supported (version, type, arch) */
    MUSER_E_SHAPE = -4,               /* tensor missing or wrong dims/type */
    MUSER_E_NOMEM = -5,
    MUSER_E_ARG = -6,                 /* bad argument from the caller */
    MUSER_E_CACHE_DISCONTINUITY = -7, /* KV append at a position other than the next */
    MUSER_E_CONTEXT_FULL = -8,        /* past the context limit */
    MUSER_E_NUMERIC = -9,             /* NaN/Inf logits: fail closed */
    MUSER_E_BACKEND = -10,            /* CUDA or other backend failure / not available */
    MUSER_E_TOKENIZE = -11,
    MUSER_E_INTERRUPTED = -12,
    MUSER_E_CANCELLED = -13,          /* the sequence was cancelled while the request waited or ran */
    MUSER_E_NO_ROOM = -14,            /* the engine's KV budget or sequence limit cannot take it */
} muser_status;

typedef struct muser_error {
    muser_status code;
    char msg[512];
} muser_error;

/* Fill err (may be NULL) with code and a printf-formatted message; returns code. */
int muser_errorf(muser_error *err, muser_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *muser_status_name(muser_status code);

#ifdef __cplusplus
}
#endif
#endif
