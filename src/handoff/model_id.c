/* model_id.c — what the handoff says about a model: its identity, SHA-256 of its file, cached in
 * PATH.sha256 as one line "sha256 HEX size N mtime SEC.NSEC" (hashing a 16.7 GB file costs tens
 * of seconds; the cache makes it once per file version), and its planes' shapes (handoff.h). */
#include "handoff/handoff.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

int handoff_model_id(const muser_model *m, const char *path, uint8_t id[HX_MODEL_ID_BYTES], muser_error *err)
{
    if (!m || !m->gguf || !m->gguf->map)
        return muser_errorf(err, MUSER_E_ARG, "model id: the model has no mapped file");
    const gguf_file *f = m->gguf;
    struct stat st;
    char cache[4096] = "";
    /* the cache speaks for the mapped bytes only while the file on disk is the one mapped */
    const bool cacheable = path && stat(path, &st) == 0 && (uint64_t)st.st_size == f->size &&
                           snprintf(cache, sizeof cache, "%s.sha256", path) < (int)sizeof cache;
    if (cacheable) {
        FILE *c = fopen(cache, "r");
        char hex[2 * HX_MODEL_ID_BYTES + 1];
        unsigned long long size = 0;
        long long sec = 0;
        long nsec = 0;
        const bool hit = c && fscanf(c, "sha256 %64s size %llu mtime %lld.%ld", hex, &size, &sec, &nsec) == 4 &&
                         strlen(hex) == 2 * HX_MODEL_ID_BYTES && size == (unsigned long long)st.st_size &&
                         sec == (long long)st.st_mtim.tv_sec && nsec == st.st_mtim.tv_nsec && !unhex(hex, id, HX_MODEL_ID_BYTES);
        if (c) fclose(c);
        if (hit) return MUSER_OK;
    }
    unsigned int len = 0;
    if (EVP_Digest(f->map, f->size, id, &len, EVP_sha256(), NULL) != 1 || len != HX_MODEL_ID_BYTES)
        return muser_errorf(err, MUSER_E_BACKEND, "model id: SHA-256 of %s failed", f->path);
    if (cacheable) { /* best effort, atomically: a reader sees the old cache or the new one */
        char tmp[4200], hex[2 * HX_MODEL_ID_BYTES + 1];
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", cache, (long)getpid());
        hx_hex(id, HX_MODEL_ID_BYTES, hex);
        FILE *c = fopen(tmp, "w");
        bool ok = c && fprintf(c, "sha256 %s size %llu mtime %lld.%09ld\n", hex, (unsigned long long)st.st_size,
                               (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec) > 0;
        ok = c && !fclose(c) && ok && rename(tmp, cache) == 0;
        if (!ok) unlink(tmp);
    }
    return MUSER_OK;
}

void handoff_layers(const muser_hparams *hp, hx_layer *out)
{
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const bool ring = muser_layer_is_swa(hp, l);
        out[l] = (hx_layer){ring, hp->n_head_kv, hp->head_dim, ring ? hp->swa_window : 0};
    }
}
