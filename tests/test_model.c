/* test_model.c — model binding: a mini muse/llama/qwen3 GGUF written here binds with the right
 * hyper-parameters and tensor views; every corruption (missing tensor, wrong dims, unsupported
 * type, f16 norm, bad or missing hyper-parameter, unknown arch) fails naming the tensor or key. */
#include "check.h"
#include "model.h"
#include "quant.h"

#include <string.h>
#include <unistd.h>

/* Mini model: 4 layers (layer 3 FULL under pattern 4), E 64, F 128, 4 query / 2 KV heads of 16,
 * vocab 40, window 8. Matrices mostly F32, with Q8_0 / F16 / BF16 ones to cover the types. */
enum { L = 4, E = 64, F = 128, H = 4, HKV = 2, D = 16, V = 40, W = 8, CTX = 256 };

typedef struct mini_spec {
    const char *arch;
    const char *skip_tensor;      /* leave this tensor out */
    const char *odd_tensor;       /* write it with these dims / type instead */
    uint64_t odd_ne0, odd_ne1;    /* odd_ne1 == 0: a vector */
    uint32_t odd_type;
    const char *skip_key;         /* "<arch>." suffix of a key to leave out */
    const char *u32_key;          /* "<arch>." suffix of a u32 key to set to u32_val */
    uint32_t u32_val;
    const char *f32_key;          /* ... of an f32 key to set to f32_val */
    float f32_val;
    bool no_output;               /* leave output.weight out (tied) */
    bool tokens_not_vocab_size;   /* give V as tokenizer.ggml.tokens, not vocab_size */
} mini_spec;

static uint8_t zeros[1 << 20];

typedef struct mini_writer {
    gguf_writer *w;
    const mini_spec *s;
    uint64_t bytes;               /* sum of declared tensor bytes */
    char names[256][64];
    uint64_t nbytes[256];
    int n;
} mini_writer;

static void add(mini_writer *mw, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1)
{
    const mini_spec *s = mw->s;
    if (s->skip_tensor && !strcmp(name, s->skip_tensor))
        return;
    if (s->odd_tensor && !strcmp(name, s->odd_tensor)) {
        ne0 = s->odd_ne0;
        ne1 = s->odd_ne1;
        type = s->odd_type;
    }
    muser_error err = {0};
    const uint64_t ne[2] = {ne0, ne1 ? ne1 : 1};
    CHECK_OK(gguf_writer_add_tensor(mw->w, name, type, ne1 ? 2 : 1, ne, &err), &err);
    snprintf(mw->names[mw->n], sizeof mw->names[0], "%s", name);
    mw->nbytes[mw->n] = quant_row_bytes(type, ne0) * (ne1 ? ne1 : 1);
    mw->bytes += mw->nbytes[mw->n];
    mw->n++;
}

static void set_u32(mini_writer *mw, const char *arch, const char *suffix, uint32_t v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (mw->s->skip_key && !strcmp(suffix, mw->s->skip_key))
        return;
    if (mw->s->u32_key && !strcmp(suffix, mw->s->u32_key))
        v = mw->s->u32_val;
    gguf_writer_set_u32(mw->w, key, v);
}

static void set_f32(mini_writer *mw, const char *arch, const char *suffix, float v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (mw->s->skip_key && !strcmp(suffix, mw->s->skip_key))
        return;
    if (mw->s->f32_key && !strcmp(suffix, mw->s->f32_key))
        v = mw->s->f32_val;
    gguf_writer_set_f32(mw->w, key, v);
}

