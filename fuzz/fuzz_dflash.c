/* fuzz_dflash.c — libFuzzer entry for the DFlash drafter's binder (src/dflash.c) and its forward
 * pass. Once per process: a micro target (the tiny preset, written by the real synthesizer) and a
 * valid drafter for it (muser_synth_dflash_write: 1 layer, block 4, Q4_K). The input is an edit
 * script on the drafter's bytes: each 4-byte record overwrites one byte — in the GGUF header,
 * metadata and tensor directory three times in four (where the keys, the shapes and the target
 * identity live), anywhere in the file otherwise — and a leading 0xFF may truncate the file. The
 * edited file goes through a memfd into muser_dflash_load. Checks: a refusal is a negative status,
 * a message and no drafter; a drafter that binds has the invariants its runs index with (block
 * 2..16, 1..8 ascending tap layers below the target's depth, the target's width, whole heads);
 * for an input whose last byte is 0 it then takes one context position and drafts one
 * block on the f64 oracle and on the CPU engine, each of which must succeed with finite logits
 * or fail closed (MUSER_E_NUMERIC). */
#include "dflash.h"
#include "fuzz_common.h"
#include "model.h"
#include "quant.h"
#include "synth.h"
#include "util.h"

#include <fcntl.h>
#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define H "fuzz_dflash"

static muser_model *g_target;
static uint8_t *g_base;       /* the valid drafter's bytes */
static size_t g_size, g_head; /* its size; the bytes before its tensor data */

static void setup(void)
{
    muser_error err = {0};
    char tpath[] = "/tmp/fuzz_dflash_target_XXXXXX", dpath[] = "/tmp/fuzz_dflash_drafter_XXXXXX";
    int tfd = mkstemp(tpath), dfd = mkstemp(dpath);
    if (tfd < 0 || dfd < 0)
        fuzz_fail(H, "mkstemp");
    close(tfd);
    close(dfd);
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.preset = MUSER_SYNTH_TINY;
    so.n_threads = 1;
    if (muser_synth_write(&so, tpath, NULL, &err) || muser_model_load(&g_target, tpath, &err)) {
        fprintf(stderr, "%s: %s\n", H, err.msg);
        fuzz_fail(H, "the micro target");
    }
    muser_synth_dflash_opts dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.seed = 7;
    dopt.block_size = 4;
    dopt.type = GGML_TYPE_Q4_K;
    if (muser_synth_dflash_write(g_target, &dopt, dpath, &err)) {
        fprintf(stderr, "%s: %s\n", H, err.msg);
        fuzz_fail(H, "the micro drafter");
    }
    FILE *f = fopen(dpath, "rb");
    if (!f || fseek(f, 0, SEEK_END))
        fuzz_fail(H, "reading the drafter");
    g_size = (size_t)ftell(f);
    rewind(f);
    g_base = malloc(g_size);
    if (!g_base || fread(g_base, 1, g_size, f) != g_size)
        fuzz_fail(H, "reading the drafter");
    fclose(f);
    gguf_file *gf = NULL; /* the header, metadata and tensor directory: the bytes before the data */
    if (gguf_open(&gf, dpath, &err))
        fuzz_fail(H, "reopening the drafter");
    g_head = (size_t)gf->data_offset;
    gguf_close(gf);
    unlink(dpath);
    unlink(tpath); /* the target's file stays mapped by the model; its name can go */
}

/* Invariants of a drafter that bound (what its runs index with). */
static void check_bound(const muser_dflash *d)
{
    const muser_dflash_hparams *hp = &d->hp;
    if (hp->block_size < 2 || hp->block_size > MUSER_DFLASH_MAX_BLOCK)
        fuzz_fail(H, "block size out of range");
    if (hp->n_tap < 1 || hp->n_tap > MUSER_DFLASH_MAX_TAP)
        fuzz_fail(H, "tap count out of range");
    for (uint32_t i = 0; i < hp->n_tap; i++)
        if (hp->tap_layers[i] >= g_target->hp.n_layer || (i && hp->tap_layers[i] <= hp->tap_layers[i - 1]))
            fuzz_fail(H, "tap layers not ascending below the target's depth");
    if (hp->n_embd != g_target->hp.n_embd)
        fuzz_fail(H, "width other than the target's");
    if (!hp->n_layer || !hp->n_head || !hp->n_head_kv || hp->n_head % hp->n_head_kv || !hp->head_dim || hp->head_dim % 2)
        fuzz_fail(H, "heads");
}

