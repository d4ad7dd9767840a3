/* test_synth.c — synthetic models: the tiny preset is deterministic (same seed -> same SHA-256
 * whatever the thread count; another seed -> other bytes), binds with muser_model_load with the
 * preset's hyper-parameters and the release mix's types, its weights have the intended
 * statistics once dequantized, and its tokenizer metadata is a consistent byte-level BPE. */
#include "check.h"
#include "quant.h"
#include "synth.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path_a[64], path_b[64];

static char *file_sha(const char *path, char out[65])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n);
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)n) {
        free(buf);
        return NULL;
    }
    muser_sha256_hex(buf, (size_t)n, out);
    free(buf);
    return out;
}

static void test_determinism(void)
{
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.seed = 7;
    o.n_threads = 1;
    muser_error err = {0};
    uint64_t bytes_a = 0, bytes_b = 0;
    CHECK_OK(muser_synth_write(&o, path_a, &bytes_a, &err), &err);
    o.n_threads = 3; /* rows split differently: the bytes must not change */
    CHECK_OK(muser_synth_write(&o, path_b, &bytes_b, &err), &err);
    char sa[65] = "a", sb[65] = "b";
    CHECK(file_sha(path_a, sa) && file_sha(path_b, sb));
    CHECKF(!strcmp(sa, sb), "seed 7: %s (1 thread) vs %s (3 threads)", sa, sb);
    CHECK(bytes_a == bytes_b && bytes_a > 1000000);
    struct stat st;
    CHECK(stat(path_a, &st) == 0 && (uint64_t)st.st_size == bytes_a);
    /* Many small chunks per tensor (the double-buffered write pipeline): same bytes. */
    o.n_threads = 2;
    o.chunk_bytes = 5000;
    CHECK_OK(muser_synth_write(&o, path_b, &bytes_b, &err), &err);
    CHECK(file_sha(path_b, sb));
    CHECKF(!strcmp(sa, sb), "seed 7: %s (1 thread) vs %s (2 threads, 5000-byte chunks)", sa, sb);
    o.chunk_bytes = 0;
    o.seed = 8;
    CHECK_OK(muser_synth_write(&o, path_b, &bytes_b, &err), &err);
    CHECK(file_sha(path_b, sb));
    CHECK(strcmp(sa, sb) != 0);
    CHECK(bytes_a == bytes_b); /* same layout, other values */
}

/* Mean and std of the dequantized first rows of t. */
static void tensor_stats(const muser_tensor *t, uint64_t rows, double *mean, double *std)
{
    float *f = malloc(t->cols * sizeof *f);
    double s = 0, s2 = 0;
    uint64_t n = 0;
    for (uint64_t r = 0; r < rows && r < t->rows; r++) {
        CHECK(quant_dequantize_row(t->type, muser_tensor_row(t, r), f, t->cols) == 0);
        for (uint64_t i = 0; i < t->cols; i++) {
            s += f[i];
            s2 += (double)f[i] * f[i];
        }
        n += t->cols;
    }
    free(f);
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
}

static void check_matrix_stats(const muser_tensor *t)
{
    double mean, std, want = 1.0 / sqrt((double)t->cols);
    tensor_stats(t, 64, &mean, &std);
    CHECKF(fabs(std / want - 1.0) < 0.1, "%s (%s): std %g, want %g", t->name,
           quant_info(t->type)->name, std, want);
    CHECKF(fabs(mean) < 0.05 * want, "%s: mean %g vs std %g", t->name, mean, want);
}