/* Write the mini model to path; returns the sum of tensor bytes. */
static uint64_t write_mini(const char *path, const mini_spec *s)
{
    mini_writer mw = {.w = gguf_writer_new(0), .s = s};
    const char *a = s->arch;
    const bool muse = !strcmp(a, "muse"), qwen3 = !strcmp(a, "qwen3");
    gguf_writer_set_str(mw.w, "general.architecture", a);
    set_u32(&mw, a, "block_count", L);
    set_u32(&mw, a, "context_length", CTX);
    set_u32(&mw, a, "embedding_length", E);
    set_u32(&mw, a, "feed_forward_length", F);
    set_u32(&mw, a, "attention.head_count", H);
    set_u32(&mw, a, "attention.head_count_kv", HKV);
    set_u32(&mw, a, "attention.key_length", D);
    set_u32(&mw, a, "attention.value_length", D);
    set_f32(&mw, a, "attention.layer_norm_rms_epsilon", 1e-5f);
    set_f32(&mw, a, "rope.freq_base", 500000.0f);
    set_u32(&mw, a, "rope.dimension_count", D);
    if (s->tokens_not_vocab_size) {
        const char *toks[V];
        char buf[V][16];
        for (int i = 0; i < V; i++) {
            snprintf(buf[i], sizeof buf[i], "t%d", i);
            toks[i] = buf[i];
        }
        gguf_writer_set_arr_str(mw.w, "tokenizer.ggml.tokens", toks, NULL, V);
    } else {
        set_u32(&mw, a, "vocab_size", V);
    }
    if (muse) {
        set_f32(&mw, a, "attention.post_norm_epsilon", 1e-8f);
        set_u32(&mw, a, "attention.sliding_window", W);
        set_u32(&mw, a, "attention.sliding_window_pattern", 4);
        set_f32(&mw, a, "logit_scale", 0.25f);
        set_f32(&mw, a, "final_logit_softcapping", 20.0f);
    }
    add(&mw, "token_embd.weight", GGML_TYPE_BF16, E, V);
    char n[64];
    for (int l = 0; l < L; l++) {
#define T(suffix) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, suffix), n)
        add(&mw, T("attn_norm"), GGML_TYPE_F32, E, 0);
        add(&mw, T("attn_q"), GGML_TYPE_Q8_0, E, H * D);
        add(&mw, T("attn_k"), GGML_TYPE_F32, E, HKV * D);
        add(&mw, T("attn_v"), GGML_TYPE_F32, E, HKV * D);
        if (muse)
            add(&mw, T("attn_gate"), GGML_TYPE_F32, E, H * D);
        if (muse || qwen3) {
            add(&mw, T("attn_q_norm"), GGML_TYPE_F32, D, 0);
            add(&mw, T("attn_k_norm"), GGML_TYPE_F32, D, 0);
        }
        add(&mw, T("attn_output"), GGML_TYPE_F32, H * D, E);
        if (muse)
            add(&mw, T("post_attention_norm"), GGML_TYPE_F32, E, 0);
        add(&mw, T("ffn_norm"), GGML_TYPE_F32, E, 0);
        add(&mw, T("ffn_gate"), GGML_TYPE_F32, E, F);
        add(&mw, T("ffn_up"), GGML_TYPE_F32, E, F);
        add(&mw, T("ffn_down"), GGML_TYPE_F16, F, E);
        if (muse)
            add(&mw, T("post_ffw_norm"), GGML_TYPE_F32, E, 0);
#undef T
    }
    add(&mw, "output_norm.weight", GGML_TYPE_F32, E, 0);
    if (!s->no_output)
        add(&mw, "output.weight", GGML_TYPE_F32, E, V);
    muser_error err = {0};
    CHECK_OK(gguf_writer_begin(mw.w, path, &err), &err);
    for (int i = 0; i < mw.n; i++)
        for (uint64_t done = 0; done < mw.nbytes[i];) {
            uint64_t k = mw.nbytes[i] - done < sizeof zeros ? mw.nbytes[i] - done : sizeof zeros;
            CHECK_OK(gguf_writer_tensor_data(mw.w, zeros, k, &err), &err);
            done += k;
        }
    CHECK_OK(gguf_writer_finish(mw.w, &err), &err);
    gguf_writer_free(mw.w);
    return mw.bytes;
}

static char path[64];

/* Write spec, load it, and expect failure with code and every needle in the message. */
static void expect_fail(const mini_spec *s, int code, const char *needle1, const char *needle2)
{
    write_mini(path, s);
    muser_model *m = (muser_model *)1;
    muser_error err = {0};
    int rc = muser_model_load(&m, path, &err);
    CHECKF(rc == code, "rc %d, want %d (%s)", rc, code, err.msg);
    CHECK(m == NULL);
    CHECKF(needle1 == NULL || strstr(err.msg, needle1), "'%s' lacks '%s'", err.msg, needle1);
    CHECKF(needle2 == NULL || strstr(err.msg, needle2), "'%s' lacks '%s'", err.msg, needle2);
    if (rc == MUSER_OK)
        muser_model_free(m);
}

