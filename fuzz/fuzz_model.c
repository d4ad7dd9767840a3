/* fuzz_model.c — libFuzzer entry for the model binder (src/model.c). The input is an edit script
 * applied to a micro model (muse, llama or qwen3: 2 layers, E=8, H=2, HKV=1, D=4, F=16, V=32,
 * every tensor present and consistent): an edit deletes or retypes a hyper-parameter key, sets
 * it to an edge value (0, 1, odd, 2^20+1, 2^31, UINT32_MAX, NaN, Inf, negative...), changes the
 * architecture name or the tokenizer's token count, deletes, renames, duplicates or retypes a
 * tensor or changes its dims — or re-draws the whole model consistently at other small sizes
 * (so unusual but valid shapes reach the forward pass). Weights are two rows quantized from
 * seeded random floats, repeated, or random bytes (NaN scales included) when the script says
 * so; tensors past 2 MiB or 2^19 elements in all are left out: every exec takes milliseconds.
 * The model is written with the real GGUF writer (memfd), opened, and bound. Checks: a refusal is
 * a negative status, a message naming the file, no model, and the file still ours to close; a
 * model that binds has the hyper-parameters' invariants (H % HKV == 0, D even, every tensor's
 * bytes inside the map); if it is small, an oracle session (1 thread, n_ctx <= 8) runs a 1-token
 * and then a 2-token forward that must succeed or fail closed with MUSER_E_NUMERIC. */
#include "fuzz_common.h"
#include "model.h"
#include "quant.h"
#include "session.h"
#include "util.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* muser_fuzz_cpu_supports (scripts/fuzz.sh's rename of __builtin_cpu_supports): fuzz_cpu_shim.c */

#define H "fuzz_model"
#define MAX_T 128
#define MAX_BYTES (2u << 20) /* a file above this is not written: the harness must stay fast */
#define MAX_ELEMS (1u << 19) /* nor one whose weights hold more elements (each is drawn) */

enum { K_ABSENT, K_U32, K_I32, K_U64, K_F32, K_STR, K_BOOL, K_AU32 };

typedef struct mkv {
    const char *suffix; /* after "<arch>." */
    int kind;
    uint64_t u;
    float f;
} mkv;

static const char *const suffixes[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "vocab_size", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "logit_scale", "final_logit_softcapping",
    "attention.sliding_window", "attention.sliding_window_pattern",
    "attention.post_norm_epsilon",
};
#define N_KV (sizeof suffixes / sizeof suffixes[0])

typedef struct mtensor {
    char name[48];
    uint32_t type, n_dims;
    uint64_t ne[4];
    bool present;
} mtensor;

static struct {
    const char *arch_str;
    mkv kv[N_KV];
    uint32_t n_tokens; /* tokenizer.ggml.tokens count; 0 = absent */
    mtensor t[MAX_T];
    uint32_t n_t;
    bool raw_bytes; /* weights as random bytes instead of quantized floats */
} M;

static const char *const arch_names[] = {"muse", "llama", "qwen3", "gemma", "", "musE"};

static void set_u(int i, uint64_t v) { M.kv[i] = (mkv){suffixes[i], K_U32, v, 0}; }
static void set_f(int i, float v) { M.kv[i] = (mkv){suffixes[i], K_F32, 0, v}; }