static void test_tiny_binds(uint32_t type_or_mix)
{
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.type = (int)type_or_mix;
    o.n_threads = 2;
    muser_error err = {0};
    uint64_t bytes = 0;
    CHECK_OK(muser_synth_write(&o, path_a, &bytes, &err), &err);
    muser_model *m = NULL;
    CHECK_OK(muser_model_load(&m, path_a, &err), &err);
    if (!m)
        return;
    muser_hparams want;
    CHECK_OK(muser_synth_hparams(&o, &want, &err), &err);
    const muser_hparams *hp = &m->hp;
    CHECK(hp->arch == MUSER_ARCH_MUSE && hp->n_layer == 8 && hp->n_embd == 256 && hp->n_ff == 512);
    CHECK(hp->n_head == 8 && hp->n_head_kv == 2 && hp->head_dim == 32 && hp->swa_window == 16);
    CHECK(hp->n_ctx_train == 512 && hp->n_vocab == want.n_vocab && hp->n_vocab >= 512);
    CHECK(hp->n_vocab <= 1024);
    CHECK(!memcmp(hp, &want, sizeof want));
    CHECK(!muser_layer_is_swa(hp, 3) && !muser_layer_is_swa(hp, 7) && muser_layer_is_swa(hp, 4));
    CHECK(m->weight_bytes < bytes && bytes - m->weight_bytes < 200000);

    if (type_or_mix == (uint32_t)MUSER_SYNTH_TYPE_MIX) {
        CHECK(m->output.type == GGML_TYPE_Q6_K);
        CHECK(m->tok_embd.type == GGML_TYPE_Q4_K);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            uint32_t n = hp->n_layer;
            bool more = l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
            uint32_t t = more ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
            CHECKF(m->layers[l].ffn_down.type == t, "layer %u ffn_down %u", l,
                   m->layers[l].ffn_down.type);
            CHECK(m->layers[l].attn_v.type == t);
            CHECK(m->layers[l].attn_q.type == GGML_TYPE_Q4_K);
            CHECK(m->layers[l].ffn_up.type == GGML_TYPE_Q4_K);
        }
    } else {
        CHECK(m->output.type == type_or_mix && m->layers[5].ffn_gate.type == type_or_mix);
        CHECK(m->tok_embd.type == type_or_mix);
    }
    CHECK(m->layers[0].attn_norm.type == GGML_TYPE_F32);
    check_matrix_stats(&m->tok_embd);
    check_matrix_stats(&m->output);
    check_matrix_stats(&m->layers[0].ffn_down);
    check_matrix_stats(&m->layers[1].ffn_down);
    check_matrix_stats(&m->layers[2].attn_q);
    check_matrix_stats(&m->layers[6].attn_output);
    double mean, std;
    tensor_stats(&m->layers[4].post_ffw_norm, 1, &mean, &std);
    CHECKF(fabs(mean - 1.0) < 0.02 && std > 0.03 && std < 0.08, "norm mean %g std %g", mean, std);
    tensor_stats(&m->layers[4].attn_k_norm, 1, &mean, &std);
    CHECK(fabs(mean - 1.0) < 0.05 && std > 0.02 && std < 0.1);
    /* Different tensors draw different values. */
    CHECK(memcmp(m->layers[2].ffn_gate.data, m->layers[2].ffn_up.data,
                 m->layers[2].ffn_up.row_bytes) != 0);
    CHECK(memcmp(m->layers[2].ffn_gate.data, m->layers[3].ffn_gate.data,
                 m->layers[2].ffn_up.row_bytes) != 0);
    muser_model_free(m);
}

/* Decode one codepoint of the byte-level alphabet back to its byte (-1 if not in it). */
static int byte_of_codepoint(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        if (!printable && 0x100 + n++ == cp)
            return (int)b;
    }
    return -1;
}

/* Token text -> raw bytes; false if it is not valid byte-level text. */
static bool unmap(gguf_str s, uint8_t *out, size_t *n)
{
    *n = 0;
    for (uint64_t i = 0; i < s.len;) {
        uint8_t c = (uint8_t)s.ptr[i];
        uint32_t cp;
        if (c < 0x80) {
            cp = c;
            i++;
        } else if ((c & 0xe0) == 0xc0 && i + 1 < s.len) {
            cp = (uint32_t)(c & 0x1f) << 6 | ((uint8_t)s.ptr[i + 1] & 0x3f);
            i += 2;
        } else {
            return false;
        }
        int b = byte_of_codepoint(cp);
        if (b < 0)
            return false;
        out[(*n)++] = (uint8_t)b;
    }
    return true;
}