static void test_muse_binds(void)
{
    mini_spec s = {.arch = "muse"};
    uint64_t bytes = write_mini(path, &s);
    muser_model *m = NULL;
    muser_error err = {0};
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (!m)
        return;
    const muser_hparams *hp = &m->hp;
    CHECK(hp->arch == MUSER_ARCH_MUSE);
    CHECK(hp->n_layer == L && hp->n_embd == E && hp->n_ff == F && hp->n_head == H);
    CHECK(hp->n_head_kv == HKV && hp->head_dim == D && hp->n_vocab == V && hp->n_ctx_train == CTX);
    CHECK(hp->rms_eps == 1e-5f && hp->post_norm_eps == 1e-8f);
    CHECK(hp->swa_window == W && hp->swa_pattern == 4);
    CHECK(hp->rope_theta == 500000.0f && hp->rope_dim == D);
    CHECK(hp->logit_scale == 0.25f && hp->final_softcap == 20.0f);
    CHECK(hp->attn_scale == 0.25f); /* 1/sqrt(16) */
    CHECK(hp->entry_norm && hp->sandwich && hp->attn_gate && hp->qk_norm);
    CHECK(muser_layer_is_swa(hp, 0) && muser_layer_is_swa(hp, 2) && !muser_layer_is_swa(hp, 3));
    CHECK(muser_layer_has_rope(hp, 1) && !muser_layer_has_rope(hp, 3));
    CHECK(m->weight_bytes == bytes);
    CHECK(m->tok_embd.type == GGML_TYPE_BF16 && m->tok_embd.cols == E && m->tok_embd.rows == V);
    CHECK(m->tok_embd.row_bytes == 2 * E);
    CHECK(m->output.data != m->tok_embd.data && m->output.rows == V);
    const muser_layer *l2 = &m->layers[2];
    CHECK(l2->attn_q.type == GGML_TYPE_Q8_0 && l2->attn_q.cols == E && l2->attn_q.rows == H * D);
    CHECK(l2->attn_q.row_bytes == (E / 32) * 34);
    CHECK(l2->attn_k.rows == HKV * D && l2->attn_gate.rows == H * D);
    CHECK(l2->attn_output.cols == H * D && l2->attn_output.rows == E);
    CHECK(l2->ffn_down.type == GGML_TYPE_F16 && l2->ffn_down.cols == F && l2->ffn_down.rows == E);
    CHECK(l2->attn_q_norm.cols == D && l2->attn_q_norm.rows == 1);
    CHECK(l2->post_ffw_norm.data && l2->post_attention_norm.data);
    CHECK(l2->attn_k.name && !strcmp(l2->attn_k.name, "blk.2.attn_k.weight"));
    /* Tensor views point into the map at the tensor's data. */
    const gguf_tensor *gt = gguf_find_tensor(m->gguf, "blk.2.ffn_up.weight");
    CHECK(gt && l2->ffn_up.data == gt->data);
    CHECK(muser_tensor_row(&l2->ffn_up, 3) ==
          (const uint8_t *)gt->data + 3 * l2->ffn_up.row_bytes);
    muser_model_free(m);

    /* post_norm_epsilon absent: SPEC's 1e-8. */
    s.skip_key = "attention.post_norm_epsilon";
    write_mini(path, &s);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    CHECK(m && m->hp.post_norm_eps == 1e-8f);
    muser_model_free(m);
    /* sliding_window_pattern absent: 4. */
    s.skip_key = "attention.sliding_window_pattern";
    write_mini(path, &s);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    CHECK(m && m->hp.swa_pattern == 4);
    muser_model_free(m);
}

