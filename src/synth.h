/* synth.h — deterministic random models: the tiny / small / glimmer presets as GGUF files.
 *
 * A synthetic model has the exact tensor names, dims and metadata of a real one (SPEC §1 for
 * `muse`; the same dims minus the muse features for `llama`) and random weights that are a pure
 * function of (seed, tensor name, row): the same options always give the same bytes, whatever
 * the thread count. Its metadata carries a usable byte-level BPE tokenizer (tokenizer.ggml.model
 * "gpt2": synthetic for tiny/small, o200k for glimmer). Tests create the tiny model with muser_synth_write instead of running the CLI.
 * docs/architecture.md describes the presets and how the weights are drawn. */
#ifndef MUSER_SYNTH_H
#define MUSER_SYNTH_H

#include "dflash.h"
#include "model.h"

typedef enum {
    MUSER_SYNTH_TINY = 0,    /* seconds on a CPU; every muse feature, the SWA ring wraps early */
    MUSER_SYNTH_SMALL = 1,   /* ~1.2 B parameters, TinyLlama-like shape */
    MUSER_SYNTH_GLIMMER = 2, /* SPEC §1 exactly */
} muser_synth_preset;

/* The matrix type: a ggml type id (F32, F16, BF16, Q8_0, Q4_K, Q6_K) or the release mix. */
#define MUSER_SYNTH_TYPE_MIX (-1)

typedef struct muser_synth_opts {
    muser_arch arch;           /* MUSER_ARCH_MUSE or MUSER_ARCH_LLAMA */
    muser_synth_preset preset;
    uint64_t seed;
    int type;                  /* ggml type of every matrix, or MUSER_SYNTH_TYPE_MIX */
    uint32_t n_threads;        /* generation threads; 0 = all online CPUs */
    bool progress;             /* progress bar on stderr (muser_progress rules) */
    uint32_t chunk_bytes;      /* generation chunk (two are in memory); 0 = 32 MiB. Tests make
                                  it small to run the chunk pipeline on a tiny model. */
    /* Vocabulary. glimmer carries the real o200k vocabulary (src/vocab.h) read from data_dir
     * (NULL: vocab.h's default lookup) and fails if it cannot be read, unless synthetic_vocab
     * asks for the synthetic byte-level BPE padded to 202048 instead. tiny/small always use
     * the synthetic one. */
    bool synthetic_vocab;
    const char *data_dir;
} muser_synth_opts;

/* arch muse, preset tiny, seed 1, type mix, all CPUs, no progress bar. */
void muser_synth_opts_default(muser_synth_opts *o);

/* Parse "tiny" / "small" / "glimmer"; -1 if unknown. */
int muser_synth_preset_from_name(const char *name);
const char *muser_synth_preset_name(muser_synth_preset p);

/* The hyper-parameters the preset writes (what muser_model_load will read back). */
int muser_synth_hparams(const muser_synth_opts *o, muser_hparams *hp, muser_error *err);

/* Write the model to path (streamed: memory stays bounded by a few chunks). On error the
 * partial file is removed. out_bytes (may be NULL) receives the file size. */
int muser_synth_write(const muser_synth_opts *o, const char *path, uint64_t *out_bytes,
                      muser_error *err);

/* A DFlash drafter (dflash.h) with random weights for target: the target's width, heads, eps and
 * RoPE base, its vocabulary size, layer count and fingerprint, so muser_dflash_load accepts it for
 * that target and no other. Weights are a pure function of (seed, tensor name, row). Tests use it
 * for the drafter's checks; its drafts are noise (docs/dflash.md). */
typedef struct muser_synth_dflash_opts {
    uint64_t seed;
    uint32_t n_layer;          /* drafter layers; 0: 1 */
    uint32_t block_size;       /* B; 0: 8 */
    uint32_t n_tap;            /* 0: up to 3 target layers spread over the depth, the last included */
    uint32_t tap_layers[MUSER_DFLASH_MAX_TAP];
    int type;                  /* ggml type of every matrix (F32, F16, BF16, Q8_0, Q4_K, Q6_K); -1: F32 */
} muser_synth_dflash_opts;

int muser_synth_dflash_write(const muser_model *target, const muser_synth_dflash_opts *o, const char *path,
                             muser_error *err);

#endif
