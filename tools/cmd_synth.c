/* cmd_synth.c — `muser synth`: write a deterministic random model of a preset's shape
 * (src/synth.h does the work; this file parses arguments and reports). */
#include "cli.h"
#include "quant.h"
#include "synth.h"
#include "util.h"

#include <string.h>

static void synth_help(FILE *f)
{
    fprintf(f,
            "usage: muser synth --preset tiny|small|glimmer -o OUT.gguf [options]\n"
            "       muser synth --dflash-for TARGET.gguf -o OUT.gguf [--seed N] [--type T]\n"
            "                   [--block B] [--layers N]\n\n"
            "Write a model with random weights, the exact tensor layout and metadata of the\n"
            "preset, and a byte-level BPE tokenizer. Same options -> same bytes.\n"
            "With --dflash-for: a DFlash drafter with random weights for that target (its\n"
            "width, vocabulary and fingerprint; docs/dflash.md), for tests and plumbing: its\n"
            "drafts are noise.\n\n"
            "options:\n"
            "  --preset NAME     tiny (8 layers, E 256), small (22 layers, E 2048),\n"
            "                    glimmer (SPEC §1: 52 layers, E 6656, 16.7 GB in the mix)\n"
            "  -o, --output PATH where to write the GGUF\n"
            "  --arch NAME       muse (default), llama (same dims, no muse features) or qwen3\n"
            "                    (llama with QK-norm)\n"
            "  --seed N          weight seed (default 1); the vocabulary does not depend on it\n"
            "  --type T          f32|f16|bf16|q8_0|q4_k|q6_k|mix (default mix: the release mix,\n"
            "                    Q4_K with Q6_K for output and some attn_v / ffn_down)\n"
            "  -t, --threads N   generation threads (default: all CPUs)\n"
            "  --vocab V         glimmer's vocabulary: o200k (default; data/tokenizers or\n"
            "                    $MUSER_DATA_DIR/tokenizers) or synthetic (the byte-level BPE of\n"
            "                    tiny/small, grown to 202048); tiny/small are always synthetic\n"
            "  --dflash-for PATH a DFlash drafter for the target model at PATH\n"
            "  --block B         its block size, 2..16 (default 8)\n"
            "  --layers N        its decoder layers (default 1)\n"
            "  -h, --help        this help\n");
}

