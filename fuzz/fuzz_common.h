/* fuzz_common.h — helpers shared by the libFuzzer harnesses (fuzz/fuzz_*.c): write a GGUF with
 * the real writer into a memfd and open it back with the real reader, a strict UTF-8 check that
 * does not share code with src/tokenizer.c, and an abort with a message for broken invariants.
 * Everything is static: each harness is its own program (scripts/fuzz.sh builds them). */
#ifndef MUSER_FUZZ_COMMON_H
#define MUSER_FUZZ_COMMON_H

#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static inline void fuzz_fail(const char *harness, const char *what)
{
    fprintf(stderr, "%s: invariant broken: %s\n", harness, what);
    abort();
}

/* One memfd per process, rewritten by every exec: "/proc/self/fd/N" as a path the writer and
 * the reader both take. */
static inline const char *fuzz_memfd_path(void)
{
    static char path[64];
    if (!path[0]) {
        int fd = memfd_create("muser-fuzz", MFD_CLOEXEC);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    return path;
}

/* Finish w into the memfd and open it. Returns the reader's status; the writer is freed. */
static inline int fuzz_write_open(gguf_writer *w, gguf_file **out, muser_error *err)
{
    *out = NULL;
    const char *path = fuzz_memfd_path();
    int rc = gguf_writer_begin(w, path, err);
    if (!rc)
        rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc ? rc : gguf_open(out, path, err);
}

/* Strict UTF-8 (RFC 3629: no overlongs, surrogates, or code points above U+10FFFF). */
static inline bool fuzz_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = s[i], cp;
        size_t k;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 4;
            cp = c & 0x07;
        } else
            return false;
        if (i + k > n)
            return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

/* A little-endian cursor over the fuzz input; reads past the end give zeros. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n, at;
} fuzz_in;

static inline uint8_t fuzz_u8(fuzz_in *in) { return in->at < in->n ? in->p[in->at++] : 0; }
static inline uint32_t fuzz_u32(fuzz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fuzz_u8(in) << (8 * i);
    return v;
}
static inline bool fuzz_more(const fuzz_in *in) { return in->at < in->n; }

#endif