static void test_muse_corruptions(void)
{
    mini_spec s = {.arch = "muse", .skip_tensor = "blk.1.attn_gate.weight"};
    expect_fail(&s, MUSER_E_SHAPE, "blk.1.attn_gate.weight", "missing tensor");
    s = (mini_spec){.arch = "muse", .skip_tensor = "output.weight"}; /* muse never ties */
    expect_fail(&s, MUSER_E_SHAPE, "output.weight", "missing");
    s = (mini_spec){.arch = "muse", .skip_tensor = "blk.3.post_ffw_norm.weight"};
    expect_fail(&s, MUSER_E_SHAPE, "blk.3.post_ffw_norm.weight", NULL);

    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.3.attn_k.weight", .odd_ne0 = E,
                    .odd_ne1 = 2 * HKV * D, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "blk.3.attn_k.weight: dims [64, 64], expected [64, 32]", NULL);
    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.0.attn_gate.weight", .odd_ne0 = E,
                    .odd_ne1 = HKV * D, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "blk.0.attn_gate.weight: dims [64, 32], expected [64, 64]",
                NULL);
    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.0.ffn_down.weight", .odd_ne0 = E,
                    .odd_ne1 = F, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "blk.0.ffn_down.weight: dims [64, 128], expected [128, 64]",
                NULL);
    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.1.attn_q_norm.weight", .odd_ne0 = 2 * D,
                    .odd_ne1 = 0, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "blk.1.attn_q_norm.weight: dims [32], expected [16]", NULL);
    /* a norm written as a matrix [E, 1] with 2 dims is still [E]; [E, 2] is not */
    s = (mini_spec){.arch = "muse", .odd_tensor = "output_norm.weight", .odd_ne0 = E,
                    .odd_ne1 = 2, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "output_norm.weight: dims [64, 2], expected [64]", NULL);
    s = (mini_spec){.arch = "muse", .odd_tensor = "token_embd.weight", .odd_ne0 = E,
                    .odd_ne1 = V + 1, .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "token_embd.weight", "expected [64, 40]");

    /* unsupported type (q4_0: a known ggml type muser does not compute with) */
    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.2.attn_v.weight", .odd_ne0 = E,
                    .odd_ne1 = HKV * D, .odd_type = GGML_TYPE_Q4_0};
    expect_fail(&s, MUSER_E_UNSUPPORTED, "blk.2.attn_v.weight", "q4_0");
    /* norms must be f32 */
    s = (mini_spec){.arch = "muse", .odd_tensor = "blk.0.ffn_norm.weight", .odd_ne0 = E,
                    .odd_ne1 = 0, .odd_type = GGML_TYPE_F16};
    expect_fail(&s, MUSER_E_UNSUPPORTED, "blk.0.ffn_norm.weight", "must be f32");

    /* hyper-parameters */
    s = (mini_spec){.arch = "muse", .u32_key = "attention.head_count_kv", .u32_val = 3};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.head_count_kv", "divide");
    s = (mini_spec){.arch = "muse", .u32_key = "attention.head_count_kv", .u32_val = 0};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.head_count_kv", NULL);
    s = (mini_spec){.arch = "muse", .u32_key = "attention.key_length", .u32_val = 15};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.key_length", "even");
    s = (mini_spec){.arch = "muse", .u32_key = "attention.value_length", .u32_val = 32};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.value_length", NULL);
    s = (mini_spec){.arch = "muse", .u32_key = "block_count", .u32_val = 0};
    expect_fail(&s, MUSER_E_FORMAT, "muse.block_count", NULL);
    s = (mini_spec){.arch = "muse", .u32_key = "embedding_length", .u32_val = 0};
    expect_fail(&s, MUSER_E_FORMAT, "muse.embedding_length", NULL);
    s = (mini_spec){.arch = "muse", .u32_key = "attention.sliding_window", .u32_val = 0};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.sliding_window", NULL);
    s = (mini_spec){.arch = "muse", .u32_key = "rope.dimension_count", .u32_val = 8};
    expect_fail(&s, MUSER_E_FORMAT, "muse.rope.dimension_count", NULL);
    /* embedding_length 32 with 40 vocab rows of 64: caught as the tensor dims it implies */
    s = (mini_spec){.arch = "muse", .u32_key = "embedding_length", .u32_val = 32};
    expect_fail(&s, MUSER_E_SHAPE, "token_embd.weight", "expected [32, 40]");
    s = (mini_spec){.arch = "muse", .f32_key = "attention.layer_norm_rms_epsilon",
                    .f32_val = 0.0f};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.layer_norm_rms_epsilon", NULL);
    s = (mini_spec){.arch = "muse", .f32_key = "attention.post_norm_epsilon", .f32_val = -1.0f};
    expect_fail(&s, MUSER_E_FORMAT, "muse.attention.post_norm_epsilon", NULL);
    s = (mini_spec){.arch = "muse", .f32_key = "logit_scale", .f32_val = 0.0f};
    expect_fail(&s, MUSER_E_FORMAT, "muse.logit_scale", NULL);
    s = (mini_spec){.arch = "muse", .f32_key = "final_logit_softcapping", .f32_val = -2.0f};
    expect_fail(&s, MUSER_E_FORMAT, "muse.final_logit_softcapping", NULL);
    /* required keys */
    s = (mini_spec){.arch = "muse", .skip_key = "attention.sliding_window"};
    expect_fail(&s, MUSER_E_SHAPE, "muse.attention.sliding_window", NULL);
    s = (mini_spec){.arch = "muse", .skip_key = "feed_forward_length"};
    expect_fail(&s, MUSER_E_SHAPE, "muse.feed_forward_length", NULL);
    s = (mini_spec){.arch = "muse", .skip_key = "rope.freq_base"};
    expect_fail(&s, MUSER_E_SHAPE, "muse.rope.freq_base", NULL);
    s = (mini_spec){.arch = "muse", .skip_key = "attention.layer_norm_rms_epsilon"};
    expect_fail(&s, MUSER_E_SHAPE, "muse.attention.layer_norm_rms_epsilon", NULL);
    /* unknown architecture */
    s = (mini_spec){.arch = "gpt9"};
    expect_fail(&s, MUSER_E_UNSUPPORTED, "gpt9", NULL);
}