static void add_t(const char *name, uint32_t type, uint64_t ne0, uint64_t ne1)
{
    if (M.n_t == MAX_T)
        return;
    mtensor *t = &M.t[M.n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = ne1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    t->ne[2] = t->ne[3] = 1;
    t->present = true;
}

/* A consistent model of the given shape; mat is the type of every matrix. */
static void base(int arch, uint32_t L, uint32_t E, uint32_t Hq, uint32_t Hkv, uint32_t D,
                 uint32_t F, uint32_t V, uint32_t ctx, uint32_t mat)
{
    memset(&M, 0, sizeof M);
    M.arch_str = arch_names[arch];
    set_u(0, L);
    set_u(1, ctx);
    set_u(2, E);
    set_u(3, F);
    set_u(4, Hq);
    set_u(5, Hkv);
    set_u(6, D);
    set_u(7, D);
    set_u(8, V);
    set_f(9, 1e-5f);
    set_f(10, 10000.0f);
    set_u(11, D);
    for (int i = 12; i < (int)N_KV; i++)
        M.kv[i] = (mkv){suffixes[i], K_ABSENT, 0, 0};
    if (arch == MUSER_ARCH_MUSE) {
        set_f(12, 0.5f);
        set_f(13, 30.0f);
        set_u(14, 4);
        set_u(15, 2);
        set_f(16, 1e-8f);
    }
    M.n_tokens = V;
    const bool muse = arch == MUSER_ARCH_MUSE, qk = arch != MUSER_ARCH_LLAMA;
    add_t("token_embd.weight", mat, E, V);
    add_t("output_norm.weight", GGML_TYPE_F32, E, 0);
    add_t("output.weight", mat, E, V);
    char n[48];
#define T(suffix, type, a, b)                                                                  \
    do {                                                                                       \
        snprintf(n, sizeof n, "blk.%u." suffix ".weight", l);                                  \
        add_t(n, type, a, b);                                                                  \
    } while (0)
    for (uint32_t l = 0; l < L; l++) {
        T("attn_norm", GGML_TYPE_F32, E, 0);
        T("attn_q", mat, E, Hq * D);
        T("attn_k", mat, E, Hkv * D);
        T("attn_v", mat, E, Hkv * D);
        if (muse)
            T("attn_gate", mat, E, Hq * D);
        if (qk) {
            T("attn_q_norm", GGML_TYPE_F32, D, 0);
            T("attn_k_norm", GGML_TYPE_F32, D, 0);
        }
        T("attn_output", mat, Hq * D, E);
        if (muse)
            T("post_attention_norm", GGML_TYPE_F32, E, 0);
        T("ffn_norm", GGML_TYPE_F32, E, 0);
        T("ffn_gate", mat, E, F);
        T("ffn_up", mat, E, F);
        T("ffn_down", mat, F, E);
        if (muse)
            T("post_ffw_norm", GGML_TYPE_F32, E, 0);
    }
#undef T
}

static const uint64_t odd_u[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 256, 4096, 4097, 65536,
                                 1u << 20, (1u << 20) + 1, 1u << 24, (1u << 24) + 1, 1u << 31,
                                 UINT32_MAX, (uint64_t)1 << 32};
static const float odd_f[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e-45f, 1e38f,
                              1.0f, 2.0f, 1e-30f};
static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16,  GGML_TYPE_BF16,
                                 GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K,
                                 GGML_TYPE_Q4_0, GGML_TYPE_Q5_K, GGML_TYPE_IQ2_XXS,
                                 GGML_TYPE_I32,  GGML_TYPE_F64,  4 /* removed id */, 77};
#define N_ODD_U (sizeof odd_u / sizeof odd_u[0])
#define N_ODD_F (sizeof odd_f / sizeof odd_f[0])
#define N_TYPES (sizeof types / sizeof types[0])