static void test_tokenizer_metadata(void)
{
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    muser_error err = {0};
    CHECK_OK(muser_synth_write(&o, path_a, NULL, &err), &err);
    gguf_file *f = NULL;
    CHECK_OK(gguf_open(&f, path_a, &err), &err);
    if (!f)
        return;
    gguf_str s;
    CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s, &err) == 0 && gguf_str_eq(s, "gpt2"));
    CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &s, &err) == 0 && gguf_str_eq(s, "default"));
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *mer = gguf_find_kv(f, "tokenizer.ggml.merges");
    uint64_t n_types = 0;
    const void *types_raw = NULL;
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &n_types, &types_raw,
                          &err),
             &err);
    uint32_t V = 0, bos = 0, eos = 0, eot = 0;
    CHECK_OK(gguf_get_u32(f, "muse.vocab_size", &V, &err), &err);
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, &err), &err);
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos, &err), &err);
    CHECK_OK(gguf_get_u32(f, "tokenizer.ggml.eot_token_id", &eot, &err), &err);
    if (!tok || !mer || !types_raw || tok->arr_n != V || n_types != V) {
        CHECK(!"tokenizer arrays missing or the wrong length");
        gguf_close(f);
        return;
    }
    int32_t *types = malloc(V * sizeof *types); /* metadata arrays are not aligned in the map */
    memcpy(types, types_raw, V * sizeof *types);
    /* The 256 byte tokens in byte order, in GPT-2's alphabet. */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 'A'), "A") && gguf_str_eq(gguf_arr_str(tok, '~'), "~"));
    CHECK(gguf_str_eq(gguf_arr_str(tok, ' '), "\xc4\xa0"));   /* U+0120 'Ġ' */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 0), "\xc4\x80"));     /* U+0100 */
    CHECK(gguf_str_eq(gguf_arr_str(tok, '\n'), "\xc4\x8a"));  /* U+010A 'Ċ' */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 0x7f), "\xc4\xa1"));  /* U+0121 */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 0xad), "\xc5\x83"));  /* U+0143: the last mapped byte */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 0xa1), "\xc2\xa1"));  /* printable: itself */
    CHECK(gguf_str_eq(gguf_arr_str(tok, 0xff), "\xc3\xbf"));
    for (uint32_t b = 0; b < 256; b++) {
        uint8_t raw[64];
        size_t n;
        CHECK(unmap(gguf_arr_str(tok, b), raw, &n) && n == 1 && raw[0] == b);
    }
    /* Normal tokens are distinct byte strings; control tokens sit at the end. */
    uint32_t n_control = 0;
    for (uint32_t i = 0; i < V; i++) {
        CHECK(types[i] == 1 || types[i] == 3);
        n_control += types[i] == 3;
        if (types[i] == 3)
            CHECK(i >= V - 8);
    }
    CHECK(n_control == 8);
    CHECK(types[bos] == 3 && gguf_str_eq(gguf_arr_str(tok, bos), "<|begin_of_text|>"));
    CHECK(types[eos] == 3 && gguf_str_eq(gguf_arr_str(tok, eos), "<|end_of_text|>"));
    CHECK(types[eot] == 3 && gguf_str_eq(gguf_arr_str(tok, eot), "<|end|>"));
    CHECK(gguf_str_eq(gguf_arr_str(tok, V - 3), "<|assistant|>"));
    CHECK(gguf_get_str(f, "tokenizer.chat_template", &s, &err) == 0 &&
          memmem(s.ptr, s.len, "<|assistant|>", 13) != NULL);
    /* Every merge "a b" joins two existing tokens into an existing token, and every normal
     * token past the bytes is made by some merge. Quadratic, but V is ~768. */
    CHECK(mer->arr_n >= V - 256 - 8);
    bool *made = calloc(V, 1);
    for (uint64_t i = 0; i < mer->arr_n; i++) {
        gguf_str m = gguf_arr_str(mer, i);
        const char *sp = memchr(m.ptr, ' ', m.len);
        CHECKF(sp != NULL, "merge %llu has no space", (unsigned long long)i);
        if (!sp)
            continue;
        gguf_str left = {m.ptr, (uint64_t)(sp - m.ptr)};
        gguf_str right = {sp + 1, m.len - left.len - 1};
        int found_l = 0, found_r = 0;
        int64_t joined = -1;
        for (uint32_t t = 0; t < V; t++) {
            gguf_str ts = gguf_arr_str(tok, t);
            found_l |= ts.len == left.len && !memcmp(ts.ptr, left.ptr, left.len);
            found_r |= ts.len == right.len && !memcmp(ts.ptr, right.ptr, right.len);
            if (ts.len == left.len + right.len && !memcmp(ts.ptr, left.ptr, left.len) &&
                !memcmp(ts.ptr + left.len, right.ptr, right.len))
                joined = t;
        }
        CHECKF(found_l && found_r && joined >= 0, "merge %llu '%.*s' is not closed",
               (unsigned long long)i, (int)m.len, m.ptr);
        if (joined >= 0)
            made[joined] = true;
    }
    for (uint32_t t = 256; t < V - 8; t++)
        CHECKF(made[t], "token %u made by no merge", t);
    free(made);
    /* Learned merges come first: the corpus is English, so " the" must be an early token. */
    int64_t the = -1;
    for (uint32_t t = 256; t < 400; t++)
        if (gguf_str_eq(gguf_arr_str(tok, t), "\xc4\xa0the"))
            the = t;
    CHECK(the >= 0);

    /* The tokenizer module reads it: English compresses, text round-trips, control texts are
     * single tokens when special tokens are parsed. */
    muser_tokenizer *tk = NULL;
    CHECK_OK(muser_tokenizer_load(&tk, f, &err), &err);
    if (tk) {
        const char *text = "The keeper climbed the stairs, and the storms came from the north.";
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(muser_tokenize(tk, text, strlen(text), false, false, &ids, &n, &err), &err);
        CHECKF(n > 0 && n < strlen(text) / 3, "%zu tokens for %zu bytes", n, strlen(text));
        char *back = NULL;
        CHECK_OK(muser_detokenize(tk, ids, n, &back, &err), &err);
        CHECK(back && !strcmp(back, text));
        free(back);
        free(ids);
        ids = NULL;
        const char *chat = "<|user|>\nhi<|end|>";
        CHECK_OK(muser_tokenize(tk, chat, strlen(chat), true, true, &ids, &n, &err), &err);
        CHECK(n >= 4 && ids[0] == (int32_t)bos && ids[1] == (int32_t)V - 4 &&
              ids[n - 1] == (int32_t)eot);
        CHECK(muser_token_is_eog(tk, (int32_t)eot) && muser_token_is_eog(tk, (int32_t)eos));
        free(ids);
        muser_tokenizer_free(tk);
    }
    free(types);
    gguf_close(f);
}