static int synth_dflash(const char *target_path, const muser_synth_dflash_opts *o, const char *out)
{
    muser_error err = {0};
    muser_model *t = NULL;
    int rc = muser_model_load(&t, target_path, &err);
    if (!rc)
        rc = muser_synth_dflash_write(t, o, out, &err);
    muser_model_free(t);
    if (rc) {
        fprintf(stderr, "muser synth: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: a DFlash drafter with random weights for %s (block %u, %u layer(s), seed %llu)\n", out,
           target_path, o->block_size ? o->block_size : 8, o->n_layer ? o->n_layer : 1, (unsigned long long)o->seed);
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        synth_help(stdout);
        return 0;
    }
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.progress = true;
    const char *out = NULL, *dflash_for = NULL;
    bool have_preset = false, have_type = false;
    muser_synth_dflash_opts dfo;
    memset(&dfo, 0, sizeof dfo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--preset") || !strcmp(a, "--arch") || !strcmp(a, "-o") ||
            !strcmp(a, "--output") || !strcmp(a, "--seed") || !strcmp(a, "--type") ||
            !strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "--vocab") ||
            !strcmp(a, "--dflash-for") || !strcmp(a, "--block") || !strcmp(a, "--layers")) {
            if (!val)
                return cli_usage_error("synth", "%s needs a value", a);
            i++;
        } else {
            return cli_usage_error("synth", "unknown argument '%s'", a);
        }
        uint64_t u;
        if (!strcmp(a, "--preset")) {
            int p = muser_synth_preset_from_name(val);
            if (p < 0)
                return cli_usage_error("synth", "unknown preset '%s' (tiny, small, glimmer)", val);
            o.preset = (muser_synth_preset)p;
            have_preset = true;
        } else if (!strcmp(a, "--arch")) {
            if (!strcmp(val, "muse"))
                o.arch = MUSER_ARCH_MUSE;
            else if (!strcmp(val, "llama"))
                o.arch = MUSER_ARCH_LLAMA;
            else if (!strcmp(val, "qwen3"))
                o.arch = MUSER_ARCH_QWEN3;
            else
                return cli_usage_error("synth", "unknown arch '%s' (muse, llama, qwen3)", val);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = val;
        } else if (!strcmp(a, "--seed")) {
            if (!muser_parse_u64(val, &u))
                return cli_usage_error("synth", "--seed wants a non-negative integer, not '%s'",
                                       val);
            o.seed = u;
        } else if (!strcmp(a, "--type")) {
            if (!strcmp(val, "mix")) {
                o.type = MUSER_SYNTH_TYPE_MIX;
            } else {
                int t = quant_type_from_name(val);
                if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16 &&
                    t != GGML_TYPE_Q8_0 && t != GGML_TYPE_Q4_K && t != GGML_TYPE_Q6_K)
                    return cli_usage_error(
                        "synth", "unknown type '%s' (f32, f16, bf16, q8_0, q4_k, q6_k, mix)", val);
                o.type = t;
            }
            have_type = true;
        } else if (!strcmp(a, "--dflash-for")) {
            dflash_for = val;
        } else if (!strcmp(a, "--block") || !strcmp(a, "--layers")) {
            const bool blk = !strcmp(a, "--block");
            if (!muser_parse_u64(val, &u) || u < (blk ? 2 : 1) || u > (blk ? MUSER_DFLASH_MAX_BLOCK : 64))
                return cli_usage_error("synth", "%s wants %s, not '%s'", a, blk ? "2..16" : "1..64", val);
            *(blk ? &dfo.block_size : &dfo.n_layer) = (uint32_t)u;
        } else if (!strcmp(a, "--vocab")) {
            if (!strcmp(val, "synthetic"))
                o.synthetic_vocab = true;
            else if (!strcmp(val, "o200k"))
                o.synthetic_vocab = false;
            else
                return cli_usage_error("synth", "unknown vocab '%s' (o200k, synthetic)", val);
        } else { /* -t / --threads */
            if (!muser_parse_u64(val, &u) || u == 0 || u > 1024)
                return cli_usage_error("synth", "--threads wants 1..1024, not '%s'", val);
            o.n_threads = (uint32_t)u;
        }
    }
    if (!out)
        return cli_usage_error("synth", "-o OUT is required");
    if (dflash_for) {
        if (have_preset)
            return cli_usage_error("synth", "--preset and --dflash-for write two kinds of file: pick one");
        dfo.seed = o.seed;
        dfo.type = have_type && o.type != MUSER_SYNTH_TYPE_MIX ? o.type : -1;
        return synth_dflash(dflash_for, &dfo, out);
    }
    if (dfo.block_size || dfo.n_layer)
        return cli_usage_error("synth", "--block and --layers go with --dflash-for");
    if (!have_preset)
        return cli_usage_error("synth", "--preset is required");

    muser_error err = {0};
    uint64_t bytes = 0;
    double t0 = muser_now_s();
    int rc = muser_synth_write(&o, out, &bytes, &err);
    double dt = muser_now_s() - t0;
    if (rc) {
        fprintf(stderr, "muser synth: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: preset %s, arch %s, type %s, seed %llu: %llu bytes in %.2f s (%.1f MB/s)\n",
           out, muser_synth_preset_name(o.preset), muser_arch_name(o.arch),
           o.type == MUSER_SYNTH_TYPE_MIX ? "mix" : quant_info((uint32_t)o.type)->name,
           (unsigned long long)o.seed, (unsigned long long)bytes, dt,
           dt > 0 ? (double)bytes / dt / 1e6 : 0.0);
    return 0;
}