static void apply_edit(fuzz_in *in)
{
    const uint8_t op = fuzz_u8(in) % 12;
    const uint32_t x = fuzz_u32(in);
    mkv *kv = &M.kv[x % N_KV];
    mtensor *t = M.n_t ? &M.t[(x >> 8) % M.n_t] : NULL;
    switch (op) {
    case 0: kv->kind = K_ABSENT; break;
    case 1: kv->kind = K_U32; kv->u = odd_u[(x >> 8) % N_ODD_U]; break;
    case 2: kv->kind = K_U32; kv->u = fuzz_u32(in); break;
    case 3: { /* another type: a negative i32, a u64, a float, a string, a bool, an array */
        static const int kinds[6] = {K_I32, K_U64, K_F32, K_STR, K_BOOL, K_AU32};
        kv->kind = kinds[(x >> 8) % 6];
        kv->u = (x & 0x10000) ? (uint64_t)-1 : odd_u[(x >> 17) % N_ODD_U];
        kv->f = odd_f[(x >> 17) % N_ODD_F];
        break;
    }
    case 4: kv->kind = K_F32; kv->f = odd_f[(x >> 8) % N_ODD_F]; break;
    case 5: M.arch_str = arch_names[(x >> 8) % 6]; break;
    case 6: M.n_tokens = (x & 0x100) ? (uint32_t)odd_u[(x >> 9) % 12] : (x >> 9) % 80; break;
    case 7:
        if (t)
            t->present = false;
        break;
    case 8:
        if (t)
            t->type = types[(x >> 16) % N_TYPES];
        break;
    case 9:
        if (t) {
            uint32_t d = (x >> 16) & 3;
            t->ne[d] = (x & 0x40000) ? odd_u[(x >> 19) % 12] : ((x >> 19) % 40);
            if ((x >> 30) & 1)
                t->n_dims = 1 + ((x >> 28) & 3);
            else if (d + 1 > t->n_dims)
                t->n_dims = d + 1;
            for (uint32_t k = t->n_dims; k < 4; k++)
                t->ne[k] = 1;
        }
        break;
    case 10: /* rename (to another tensor's name: a duplicate, or an unknown layer) */
        if (t && M.n_t < MAX_T) {
            mtensor *u = &M.t[fuzz_u32(in) % M.n_t];
            mtensor *dst = (x & 0x10000) ? t : &M.t[M.n_t++];
            if (dst != t)
                *dst = *t;
            if (x & 0x20000)
                snprintf(dst->name, sizeof dst->name, "%s", u->name);
            else
                snprintf(dst->name, sizeof dst->name, "blk.%u.attn_q.weight", (x >> 18) % 6);
        }
        break;
    case 11: { /* re-draw consistently at other small sizes */
        static const uint32_t Es[] = {2, 4, 8, 12, 16, 32, 256};
        static const uint32_t Ds[] = {2, 4, 6, 8, 16};
        static const uint32_t Fs[] = {1, 4, 8, 16, 256};
        uint32_t y = fuzz_u32(in), Hkv = 1 + (y >> 4) % 3;
        uint32_t Hq = Hkv * (1 + (y >> 6) % 3);
        uint32_t E = Es[(y >> 8) % 7], F = Fs[(y >> 11) % 5];
        uint32_t mat = types[(y >> 14) % 6];
        if (mat >= GGML_TYPE_Q4_K && mat <= GGML_TYPE_Q6_K && (E % 256 || F % 256 ||
                                                             (Hq * Ds[0]) % 256))
            mat = GGML_TYPE_F16;
        if (mat == GGML_TYPE_Q8_0 && (E % 32 || F % 32))
            mat = GGML_TYPE_BF16;
        base((int)(y % 3), 1 + (y >> 2) % 3, E, Hq, Hkv, Ds[(y >> 17) % 5], F,
             1 + (y >> 20) % 64, 1 + (y >> 26) % 16, mat);
        M.raw_bytes = (y >> 31) & 1;
        break;
    }
    }
}

static uint64_t rng_state;
static uint64_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 17;
}

/* Write M into the memfd and open it; false when the harness's own file is too big or the
 * writer refuses a declared tensor (then that tensor is simply left out). */