static void test_llama_and_errors(void)
{
    muser_synth_opts o;
    muser_synth_opts_default(&o);
    o.arch = MUSER_ARCH_LLAMA;
    o.type = GGML_TYPE_Q8_0;
    muser_error err = {0};
    CHECK_OK(muser_synth_write(&o, path_a, NULL, &err), &err);
    muser_model *m = NULL;
    CHECK_OK(muser_model_load(&m, path_a, &err), &err);
    if (m) {
        CHECK(m->hp.arch == MUSER_ARCH_LLAMA && !m->hp.attn_gate && !m->hp.sandwich);
        CHECK(m->hp.n_layer == 8 && m->hp.head_dim == 32 && m->hp.n_head_kv == 2);
        CHECK(m->output.data != m->tok_embd.data);
        CHECK(gguf_find_tensor(m->gguf, "blk.0.attn_gate.weight") == NULL);
        check_matrix_stats(&m->layers[3].attn_k);
        muser_model_free(m);
    }
    /* qwen3: llama with QK-norm */
    o.arch = MUSER_ARCH_QWEN3;
    CHECK_OK(muser_synth_write(&o, path_a, NULL, &err), &err);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path_a, &err), &err);
    if (m) {
        CHECK(m->hp.arch == MUSER_ARCH_QWEN3 && m->hp.qk_norm && !m->hp.attn_gate && !m->hp.sandwich);
        CHECK(gguf_find_tensor(m->gguf, "blk.0.attn_q_norm.weight") != NULL);
        CHECK(gguf_find_tensor(m->gguf, "blk.0.attn_gate.weight") == NULL);
        muser_model_free(m);
    }
    o.arch = (muser_arch)99;
    CHECK(muser_synth_write(&o, path_a, NULL, &err) == MUSER_E_ARG);
    o.arch = MUSER_ARCH_MUSE;
    o.type = GGML_TYPE_Q4_0;
    CHECK(muser_synth_write(&o, path_a, NULL, &err) == MUSER_E_ARG);
    o.type = MUSER_SYNTH_TYPE_MIX;
    CHECK(muser_synth_write(&o, "/nonexistent/dir/x.gguf", NULL, &err) != 0);
    CHECK(muser_synth_preset_from_name("glimmer") == MUSER_SYNTH_GLIMMER);
    CHECK(muser_synth_preset_from_name("huge") == -1);
    /* The glimmer preset's hyper-parameters are SPEC §1's. */
    o.preset = MUSER_SYNTH_GLIMMER;
    muser_hparams hp;
    CHECK_OK(muser_synth_hparams(&o, &hp, &err), &err);
    CHECK(hp.n_layer == 52 && hp.n_embd == 6656 && hp.n_ff == 19968 && hp.n_head == 32);
    CHECK(hp.n_head_kv == 2 && hp.head_dim == 128 && hp.n_vocab == 202048);
    CHECK(hp.n_ctx_train == 131072 && hp.swa_window == 2048 && hp.swa_pattern == 4);
    CHECK(hp.rope_theta == 500000.0f && hp.logit_scale == 0.196116f && hp.final_softcap == 20.0f);
    CHECK(hp.rms_eps == 1e-5f && hp.post_norm_eps == 1e-8f);
}

int main(void)
{
    snprintf(path_a, sizeof path_a, "test_synth_a_%d.gguf", (int)getpid());
    snprintf(path_b, sizeof path_b, "test_synth_b_%d.gguf", (int)getpid());
    test_determinism();
    test_tiny_binds((uint32_t)MUSER_SYNTH_TYPE_MIX);
    test_tiny_binds(GGML_TYPE_F16);
    test_tiny_binds(GGML_TYPE_Q8_0);
    test_tiny_binds(GGML_TYPE_Q6_K);
    test_tiny_binds(GGML_TYPE_Q4_K);
    const char *san = getenv("MUSER_SANITIZED");
    if (!san || strcmp(san, "1"))
        test_tiny_binds(GGML_TYPE_F32);
    test_tokenizer_metadata();
    test_llama_and_errors();
    unlink(path_a);
    unlink(path_b);
    return check_report("test_synth");
}