static void test_llama_and_qwen3(void)
{
    /* llama: no gate, no QK-norm, no sandwich; output.weight left out -> tied; vocab from the
     * tokenizer's token list; theta from the file. */
    mini_spec s = {.arch = "llama", .no_output = true, .tokens_not_vocab_size = true};
    uint64_t bytes = write_mini(path, &s);
    muser_model *m = NULL;
    muser_error err = {0};
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (m) {
        const muser_hparams *hp = &m->hp;
        CHECK(hp->arch == MUSER_ARCH_LLAMA && !strcmp(muser_arch_name(hp->arch), "llama"));
        CHECK(hp->n_vocab == V);
        CHECK(!hp->entry_norm && !hp->sandwich && !hp->attn_gate && !hp->qk_norm);
        CHECK(hp->swa_window == 0 && hp->logit_scale == 1.0f && hp->final_softcap == 0.0f);
        CHECK(!muser_layer_is_swa(hp, 0) && muser_layer_has_rope(hp, 3));
        CHECK(m->output.data == m->tok_embd.data && m->output.rows == V);
        CHECK(m->weight_bytes == bytes); /* the tied matrix counted once */
        CHECK(m->layers[0].attn_gate.data == NULL && m->layers[0].attn_q_norm.data == NULL);
        muser_model_free(m);
    }
    /* llama with output.weight of the wrong shape */
    s = (mini_spec){.arch = "llama", .odd_tensor = "output.weight", .odd_ne0 = E, .odd_ne1 = V - 1,
                    .odd_type = GGML_TYPE_F32};
    expect_fail(&s, MUSER_E_SHAPE, "output.weight", "expected [64, 40]");
    /* llama without key_length: D = E/H */
    s = (mini_spec){.arch = "llama", .skip_key = "attention.key_length"};
    write_mini(path, &s);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    CHECK(m && m->hp.head_dim == E / H);
    muser_model_free(m);
    /* llama without rope.freq_base: 10000 */
    s = (mini_spec){.arch = "llama", .skip_key = "rope.freq_base"};
    write_mini(path, &s);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    CHECK(m && m->hp.rope_theta == 10000.0f);
    muser_model_free(m);

    /* qwen3: llama + QK-norm */
    s = (mini_spec){.arch = "qwen3"};
    bytes = write_mini(path, &s);
    m = NULL;
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (m) {
        CHECK(m->hp.arch == MUSER_ARCH_QWEN3 && m->hp.qk_norm && !m->hp.attn_gate);
        CHECK(m->layers[1].attn_k_norm.data && m->layers[1].attn_k_norm.cols == D);
        CHECK(m->weight_bytes == bytes);
        muser_model_free(m);
    }
    s = (mini_spec){.arch = "qwen3", .skip_tensor = "blk.2.attn_k_norm.weight"};
    expect_fail(&s, MUSER_E_SHAPE, "blk.2.attn_k_norm.weight", NULL);
}

static void test_bad_calls(void)
{
    muser_model *m = (muser_model *)1;
    muser_error err = {0};
    CHECK(muser_model_load(&m, "/nonexistent/dir/model.gguf", &err) == MUSER_E_IO);
    CHECK(m == NULL);
    CHECK(muser_model_bind(NULL, NULL, &err) == MUSER_E_ARG);
    muser_model_free(NULL);
    CHECK(!strcmp(muser_arch_name(MUSER_ARCH_QWEN3), "qwen3"));
}

int main(void)
{
    snprintf(path, sizeof path, "test_model_%d.gguf", (int)getpid());
    test_muse_binds();
    test_muse_corruptions();
    test_llama_and_qwen3();
    test_bad_calls();
    unlink(path);
    return check_report("test_model");
}