static bool write_model(gguf_file **out)
{
    muser_error err = {0};
    gguf_writer *w = gguf_writer_new(0);
    char key[96];
    gguf_writer_set_str(w, "general.architecture", M.arch_str);
    for (size_t i = 0; i < N_KV; i++) {
        const mkv *kv = &M.kv[i];
        snprintf(key, sizeof key, "%s.%s", M.arch_str[0] ? M.arch_str : "x", kv->suffix);
        uint32_t arr[3] = {(uint32_t)kv->u, 1, 2};
        switch (kv->kind) {
        case K_ABSENT: break;
        case K_U32: gguf_writer_set_u32(w, key, (uint32_t)kv->u); break;
        case K_I32: gguf_writer_set_i32(w, key, (int32_t)kv->u); break;
        case K_U64: gguf_writer_set_u64(w, key, kv->u); break;
        case K_F32: gguf_writer_set_f32(w, key, kv->f); break;
        case K_STR: gguf_writer_set_str(w, key, "8"); break;
        case K_BOOL: gguf_writer_set_bool(w, key, true); break;
        case K_AU32: gguf_writer_set_arr(w, key, GGUF_TYPE_UINT32, arr, 3); break;
        }
    }
    if (M.n_tokens) {
        static char tok[4096][8];
        static const char *toks[4096];
        uint32_t n = M.n_tokens < 4096 ? M.n_tokens : 4096;
        for (uint32_t i = 0; i < n; i++) {
            snprintf(tok[i], sizeof tok[i], "t%u", i);
            toks[i] = tok[i];
        }
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, n);
    }
    uint64_t sizes[MAX_T], total = 0, elems = 0;
    uint32_t order[MAX_T], n = 0;
    for (uint32_t i = 0; i < M.n_t; i++) {
        const mtensor *t = &M.t[i];
        if (!t->present)
            continue;
        const quant_type_info *qi = quant_info(t->type);
        uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        uint64_t rb = qi ? quant_row_bytes(t->type, t->ne[0]) : 0;
        if (!rb || t->ne[1] > MAX_BYTES || rows > MAX_BYTES || rb > MAX_BYTES ||
            rb * rows > MAX_BYTES || total + rb * rows > MAX_BYTES || t->ne[0] > MAX_ELEMS ||
            elems + t->ne[0] * rows > MAX_ELEMS)
            continue;
        if (gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err))
            continue;
        sizes[n] = rb * rows;
        order[n++] = i;
        total += rb * rows;
        elems += t->ne[0] * rows;
    }
    const char *path = fuzz_memfd_path();
    if (gguf_writer_begin(w, path, &err)) {
        gguf_writer_free(w);
        return false;
    }
    static float src[1 << 16];
    static uint8_t buf[MAX_BYTES];
    for (uint32_t k = 0; k < n; k++) {
        const mtensor *t = &M.t[order[k]];
        const quant_type_info *qi = quant_info(t->type);
        uint64_t rows = sizes[k] / quant_row_bytes(t->type, t->ne[0]);
        bool quantize = !M.raw_bytes && qi->supported && t->ne[0] <= (1 << 16);
        if (quantize) {
            /* Two quantized rows, repeated: quantizing every row (the K-quant searches) would
             * take most of the exec time. */
            uint64_t rb = quant_row_bytes(t->type, t->ne[0]);
            for (uint64_t r = 0; r < rows; r++) {
                if (r >= 2) {
                    memcpy(buf + r * rb, buf + (r % 2) * rb, rb);
                    continue;
                }
                for (uint64_t c = 0; c < t->ne[0]; c++)
                    src[c] = (float)((int64_t)(rng() % 2001) - 1000) / 1000.0f;
                if (quant_quantize_row(t->type, src, buf + r * rb, t->ne[0]))
                    fuzz_fail(H, "quant_quantize_row refused a supported type");
            }
        } else
            for (uint64_t i = 0; i < sizes[k]; i++)
                buf[i] = (uint8_t)rng();
        if (gguf_writer_tensor_data(w, buf, sizes[k], &err))
            fuzz_fail(H, "writer refused a declared tensor's bytes");
    }
    int rc = gguf_writer_finish(w, &err);
    gguf_writer_free(w);
    if (rc)
        fuzz_fail(H, "writer could not finish the harness's file");
    if (gguf_open(out, path, &err)) {
        fprintf(stderr, H ": %s\n", err.msg);
        fuzz_fail(H, "the reader refused the writer's file");
    }
    return true;
}

