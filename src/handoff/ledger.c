/* ledger.c — the replay ledger of ledger.h: an append-only file of session ids and an
 * open-addressing set of the ids read from it. */
#include "handoff/ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LEDGER_LINE (2 * HX_ID_BYTES + 1)

struct handoff_ledger {
    char path[4096];
    int fd;
    off_t read_to;                 /* bytes of the file already in the set */
    uint8_t (*slot)[HX_ID_BYTES];  /* [cap]: all-zero = empty (no random id is all zero) */
    size_t n, cap;
    pthread_mutex_t mu;            /* threads of one process share the fd and its flock */
};

static uint64_t id_hash(const uint8_t *id)
{
    uint64_t h;
    memcpy(&h, id, sizeof h); /* ids are random bytes */
    return h;
}

static bool is_zero(const uint8_t *id)
{
    for (unsigned i = 0; i < HX_ID_BYTES; i++)
        if (id[i]) return false;
    return true;
}

/* The slot holding id, or the empty one where it would go. */
static uint8_t *find(const handoff_ledger *l, const uint8_t *id)
{
    for (size_t i = id_hash(id) & (l->cap - 1);; i = (i + 1) & (l->cap - 1))
        if (is_zero(l->slot[i]) || !memcmp(l->slot[i], id, HX_ID_BYTES))
            return l->slot[i];
}

static int insert(handoff_ledger *l, const uint8_t *id, muser_error *err)
{
    if (2 * (l->n + 1) > l->cap) { /* load at most 1/2 */
        handoff_ledger grown = *l;
        grown.cap = l->cap ? 2 * l->cap : 1024;
        grown.slot = calloc(grown.cap, HX_ID_BYTES);
        if (!grown.slot)
            return muser_errorf(err, MUSER_E_NOMEM, "ledger %s: out of memory for %zu ids", l->path, l->n + 1);
        for (size_t i = 0; i < l->cap; i++)
            if (!is_zero(l->slot[i]))
                memcpy(find(&grown, l->slot[i]), l->slot[i], HX_ID_BYTES);
        free(l->slot);
        l->slot = grown.slot;
        l->cap = grown.cap;
    }
    uint8_t *s = find(l, id);
    if (is_zero(s)) {
        memcpy(s, id, HX_ID_BYTES);
        l->n++;
    }
    return MUSER_OK;
}

static bool contains(const handoff_ledger *l, const uint8_t *id)
{
    return l->cap && !is_zero(find(l, id));
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The lines appended since read_to (under the flock). */
static int read_new(handoff_ledger *l, muser_error *err)
{
    char buf[LEDGER_LINE * 256];
    for (;;) {
        const ssize_t r = pread(l->fd, buf, sizeof buf, l->read_to);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return muser_errorf(err, MUSER_E_IO, "ledger %s: %s", l->path, strerror(errno));
        const size_t whole = (size_t)r / LEDGER_LINE * LEDGER_LINE;
        if (r > 0 && whole == 0)
            return muser_errorf(err, MUSER_E_FORMAT, "ledger %s: a partial line at byte %lld (not a ledger?)", l->path,
                                (long long)l->read_to);
        for (size_t o = 0; o < whole; o += LEDGER_LINE) {
            uint8_t id[HX_ID_BYTES];
            bool ok = buf[o + 2 * HX_ID_BYTES] == '\n';
            for (unsigned i = 0; ok && i < HX_ID_BYTES; i++) {
                const int hi = hexval(buf[o + 2 * i]), lo = hexval(buf[o + 2 * i + 1]);
                ok = hi >= 0 && lo >= 0;
                id[i] = (uint8_t)(hi << 4 | lo);
            }
            if (!ok || is_zero(id))
                return muser_errorf(err, MUSER_E_FORMAT, "ledger %s: line %lld is not a session id", l->path,
                                    (long long)((l->read_to + (off_t)o) / LEDGER_LINE + 1));
            const int rc = insert(l, id, err);
            if (rc) return rc;
        }
        l->read_to += (off_t)whole;
        if ((size_t)r < sizeof buf) return MUSER_OK;
    }
}

static int mkdir_parents(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return 0;
}

int handoff_ledger_default_path(char *out, size_t cap, muser_error *err)
{
    const char *state = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int n;
    if (state && *state) n = snprintf(out, cap, "%s/muser/handoff.ledger", state);
    else if (home && *home) n = snprintf(out, cap, "%s/.local/state/muser/handoff.ledger", home);
    else return muser_errorf(err, MUSER_E_ARG, "no ledger path: set --ledger FILE (neither XDG_STATE_HOME nor HOME is set)");
    if (n < 0 || (size_t)n >= cap) return muser_errorf(err, MUSER_E_ARG, "the ledger path is too long");
    return MUSER_OK;
}

int handoff_ledger_open(handoff_ledger **out, const char *path, muser_error *err)
{
    *out = NULL;
    handoff_ledger *l = calloc(1, sizeof *l);
    if (!l) return muser_errorf(err, MUSER_E_NOMEM, "ledger: out of memory");
    if (snprintf(l->path, sizeof l->path, "%s", path) >= (int)sizeof l->path) {
        free(l);
        return muser_errorf(err, MUSER_E_ARG, "ledger path too long");
    }
    mkdir_parents(path); /* a failure shows as open's error */
    l->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (l->fd < 0) {
        const int rc = muser_errorf(err, MUSER_E_IO, "ledger %s: %s", path, strerror(errno));
        free(l);
        return rc;
    }
    pthread_mutex_init(&l->mu, NULL);
    int rc = flock(l->fd, LOCK_SH) == 0 ? read_new(l, err) : muser_errorf(err, MUSER_E_IO, "ledger %s: flock: %s", path, strerror(errno));
    flock(l->fd, LOCK_UN);
    if (rc) {
        handoff_ledger_close(l);
        return rc;
    }
    *out = l;
    return MUSER_OK;
}

void handoff_ledger_close(handoff_ledger *l)
{
    if (!l) return;
    close(l->fd);
    pthread_mutex_destroy(&l->mu);
    free(l->slot);
    free(l);
}

int handoff_ledger_claim(handoff_ledger *l, const uint8_t id[HX_ID_BYTES], muser_error *err)
{
    char hex[LEDGER_LINE + 1];
    hx_hex(id, HX_ID_BYTES, hex);
    if (is_zero(id)) return muser_errorf(err, MUSER_E_ARG, "session id %s: all zero (refused)", hex);
    pthread_mutex_lock(&l->mu);
    int rc = flock(l->fd, LOCK_EX) == 0 ? read_new(l, err)
                                         : muser_errorf(err, MUSER_E_IO, "ledger %s: flock: %s", l->path, strerror(errno));
    if (!rc && contains(l, id))
        rc = muser_errorf(err, MUSER_E_ARG, "session %s was seen before (ledger %s): a replay, refused", hex, l->path);
    if (!rc) {
        hex[2 * HX_ID_BYTES] = '\n';
        const ssize_t w = write(l->fd, hex, LEDGER_LINE);
        if (w != (ssize_t)LEDGER_LINE || fsync(l->fd) != 0)
            rc = muser_errorf(err, MUSER_E_IO, "ledger %s: cannot record session: %s", l->path,
                              w < 0 ? strerror(errno) : "short write");
        else if (!(rc = insert(l, id, err)))
            l->read_to += LEDGER_LINE; /* ours: O_APPEND under the exclusive lock put it at the old end */
    }
    flock(l->fd, LOCK_UN);
    pthread_mutex_unlock(&l->mu);
    return rc;
}
