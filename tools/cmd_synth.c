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
            "usage: muser synth --preset tiny|small|glimmer -o OUT.gguf [options]\n\n"
            "Write a model with random weights, the exact tensor layout and metadata of the\n"
            "preset, and a byte-level BPE tokenizer. Same options -> same bytes.\n\n"
            "options:\n"
            "  --preset NAME     tiny (8 layers, E 256), small (22 layers, E 2048),\n"
            "                    glimmer (SPEC §1: 52 layers, E 6656, 16.7 GB in the mix)\n"
            "  -o, --output PATH where to write the GGUF\n"
            "  --arch NAME       muse (default) or llama (same dims, no muse features)\n"
            "  --seed N          weight seed (default 1); the vocabulary does not depend on it\n"
            "  --type T          f32|f16|bf16|q8_0|q4_k|q6_k|mix (default mix: the release mix,\n"
            "                    Q4_K with Q6_K for output and some attn_v / ffn_down)\n"
            "  -t, --threads N   generation threads (default: all CPUs)\n"
            "  --vocab V         glimmer's vocabulary: o200k (default; data/tokenizers or\n"
            "                    $MUSER_DATA_DIR/tokenizers) or synthetic (the byte-level BPE of\n"
            "                    tiny/small, grown to 202048); tiny/small are always synthetic\n"
            "  -h, --help        this help\n");
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
    const char *out = NULL;
    bool have_preset = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--preset") || !strcmp(a, "--arch") || !strcmp(a, "-o") ||
            !strcmp(a, "--output") || !strcmp(a, "--seed") || !strcmp(a, "--type") ||
            !strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "--vocab")) {
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
            else
                return cli_usage_error("synth", "unknown arch '%s' (muse, llama)", val);
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
    if (!have_preset)
        return cli_usage_error("synth", "--preset is required");
    if (!out)
        return cli_usage_error("synth", "-o OUT is required");

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