static void check_tensor(const gguf_file *f, const muser_tensor *t)
{
    if (!t->data)
        return;
    const uint8_t *p = t->data;
    if (p < f->map || p + t->row_bytes * t->rows > f->map + f->size ||
        t->row_bytes != quant_row_bytes(t->type, t->cols))
        fuzz_fail(H, "a bound tensor outside the map or with a wrong row size");
}

static void run_forward(const muser_model *m, uint8_t tok_byte)
{
    const muser_hparams *hp = &m->hp;
    if (hp->n_layer > 4 || hp->n_embd > 512 || hp->n_ff > 1024 || hp->n_vocab > 4096 ||
        (uint64_t)hp->n_head * hp->head_dim > 512 || m->weight_bytes > MAX_BYTES ||
        hp->swa_window > 4096 /* kv.c sizes each SWA ring by the window, whatever n_ctx */)
        return;
    muser_session_opts o = {.backend = MUSER_BACKEND_ORACLE, .n_threads = 1,
                            .n_ctx = hp->n_ctx_train < 8 ? hp->n_ctx_train : 8};
    muser_session *s = NULL;
    muser_error err = {0};
    if (muser_session_new(&s, m, &o, &err)) {
        fprintf(stderr, H ": %s\n", err.msg);
        fuzz_fail(H, "a bound model could not get an oracle session");
    }
    static float logits[2 * 4096];
    int32_t toks[2] = {(int32_t)(tok_byte % hp->n_vocab), (int32_t)((tok_byte * 7u) % hp->n_vocab)};
    int rc = muser_session_forward(s, toks, 1, logits, false, &err);
    if (rc && rc != MUSER_E_NUMERIC) {
        fprintf(stderr, H ": %s\n", err.msg);
        fuzz_fail(H, "1-token oracle forward failed other than MUSER_E_NUMERIC");
    }
    if (!rc && o.n_ctx >= 3) {
        rc = muser_session_forward(s, toks, 2, logits, true, &err);
        if (rc && rc != MUSER_E_NUMERIC) {
            fprintf(stderr, H ": %s\n", err.msg);
            fuzz_fail(H, "2-token oracle forward failed other than MUSER_E_NUMERIC");
        }
    }
    muser_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size, 0};
    const uint8_t head = fuzz_u8(&in);
    base(head % 3, 2, 8, 2, 1, 4, 16, 32, 16, GGML_TYPE_F32);
    rng_state = 0x9E3779B97F4A7C15ull ^ head;
    for (int e = 0; e < 24 && fuzz_more(&in); e++)
        apply_edit(&in);
    gguf_file *f = NULL;
    if (!write_model(&f))
        return 0;
    muser_model *m = NULL;
    muser_error err = {0};
    int rc = muser_model_bind(&m, f, &err);
    if (rc) {
        if (rc > 0 || m || strncmp(err.msg, f->path, strlen(f->path)))
            fuzz_fail(H, "a refusal without a negative status, a message naming the file");
        gguf_close(f);
        return 0;
    }
    if (!m || m->gguf != f)
        fuzz_fail(H, "success without a model owning the file");
    const muser_hparams *hp = &m->hp;
    if (!hp->n_layer || !hp->n_head_kv || hp->n_head % hp->n_head_kv || !hp->head_dim ||
        hp->head_dim % 2 || !hp->n_vocab || !hp->n_ctx_train || !(hp->rms_eps > 0))
        fuzz_fail(H, "bound hyper-parameters that break model.h's invariants");
    check_tensor(f, &m->tok_embd);
    check_tensor(f, &m->output);
    check_tensor(f, &m->output_norm);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const muser_layer *L = &m->layers[l];
        const muser_tensor *all[] = {&L->attn_norm, &L->attn_q, &L->attn_k, &L->attn_v,
                                     &L->attn_gate, &L->attn_q_norm, &L->attn_k_norm,
                                     &L->attn_output, &L->post_attention_norm, &L->ffn_norm,
                                     &L->ffn_gate, &L->ffn_up, &L->ffn_down, &L->post_ffw_norm};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            check_tensor(f, all[i]);
    }
    run_forward(m, head);
    muser_model_free(m);
    return 0;
}
