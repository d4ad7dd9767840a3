/* test_model_fuzz.c — regressions found by fuzz/fuzz_model.c, each as the smallest model that
 * reproduces it, written here with the GGUF writer:
 *   - muse.attention.sliding_window = 2^32-1 (context_length 16) used to bind, and every session
 *     then sized an SWA ring of 2^32-1 rows per layer (kv_init asked for 16 GiB, zero-filled):
 *     a window wider than the context must be refused naming the key, while window == context
 *     still binds and runs a 1-token oracle forward. */
#include "check.h"
#include "model.h"
#include "quant.h"
#include "session.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Micro muse model: 1 layer, E 8, H 2, HKV 1, D 4, F 16, V 8, every matrix F32 of small
 * values. */
enum { E = 8, NH = 2, NKV = 1, D = 4, F = 16, V = 8, CTX = 16 };

static int write_micro(const char *path, uint32_t window, muser_error *err)
{
    gguf_writer *w = gguf_writer_new(0);
    gguf_writer_set_str(w, "general.architecture", "muse");
    gguf_writer_set_u32(w, "muse.block_count", 1);
    gguf_writer_set_u32(w, "muse.context_length", CTX);
    gguf_writer_set_u32(w, "muse.embedding_length", E);
    gguf_writer_set_u32(w, "muse.feed_forward_length", F);
    gguf_writer_set_u32(w, "muse.attention.head_count", NH);
    gguf_writer_set_u32(w, "muse.attention.head_count_kv", NKV);
    gguf_writer_set_u32(w, "muse.attention.key_length", D);
    gguf_writer_set_u32(w, "muse.vocab_size", V);
    gguf_writer_set_f32(w, "muse.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "muse.rope.freq_base", 10000.0f);
    gguf_writer_set_u32(w, "muse.attention.sliding_window", window);
    gguf_writer_set_u32(w, "muse.attention.sliding_window_pattern", 2);
    static const struct { const char *name; uint64_t ne0, ne1; } t[] = {
        {"token_embd.weight", E, V},       {"output_norm.weight", E, 1},
        {"output.weight", E, V},           {"blk.0.attn_norm.weight", E, 1},
        {"blk.0.attn_q.weight", E, NH * D}, {"blk.0.attn_k.weight", E, NKV * D},
        {"blk.0.attn_v.weight", E, NKV * D}, {"blk.0.attn_gate.weight", E, NH * D},
        {"blk.0.attn_q_norm.weight", D, 1}, {"blk.0.attn_k_norm.weight", D, 1},
        {"blk.0.attn_output.weight", NH * D, E}, {"blk.0.post_attention_norm.weight", E, 1},
        {"blk.0.ffn_norm.weight", E, 1},    {"blk.0.ffn_gate.weight", E, F},
        {"blk.0.ffn_up.weight", E, F},      {"blk.0.ffn_down.weight", F, E},
        {"blk.0.post_ffw_norm.weight", E, 1},
    };
    const size_t n = sizeof t / sizeof t[0];
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t ne[2] = {t[i].ne0, t[i].ne1};
        rc = gguf_writer_add_tensor(w, t[i].name, GGML_TYPE_F32, t[i].ne1 == 1 ? 1 : 2, ne, err);
    }
    if (!rc)
        rc = gguf_writer_begin(w, path, err);
    float vals[E * F];
    for (size_t i = 0; i < E * F; i++)
        vals[i] = (float)((int)(i * 37 % 19) - 9) / 16.0f;
    for (size_t i = 0; i < n && !rc; i++)
        rc = gguf_writer_tensor_data(w, vals, t[i].ne0 * t[i].ne1 * sizeof(float), err);
    if (!rc)
        rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    return rc;
}

int main(void)
{
    int fd = memfd_create("test_model_fuzz", MFD_CLOEXEC);
    CHECK(fd >= 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    muser_error err = {0};
    muser_model *m = NULL;

    /* the fuzzer's input: a window of 2^32-1 over a 16-token context */
    CHECK_OK(write_micro(path, UINT32_MAX, &err), &err);
    int rc = muser_model_load(&m, path, &err);
    CHECKF(rc == MUSER_E_FORMAT && m == NULL, "window 2^32-1 bound (rc %d)", rc);
    CHECKF(strstr(err.msg, "muse.attention.sliding_window") && strstr(err.msg, path),
           "message names the key and the file: %s", err.msg);
    muser_model_free(m);
    m = NULL;
    CHECK_OK(write_micro(path, CTX + 1, &err), &err);
    CHECK(muser_model_load(&m, path, &err) == MUSER_E_FORMAT && m == NULL);

    /* the edge that stays valid: window == context, and it runs */
    CHECK_OK(write_micro(path, CTX, &err), &err);
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    if (m) {
        CHECK(m->hp.swa_window == CTX);
        muser_session_opts o = {.backend = MUSER_BACKEND_ORACLE, .n_threads = 1, .n_ctx = 4};
        muser_session *s = NULL;
        CHECK_OK(muser_session_new(&s, m, &o, &err), &err);
        float logits[V];
        int32_t tok = 3;
        if (s)
            CHECK_OK(muser_session_forward(s, &tok, 1, logits, false, &err), &err);
        muser_session_free(s);
        muser_model_free(m);
    }
    close(fd);
    return check_report("model_fuzz");
}