static void run_one(const muser_dflash *d, muser_dflash_kind kind)
{
    muser_error err = {0};
    muser_dflash_run *r = NULL;
    /* a context that holds the step at 0 and a block after it for any block size the loader takes
     * (a block of 15 in a context of 8 is refused as context-full, rightly: found by this harness) */
    int rc = muser_dflash_run_new(&r, d, kind, 1 + MUSER_DFLASH_MAX_BLOCK, &err);
    if (rc) {
        if (rc >= 0 || !err.msg[0])
            fuzz_fail(H, "a run refused without a negative status and a message");
        return;
    }
    const uint32_t E = d->hp.n_embd, M = d->hp.n_tap, V = g_target->hp.n_vocab;
    float *feats = calloc((size_t)M * E, sizeof(float)), *logits = malloc((size_t)V * sizeof(float));
    if (!feats || !logits)
        fuzz_fail(H, "out of memory");
    for (size_t i = 0; i < (size_t)M * E; i++)
        feats[i] = (float)((int)(i % 7) - 3) * 0.25f;
    rc = muser_dflash_run_context(r, 0, feats, 1, &err);
    if (rc && rc != MUSER_E_NUMERIC)
        fuzz_fail(H, "the context step failed other than closed");
    if (!rc) {
        rc = muser_dflash_run_block(r, 1, 1, logits, &err);
        if (rc && rc != MUSER_E_NUMERIC)
            fuzz_fail(H, "a block failed other than closed");
        for (uint32_t i = 0; !rc && i < V; i++)
            if (!isfinite(logits[i]))
                fuzz_fail(H, "a block succeeded with a non-finite logit");
    }
    free(feats);
    free(logits);
    muser_dflash_run_free(r);
}

/* The memfd holds the valid drafter between execs; an exec writes its edits into it and puts the
 * old bytes back afterwards (a whole-file rewrite per exec cost more than the load). */
static int g_fd = -1;

static void put(size_t at, const uint8_t *p, size_t n)
{
    if (pwrite(g_fd, p, n, (off_t)at) != (ssize_t)n)
        fuzz_fail(H, "writing the memfd");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_target) {
        setup();
        g_fd = open(fuzz_memfd_path(), O_RDWR);
        if (g_fd < 0 || ftruncate(g_fd, 0))
            fuzz_fail(H, "opening the memfd");
        put(0, g_base, g_size);
    }
    const char *path = fuzz_memfd_path();
    size_t n = g_size;
    if (size > 1 && data[0] == 0xFF) /* truncate */
        n = (size_t)data[1] * g_size / 256;
    size_t at[1024], k = 0;
    for (size_t i = (size > 1 && data[0] == 0xFF) ? 2 : 0; i + 4 <= size && k < 1024; i += 4) {
        const uint32_t off = (uint32_t)data[i + 1] | (uint32_t)data[i + 2] << 8;
        at[k] = (data[i] & 3) ? off % g_head : ((size_t)off << 8 | data[i]) % g_size;
        put(at[k++], &data[i + 3], 1);
    }
    if (n < g_size && ftruncate(g_fd, (off_t)n))
        fuzz_fail(H, "truncating the memfd");
    muser_error err = {0};
    muser_dflash *d = NULL;
    int rc = muser_dflash_load(&d, path, g_target, &err);
    if (rc) {
        if (rc >= 0 || d || !err.msg[0])
            fuzz_fail(H, "a refusal without a negative status, a message and no drafter");
    } else {
        check_bound(d);
        if (size && data[size - 1] == 0) { /* an input ending in 0 also runs it (slower: threads, two runs) */
            run_one(d, MUSER_DFLASH_ORACLE);
            run_one(d, MUSER_DFLASH_CPU);
        }
        muser_dflash_free(d);
    }
    /* the valid drafter back: the truncated tail, then the edited bytes */
    if (n < g_size)
        put(n, g_base + n, g_size - n);
    while (k > 0) {
        k--;
        put(at[k], g_base + at[k], 1);
    }
    return 0;
}
