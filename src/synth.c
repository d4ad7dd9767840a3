/* synth.c — deterministic random models (tiny / small / glimmer) written as streamed GGUF.
 *
 * Three parts:
 *   presets     the hyper-parameters of each preset (SPEC §1 for glimmer);
 *   vocabulary  a byte-level BPE vocabulary in the GPT-2 convention: 256 byte tokens, merges
 *               learned greedily from a built-in English text, deterministic synthetic merges up
 *               to the vocabulary size, and control tokens at the end;
 *   weights     every tensor's rows drawn from a counter-based generator keyed by
 *               (seed, tensor name, row), so threads fill rows in any order and the bytes never
 *               depend on the thread count. F32/F16/BF16/Q8_0 rows are drawn as floats (and
 *               quantized with quant_quantize_row); Q4_K/Q6_K rows are drawn directly as random
 *               valid blocks whose dequantized std matches the target (fast enough for the
 *               16.7 GB glimmer preset, and independent of the quantizer's search).
 * Tensors are generated chunk by chunk by a team of threads while the previous chunk is being
 * written, so memory stays at two chunks however large the model. */
#include "synth.h"

#include "quant.h"
#include "util.h"
#include "vocab.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- presets ---- */

typedef struct synth_preset {
    const char *name;
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    uint32_t swa_window, swa_pattern;
    float rope_theta, rms_eps, post_norm_eps, logit_scale, final_softcap;
} synth_preset;

/* tiny: 8 layers (FULL at 3 and 7), a 16-row window that wraps within a short prompt, and a
 * soft cap that bends the tails of the random logits (scale 0.35 -> std ~0.35, cap 2). Not a
 * larger scale: with f16 KV any f32 noise moves the odd K/V element to the neighbouring half,
 * and at scale 1.5 one such move was measured to shift log_softmax by 1.4e-3 on its own, more than
 * the whole SPEC §4 budget; 0.35 keeps honest f32 engines near 5e-4 (Glimmer's own is 0.196).
 * small: a TinyLlama-sized body. glimmer: SPEC §1. */
static const synth_preset presets[] = {
    [MUSER_SYNTH_TINY] = {"tiny", 8, 256, 512, 8, 2, 32, 768, 512, 16, 4, 10000.0f, 1e-5f, 1e-8f,
                          0.35f, 2.0f},
    [MUSER_SYNTH_SMALL] = {"small", 22, 2048, 5632, 32, 4, 64, 32000, 4096, 512, 4, 10000.0f,
                           1e-5f, 1e-8f, 0.353553f, 20.0f},
    [MUSER_SYNTH_GLIMMER] = {"glimmer", 52, 6656, 19968, 32, 2, 128, 202048, 131072, 2048, 4,
                             500000.0f, 1e-5f, 1e-8f, 0.196116f, 20.0f},
};
#define N_PRESETS (sizeof presets / sizeof presets[0])

void muser_synth_opts_default(muser_synth_opts *o)
{
    memset(o, 0, sizeof *o);
    o->arch = MUSER_ARCH_MUSE;
    o->preset = MUSER_SYNTH_TINY;
    o->seed = 1;
    o->type = MUSER_SYNTH_TYPE_MIX;
}

int muser_synth_preset_from_name(const char *name)
{
    for (size_t i = 0; name && i < N_PRESETS; i++)
        if (!strcmp(name, presets[i].name))
            return (int)i;
    return -1;
}

const char *muser_synth_preset_name(muser_synth_preset p)
{
    return (unsigned)p < N_PRESETS ? presets[p].name : "unknown";
}

static int check_opts(const muser_synth_opts *o, muser_error *err)
{
    if (!o)
        return muser_errorf(err, MUSER_E_ARG, "synth: NULL options");
    if ((unsigned)o->preset >= N_PRESETS)
        return muser_errorf(err, MUSER_E_ARG, "synth: unknown preset %d", (int)o->preset);
    if (o->arch != MUSER_ARCH_MUSE && o->arch != MUSER_ARCH_LLAMA && o->arch != MUSER_ARCH_QWEN3)
        return muser_errorf(err, MUSER_E_ARG, "synth: arch must be muse, llama or qwen3, not %s",
                            muser_arch_name(o->arch));
    if (o->type != MUSER_SYNTH_TYPE_MIX) {
        const quant_type_info *qi = o->type >= 0 ? quant_info((uint32_t)o->type) : NULL;
        bool ok = o->type == GGML_TYPE_F32 || o->type == GGML_TYPE_F16 ||
                  o->type == GGML_TYPE_BF16 || o->type == GGML_TYPE_Q8_0 ||
                  o->type == GGML_TYPE_Q4_K || o->type == GGML_TYPE_Q6_K;
        if (!qi || !ok)
            return muser_errorf(err, MUSER_E_ARG,
                                "synth: type %d is not one of f32, f16, bf16, q8_0, q4_k, q6_k, mix",
                                o->type);
    }
    return MUSER_OK;
}

int muser_synth_hparams(const muser_synth_opts *o, muser_hparams *hp, muser_error *err)
{
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    const synth_preset *p = &presets[o->preset];
    const bool muse = o->arch == MUSER_ARCH_MUSE;
    memset(hp, 0, sizeof *hp);
    hp->arch = o->arch;
    hp->n_layer = p->n_layer;
    hp->n_embd = p->n_embd;
    hp->n_ff = p->n_ff;
    hp->n_head = p->n_head;
    hp->n_head_kv = p->n_head_kv;
    hp->head_dim = p->head_dim;
    hp->n_vocab = p->n_vocab;
    hp->n_ctx_train = p->n_ctx;
    hp->rms_eps = p->rms_eps;
    hp->post_norm_eps = muse ? p->post_norm_eps : 0.0f;
    hp->swa_window = muse ? p->swa_window : 0;
    hp->swa_pattern = muse ? p->swa_pattern : 0;
    hp->rope_theta = p->rope_theta;
    hp->rope_dim = p->head_dim;
    hp->logit_scale = muse ? p->logit_scale : 1.0f;
    hp->final_softcap = muse ? p->final_softcap : 0.0f;
    muser_hparams_derive(hp);
    return MUSER_OK;
}

/* ------------------------------------------------------------- randomness ---- */

/* SplitMix64: a counter-based generator; every (tensor, row) stream starts from a hash. */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t mix64(uint64_t a, uint64_t b)
{
    uint64_t s = a ^ (b * 0xd1342543de82ef95ull);
    return splitmix64(&s);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Two uniforms in [-1, 1) from one 64-bit draw (24 bits each). */
static inline void uniform2(uint64_t *st, float *a, float *b)
{
    uint64_t x = splitmix64(st);
    *a = (float)((int32_t)(x >> 40) - (1 << 23)) * (1.0f / 8388608.0f);
    *b = (float)((int32_t)((x >> 16) & 0xffffff) - (1 << 23)) * (1.0f / 8388608.0f);
}

static void random_bytes(uint64_t *st, uint8_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = splitmix64(st);
        size_t k = n - i < 8 ? n - i : 8;
        for (size_t j = 0; j < k; j++)
            dst[i + j] = (uint8_t)(x >> (8 * j));
    }
}

/* ------------------------------------------------------------- vocabulary ---- */

/* Built-in English text the merges are learned from (written for this project). */
static const char synth_corpus[] =
    "The lighthouse stood at the end of the long stone pier, and every evening the keeper "
    "climbed the narrow stairs to light the lamp. She had kept the light for thirty years. "
    "In the summer the sea was calm and the boats came home early, their nets heavy with fish; "
    "in the winter the storms came from the north and the waves broke over the pier, so that "
    "the whole tower seemed to shake. She was not afraid of the storms. She was afraid of the "
    "quiet nights, when the fog came in and nothing could be seen at all, not the water, not "
    "the harbour, not even the rail of the gallery under her hands. On those nights she "
    "listened. The sound of an engine, the call of a horn, the voice of a man shouting to "
    "another man: these were the things she listened for, and when she heard them she rang "
    "the bell until her arms were tired.\n\n"
    "People in the town said that the light would soon be run by a machine. A small box with "
    "a battery and a clock would turn the lamp on at sunset and off at dawn, and nobody would "
    "need to climb the stairs again. The keeper did not argue with them. She knew that a "
    "machine could turn a lamp on and off. She also knew that a machine could not listen to "
    "the fog, and that the sea does not care what the people in the town believe.\n\n"
    "One morning in early spring a young man came to the tower with a letter from the harbour "
    "office. He was polite and a little nervous, and he kept looking at the sea as if he "
    "expected it to do something. The letter said that the light would be changed before the "
    "end of the year, and that the keeper would be given a house in the town and a pension for "
    "the rest of her life. She read the letter twice, folded it, and put it in the pocket of "
    "her coat. Then she asked the young man if he would like some tea, because the wind was "
    "cold and the walk along the pier was long.\n\n"
    "They sat in the small kitchen at the bottom of the tower, and she told him about the "
    "ships she had seen and the people she had helped. There was the fishing boat that lost its "
    "engine in the fog and drifted toward the rocks, and the family on the sailing boat who had "
    "never seen the sea so rough, and the old captain who came every year on the same day to "
    "thank her for a night she no longer remembered. The young man listened and drank his tea. "
    "When he left, he said that he would write a report, and that he would put in the report "
    "everything she had told him.\n\n"
    "The machine came in the autumn, as the letter had said. It was smaller than she had "
    "expected, and it worked very well. On the first night she stayed in the tower anyway, "
    "sitting by the window with her coat on, and watched the lamp turn on at sunset without "
    "her. The fog came in after midnight. She listened, and after a while she heard an engine, "
    "very faint, somewhere to the south. She went up the stairs and rang the bell.\n\n"
    "Numbers and notes: 1, 2, 3, 10, 12, 100, 2024, 3.14; the tower is 42 metres tall, the "
    "lamp turns 4 times a minute, and the bell weighs 120 kg. Questions? Answers! (Yes.) "
    "\"Keep the light,\" she said. It's what we do; they're here; we've seen it; I'm sure.\n";

typedef struct vocab {
    uint32_t n, cap;        /* tokens */
    uint8_t **bytes;        /* raw bytes of each token (control tokens: their text) */
    uint32_t *len;
    int32_t *type;          /* 1 normal, 3 control */
    uint32_t n_merges, cap_merges;
    uint32_t (*merges)[2];  /* pair of token ids, in rank order */
    uint32_t *ht;           /* open addressing over raw bytes: token id + 1, 0 = empty */
    uint32_t ht_cap;        /* power of two */
    int32_t bos, eos, eot, pad;
} vocab;

static uint64_t bytes_hash(const uint8_t *b, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int64_t vocab_find(const vocab *v, const uint8_t *b, uint32_t n)
{
    for (uint64_t i = bytes_hash(b, n) & (v->ht_cap - 1);; i = (i + 1) & (v->ht_cap - 1)) {
        uint32_t e = v->ht[i];
        if (!e)
            return -1;
        if (v->len[e - 1] == n && !memcmp(v->bytes[e - 1], b, n))
            return e - 1;
    }
}

static void vocab_free(vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->type);
    free(v->merges);
    free(v->ht);
    memset(v, 0, sizeof *v);
}

static int vocab_init(vocab *v, uint32_t cap)
{
    memset(v, 0, sizeof *v);
    v->cap = cap;
    v->ht_cap = 1;
    while (v->ht_cap < 2 * cap)
        v->ht_cap <<= 1;
    v->bytes = calloc(cap, sizeof *v->bytes);
    v->len = calloc(cap, sizeof *v->len);
    v->type = calloc(cap, sizeof *v->type);
    v->ht = calloc(v->ht_cap, sizeof *v->ht);
    v->cap_merges = cap + 1024; /* learned merges may rebuild an existing token */
    v->merges = calloc(cap, sizeof *v->merges);
    v->bos = v->eos = v->eot = v->pad = -1;
    return v->bytes && v->len && v->type && v->ht && v->merges ? MUSER_OK : MUSER_E_NOMEM;
}

/* Append a token (bytes copied); returns its id, or -1 when out of memory / capacity. */
static int64_t vocab_add(vocab *v, const uint8_t *b, uint32_t n, int32_t type)
{
    if (v->n >= v->cap)
        return -1;
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        return -1;
    memcpy(copy, b, n);
    uint32_t id = v->n++;
    v->bytes[id] = copy;
    v->len[id] = n;
    v->type[id] = type;
    uint64_t i = bytes_hash(b, n) & (v->ht_cap - 1);
    while (v->ht[i])
        i = (i + 1) & (v->ht_cap - 1);
    v->ht[i] = id + 1;
    return id;
}

/* Merge a+b: record the merge and return the id of the concatenation (new or existing). */
static int64_t vocab_merge(vocab *v, uint32_t a, uint32_t b)
{
    uint32_t n = v->len[a] + v->len[b];
    uint8_t buf[256];
    if (n > sizeof buf || v->n_merges >= v->cap_merges)
        return -1;
    memcpy(buf, v->bytes[a], v->len[a]);
    memcpy(buf + v->len[a], v->bytes[b], v->len[b]);
    int64_t id = vocab_find(v, buf, n);
    if (id < 0 && (id = vocab_add(v, buf, n, 1)) < 0)
        return -1;
    v->merges[v->n_merges][0] = a;
    v->merges[v->n_merges][1] = b;
    v->n_merges++;
    return id;
}

/* GPT-2 pre-tokenizer, ASCII approximation: contractions, ' ?letters', ' ?digits',
 * ' ?other', whitespace runs. Returns the length of the piece starting at s[0]. */
static size_t pretoken_len(const char *s, size_t n)
{
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (size_t c = 0; c < sizeof contractions / sizeof contractions[0]; c++) {
        size_t k = strlen(contractions[c]);
        if (k <= n && !memcmp(s, contractions[c], k))
            return k;
    }
#define IS_ALPHA(ch) (((ch) | 32) >= 'a' && ((ch) | 32) <= 'z')
#define IS_DIGIT(ch) ((ch) >= '0' && (ch) <= '9')
#define IS_SPACE(ch) ((ch) == ' ' || (ch) == '\n' || (ch) == '\t' || (ch) == '\r')
    size_t i = 0;
    if (s[0] == ' ' && n > 1 && !IS_SPACE(s[1]))
        i = 1;
    char c = s[i];
    if (IS_ALPHA(c)) {
        while (i < n && IS_ALPHA(s[i]))
            i++;
    } else if (IS_DIGIT(c)) {
        while (i < n && IS_DIGIT(s[i]))
            i++;
    } else if (!IS_SPACE(c)) {
        while (i < n && !IS_ALPHA(s[i]) && !IS_DIGIT(s[i]) && !IS_SPACE(s[i]))
            i++;
    } else {
        while (i < n && IS_SPACE(s[i]))
            i++;
    }
    return i;
#undef IS_ALPHA
#undef IS_DIGIT
#undef IS_SPACE
}

/* Learn up to max_new tokens by greedy BPE over the corpus words: each step merges the most
 * frequent adjacent pair (ties: smallest ids first), stopping when no pair occurs twice. */
static int learn_merges(vocab *v, uint32_t max_new)
{
    const size_t n = sizeof synth_corpus - 1;
    /* Words as token-id sequences, each with its frequency (duplicates kept: the corpus is
     * small, so counting per occurrence is simpler than deduplicating). */
    uint32_t *sym = malloc(n * sizeof *sym);   /* all words' symbols, back to back */
    uint32_t *wstart = malloc((n + 1) * sizeof *wstart);
    uint32_t *wlen = malloc(n * sizeof *wlen);
    const uint32_t pc_cap = 1u << 15;
    uint64_t *pkey = malloc(pc_cap * sizeof *pkey);
    uint32_t *pcnt = malloc(pc_cap * sizeof *pcnt);
    int rc = MUSER_OK;
    if (!sym || !wstart || !wlen || !pkey || !pcnt) {
        rc = MUSER_E_NOMEM;
        goto done;
    }
    uint32_t nw = 0, ns = 0;
    for (size_t i = 0; i < n;) {
        size_t k = pretoken_len(synth_corpus + i, n - i);
        wstart[nw] = ns;
        wlen[nw] = (uint32_t)k;
        for (size_t j = 0; j < k; j++)
            sym[ns++] = (uint8_t)synth_corpus[i + j];
        nw++;
        i += k;
    }
    for (uint32_t added = 0; added < max_new;) {
        memset(pkey, 0xff, pc_cap * sizeof *pkey);
        memset(pcnt, 0, pc_cap * sizeof *pcnt);
        uint64_t best = UINT64_MAX;
        uint32_t best_cnt = 0;
        for (uint32_t w = 0; w < nw; w++)
            for (uint32_t j = 0; j + 1 < wlen[w]; j++) {
                uint64_t key = (uint64_t)sym[wstart[w] + j] << 32 | sym[wstart[w] + j + 1];
                uint64_t h = mix64(key, 1) & (pc_cap - 1);
                while (pkey[h] != UINT64_MAX && pkey[h] != key)
                    h = (h + 1) & (pc_cap - 1);
                pkey[h] = key;
                uint32_t c = ++pcnt[h];
                if (c > best_cnt || (c == best_cnt && key < best)) {
                    best_cnt = c;
                    best = key;
                }
            }
        if (best_cnt < 2)
            break;
        uint32_t a = (uint32_t)(best >> 32), b = (uint32_t)best;
        uint32_t before = v->n;
        int64_t id = vocab_merge(v, a, b);
        if (id < 0) {
            rc = MUSER_E_NOMEM;
            goto done;
        }
        added += v->n - before;
        /* Apply the merge to every word, left to right. */
        for (uint32_t w = 0; w < nw; w++) {
            uint32_t *s = sym + wstart[w], out = 0;
            for (uint32_t j = 0; j < wlen[w]; j++) {
                if (j + 1 < wlen[w] && s[j] == a && s[j + 1] == b) {
                    s[out++] = (uint32_t)id;
                    j++;
                } else {
                    s[out++] = s[j];
                }
            }
            wlen[w] = out;
        }
    }
done:
    free(sym);
    free(wstart);
    free(wlen);
    free(pkey);
    free(pcnt);
    return rc;
}

/* A word piece: ASCII letters, optionally after one leading space (what the GPT-2
 * pre-tokenizer's ' ?\p{L}+' produces). */
static bool is_word_piece(const uint8_t *b, uint32_t n)
{
    uint32_t i = n > 0 && b[0] == ' ' ? 1 : 0;
    if (i == n)
        return false;
    for (; i < n; i++)
        if (!(((b[i] | 32) >= 'a') && ((b[i] | 32) <= 'z')))
            return false;
    return true;
}

/* Synthetic merges until the vocabulary holds `target` tokens: a random word piece of at most
 * 8 bytes followed by a random lowercase piece of 1-2 letters, so every synthetic token is a
 * plausible word (a bounded, pre-tokenizer-reachable string) and lengths stay <= 10 bytes. */
static int synthetic_merges(vocab *v, uint32_t target)
{
    uint64_t st = 0x5eed5eed5eedull; /* fixed: the vocabulary does not depend on --seed */
    uint32_t *tails = malloc(v->n * sizeof *tails), n_tails = 0;
    if (!tails)
        return MUSER_E_NOMEM;
    for (uint32_t t = 0; t < v->n; t++)
        if (v->type[t] == 1 && v->len[t] <= 2 && is_word_piece(v->bytes[t], v->len[t]) &&
            v->bytes[t][0] >= 'a' && v->bytes[t][v->len[t] - 1] >= 'a')
            tails[n_tails++] = t;
    uint64_t tries = 0;
    int rc = MUSER_OK;
    while (v->n < target && !rc) {
        if (++tries > 1000ull * target) {
            rc = MUSER_E_FORMAT; /* cannot happen for the presets: ~26^10 candidates */
            break;
        }
        uint32_t a = (uint32_t)(splitmix64(&st) % v->n);
        uint32_t b = tails[splitmix64(&st) % n_tails];
        if (v->type[a] != 1 || v->len[a] > 8 || !is_word_piece(v->bytes[a], v->len[a]))
            continue;
        uint8_t buf[16];
        memcpy(buf, v->bytes[a], v->len[a]);
        memcpy(buf + v->len[a], v->bytes[b], v->len[b]);
        if (vocab_find(v, buf, v->len[a] + v->len[b]) >= 0)
            continue;
        if (vocab_merge(v, a, b) < 0)
            rc = MUSER_E_NOMEM;
    }
    free(tails);
    return rc;
}

/* Control tokens (token_type 3), at the end of the vocabulary: BOS, EOS, and the turn markers
 * of the built-in "muse" chat template (tools/chat_template.c: <|role|>\ntext<|end|>\n). */
static const char *const control_tokens[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|end|>", "<|system|>",
    "<|user|>",          "<|assistant|>",   "<|pad|>", "<|reserved_0|>",
};
enum { CONTROL_BOS = 0, CONTROL_EOS = 1, CONTROL_EOT = 2, CONTROL_PAD = 6 };
#define N_CONTROL (sizeof control_tokens / sizeof control_tokens[0])

static int build_vocab(vocab *v, uint32_t n_vocab, muser_error *err)
{
    if (n_vocab < 256 + N_CONTROL)
        return muser_errorf(err, MUSER_E_ARG, "synth: vocabulary of %u is too small", n_vocab);
    if (vocab_init(v, n_vocab))
        return muser_errorf(err, MUSER_E_NOMEM, "synth: out of memory for the vocabulary");
    for (uint32_t b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        vocab_add(v, &byte, 1, 1);
    }
    const uint32_t n_normal = n_vocab - (uint32_t)N_CONTROL;
    int rc = learn_merges(v, n_normal - v->n);
    if (!rc)
        rc = synthetic_merges(v, n_normal);
    if (rc) {
        vocab_free(v);
        return muser_errorf(err, rc, "synth: building the vocabulary failed");
    }
    for (size_t i = 0; i < N_CONTROL; i++) {
        const char *s = control_tokens[i];
        /* Control texts are printable ASCII, which the byte mapping leaves unchanged, so a
         * raw-byte lookup finds any normal token that would print the same. */
        if (vocab_find(v, (const uint8_t *)s, (uint32_t)strlen(s)) >= 0) {
            vocab_free(v);
            return muser_errorf(err, MUSER_E_FORMAT, "synth: control token %s collides", s);
        }
        vocab_add(v, (const uint8_t *)s, (uint32_t)strlen(s), 3);
    }
    v->bos = (int32_t)n_normal + CONTROL_BOS;
    v->eos = (int32_t)n_normal + CONTROL_EOS;
    v->eot = (int32_t)n_normal + CONTROL_EOT;
    v->pad = (int32_t)n_normal + CONTROL_PAD;
    return MUSER_OK;
}

/* GPT-2 byte-to-unicode: printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
 * themselves; the other 68 bytes map, in byte order, to U+0100, U+0101, ... (space -> U+0120). */
static uint32_t byte_to_codepoint(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
        return b;
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae))
            n++;
    return 0x100 + n;
}

/* Token text in the byte-level alphabet (UTF-8); dst needs 2*n+1 bytes. */
static uint32_t token_text(const uint8_t map[256][2], const uint8_t mlen[256], const uint8_t *b,
                           uint32_t n, char *dst)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < mlen[b[i]]; j++)
            dst[k++] = (char)map[b[i]][j];
    dst[k] = 0;
    return k;
}

/* Write the tokenizer.* metadata of v. */
static int write_vocab_kv(gguf_writer *w, const vocab *v, const char *pre, muser_error *err)
{
    uint8_t map[256][2], mlen[256];
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t cp = byte_to_codepoint((uint8_t)b);
        if (cp < 0x80) {
            map[b][0] = (uint8_t)cp;
            mlen[b] = 1;
        } else { /* all code points here are < 0x800: two UTF-8 bytes */
            map[b][0] = (uint8_t)(0xc0 | (cp >> 6));
            map[b][1] = (uint8_t)(0x80 | (cp & 0x3f));
            mlen[b] = 2;
        }
    }
    uint64_t text_bytes = 0;
    for (uint32_t i = 0; i < v->n; i++)
        text_bytes += 2ull * v->len[i] + 1;
    for (uint32_t i = 0; i < v->n_merges; i++)
        text_bytes += 2ull * (v->len[v->merges[i][0]] + v->len[v->merges[i][1]]) + 2;
    char *pool = malloc(text_bytes);
    const char **strs = malloc((size_t)(v->n > v->n_merges ? v->n : v->n_merges) * sizeof *strs);
    uint64_t *lens = malloc((size_t)(v->n > v->n_merges ? v->n : v->n_merges) * sizeof *lens);
    int rc = MUSER_OK;
    if (!pool || !strs || !lens) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "synth: out of memory for tokenizer metadata");
        goto done;
    }
    char *p = pool;
    for (uint32_t i = 0; i < v->n; i++) {
        strs[i] = p;
        if (v->type[i] == 3) { /* control tokens are stored as their literal text */
            memcpy(p, v->bytes[i], v->len[i]);
            p[v->len[i]] = 0;
            lens[i] = v->len[i];
        } else {
            lens[i] = token_text(map, mlen, v->bytes[i], v->len[i], p);
        }
        p += lens[i] + 1;
    }
    if ((rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre)) ||
        (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, lens, v->n)) ||
        (rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->type,
                                  v->n)))
        goto fail;
    p = pool;
    for (uint32_t i = 0; i < v->n_merges; i++) {
        const uint32_t a = v->merges[i][0], b = v->merges[i][1];
        strs[i] = p;
        uint32_t k = token_text(map, mlen, v->bytes[a], v->len[a], p);
        p[k++] = ' ';
        k += token_text(map, mlen, v->bytes[b], v->len[b], p + k);
        lens[i] = k;
        p += k + 1;
    }
    if ((rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", strs, lens, v->n_merges)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->eot)) ||
        (rc = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad)) ||
        (rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
        (rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)) ||
        (rc = gguf_writer_set_str(
             w, "tokenizer.chat_template",
             "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
             "{{ message['content'] }}<|end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>\n"
             "{% endif %}")))
        goto fail;
    goto done;
fail:
    rc = muser_errorf(err, rc, "synth: writing tokenizer metadata failed");
done:
    free(pool);
    free(strs);
    free(lens);
    return rc;
}

/* ---------------------------------------------------------------- tensors ---- */

typedef struct synth_tensor {
    char name[64];
    uint32_t type;
    uint64_t ne0, ne1;      /* ne1 = 1 for vectors */
    bool is_norm;           /* 1 + small noise, f32 */
    float std;              /* target std of matrix weights: 1/sqrt(ne0) */
    uint64_t seed;          /* hash of (--seed, name) */
    uint64_t row_bytes;
    uint16_t d16, dmin16;   /* K-quant super-block scales (direct block generation) */
} synth_tensor;

/* Norm weights: 1 + uniform noise of this half-width. */
#define NORM_NOISE 0.1f
/* K-quant direct generation: 6-bit sub-block scales drawn in [32, 63] (Q4_K) and int8 scales
 * of magnitude [16, 47] with random sign (Q6_K); means of their squares, for the std. */
#define Q4K_SC_LO 32u
#define Q6K_SC_LO 16u
#define Q4K_SC_MEAN_SQ 2341.5   /* mean of s^2, s = 32..63 */
#define Q6K_SC_MEAN_SQ 1077.5   /* mean of s^2, s = 16..47 */
#define Q4K_Q_VAR 21.25         /* variance of uniform 0..15 */
#define Q6K_Q_VAR 330.6666667   /* variance of uniform -31..31 */
#define Q4K_DMIN_RATIO 8.0f     /* dmin = 8 d, so m = 7.5 sc / 8 fits in 6 bits */

static void tensor_init(synth_tensor *t, const char *name, uint32_t type, uint64_t ne0,
                        uint64_t ne1, bool is_norm, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->is_norm = is_norm;
    t->std = (float)(1.0 / sqrt((double)ne0));
    t->seed = mix64(seed, fnv1a64(name));
    t->row_bytes = quant_row_bytes(type, ne0);
    if (type == GGML_TYPE_Q4_K) {
        float d = (float)(t->std / sqrt(Q4K_SC_MEAN_SQ * Q4K_Q_VAR));
        t->d16 = muser_f32_to_f16(d);
        t->dmin16 = muser_f32_to_f16(muser_f16_to_f32(t->d16) * Q4K_DMIN_RATIO);
    } else if (type == GGML_TYPE_Q6_K) {
        t->d16 = muser_f32_to_f16((float)(t->std / sqrt(Q6K_SC_MEAN_SQ * Q6K_Q_VAR)));
    }
}

/* One random Q4_K block: 4-bit quants uniform in 0..15, sub-block scales sc in [32, 63] and
 * mins m = round(7.5 sc d / dmin), so every sub-block dequantizes to mean ~0. */
static void gen_q4k_block(const synth_tensor *t, uint64_t *st, uint8_t *blk)
{
    const float d = muser_f16_to_f32(t->d16), dmin = muser_f16_to_f32(t->dmin16);
    uint8_t sc[8], m[8];
    uint64_t x = splitmix64(st);
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(Q4K_SC_LO + ((x >> (5 * j)) & 31));
        long mm = lrintf(7.5f * (float)sc[j] * d / dmin);
        m[j] = (uint8_t)(mm < 0 ? 0 : mm > 63 ? 63 : mm);
    }
    memcpy(blk, &t->d16, 2);
    memcpy(blk + 2, &t->dmin16, 2);
    uint8_t *s = blk + 4; /* ggml's 12-byte 6-bit packing of (sc, m) */
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    random_bytes(st, blk + 16, 128);
}

/* One random Q6_K block: 6-bit quants uniform in 1..63 (q-32 symmetric in -31..31), int8
 * scales of magnitude 16..47 with random sign. */
static void gen_q6k_block(const synth_tensor *t, uint64_t *st, uint8_t *blk)
{
    uint8_t *ql = blk, *qh = blk + 128;
    int8_t *scales = (int8_t *)(blk + 192);
    random_bytes(st, ql, 128);
    random_bytes(st, qh, 64);
    /* q = 0 would be -32, outside the symmetric range: redraw its low bits to 1..15. The
     * element of ql byte l (low nibble) pairs with qh byte (l % 32) + 32*(l/64), bits
     * 2*((l % 64)/32); high nibble with bits 2*((l%64)/32)+4. */
    for (int l = 0; l < 128; l++) {
        const int h = (l % 32) + 32 * (l / 64), sh = 2 * ((l % 64) / 32);
        if ((ql[l] & 15) == 0 && ((qh[h] >> sh) & 3) == 0)
            ql[l] |= (uint8_t)(1 + (splitmix64(st) % 15));
        if ((ql[l] >> 4) == 0 && ((qh[h] >> (sh + 4)) & 3) == 0)
            ql[l] |= (uint8_t)((1 + (splitmix64(st) % 15)) << 4);
    }
    const uint64_t x = splitmix64(st), y = splitmix64(st); /* x: 4 bits, y: 2 bits a scale */
    for (int j = 0; j < 16; j++) {
        int mag = (int)Q6K_SC_LO + (int)((x >> (4 * j)) & 15) * 2 + (int)((y >> j) & 1);
        scales[j] = (int8_t)((y >> (j + 16)) & 1 ? -mag : mag);
    }
    memcpy(blk + 208, &t->d16, 2);
}

/* Fill rows [r0, r1) of t into dst (row_bytes each). scratch holds ne0 floats. */
static int gen_rows(const synth_tensor *t, uint64_t r0, uint64_t r1, uint8_t *dst, float *scratch)
{
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t st = mix64(t->seed, r + 1);
        uint8_t *out = dst + (r - r0) * t->row_bytes;
        if (t->type == GGML_TYPE_Q4_K || t->type == GGML_TYPE_Q6_K) {
            for (uint64_t b = 0; b < t->ne0 / QK_K; b++) {
                if (t->type == GGML_TYPE_Q4_K)
                    gen_q4k_block(t, &st, out + b * Q4_K_BLOCK_BYTES);
                else
                    gen_q6k_block(t, &st, out + b * Q6_K_BLOCK_BYTES);
            }
            continue;
        }
        const float amp = t->is_norm ? NORM_NOISE : t->std * 1.7320508f; /* uniform: std a/sqrt3 */
        const float base = t->is_norm ? 1.0f : 0.0f;
        float *f = t->type == GGML_TYPE_F32 ? (float *)(void *)out : scratch;
        for (uint64_t i = 0; i < t->ne0; i += 2) {
            float a, b;
            uniform2(&st, &a, &b);
            f[i] = base + amp * a;
            if (i + 1 < t->ne0)
                f[i + 1] = base + amp * b;
        }
        if (t->type == GGML_TYPE_F32)
            continue;
        if (t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16) {
            uint16_t *h = (uint16_t *)(void *)out;
            for (uint64_t i = 0; i < t->ne0; i++)
                h[i] = t->type == GGML_TYPE_F16 ? muser_f32_to_f16(f[i]) : muser_f32_to_bf16(f[i]);
            continue;
        }
        int rc = quant_quantize_row(t->type, f, out, t->ne0);
        if (rc)
            return rc;
    }
    return MUSER_OK;
}

/* The tensor list of the model, in file order. */
static int build_tensors(const muser_synth_opts *o, const muser_hparams *hp, synth_tensor **out,
                         size_t *n_out, muser_error *err)
{
    const size_t per_layer = 14;
    size_t cap = 3 + per_layer * hp->n_layer, n = 0;
    synth_tensor *ts = calloc(cap, sizeof *ts);
    if (!ts)
        return muser_errorf(err, MUSER_E_NOMEM, "synth: out of memory for the tensor list");
    const uint64_t E = hp->n_embd, F = hp->n_ff, D = hp->head_dim, V = hp->n_vocab;
    const uint64_t QD = (uint64_t)hp->n_head * D, KVD = (uint64_t)hp->n_head_kv * D;
    char name[64];
#define MATRIX(nm, ne0, ne1)                                                                   \
    do {                                                                                       \
        uint32_t ty = o->type == MUSER_SYNTH_TYPE_MIX                                          \
                          ? quant_mix_type(nm, hp->n_layer, GGML_TYPE_Q4_K)                    \
                          : (uint32_t)o->type;                                                 \
        tensor_init(&ts[n++], nm, quant_fallback_type(ty, ne0), ne0, ne1, false, o->seed);     \
    } while (0)
#define NORM(nm, ne0) tensor_init(&ts[n++], nm, GGML_TYPE_F32, ne0, 1, true, o->seed)
    MATRIX("token_embd.weight", E, V);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
#define LNAME(suffix) (snprintf(name, sizeof name, "blk.%u.%s.weight", l, suffix), name)
        NORM(LNAME("attn_norm"), E);
        MATRIX(LNAME("attn_q"), E, QD);
        MATRIX(LNAME("attn_k"), E, KVD);
        MATRIX(LNAME("attn_v"), E, KVD);
        if (hp->attn_gate)
            MATRIX(LNAME("attn_gate"), E, QD);
        if (hp->qk_norm) {
            NORM(LNAME("attn_q_norm"), D);
            NORM(LNAME("attn_k_norm"), D);
        }
        MATRIX(LNAME("attn_output"), QD, E);
        if (hp->sandwich)
            NORM(LNAME("post_attention_norm"), E);
        NORM(LNAME("ffn_norm"), E);
        MATRIX(LNAME("ffn_gate"), E, F);
        MATRIX(LNAME("ffn_up"), E, F);
        MATRIX(LNAME("ffn_down"), F, E);
        if (hp->sandwich)
            NORM(LNAME("post_ffw_norm"), E);
#undef LNAME
    }
    NORM("output_norm.weight", E);
    MATRIX("output.weight", E, V);
#undef MATRIX
#undef NORM
    for (size_t i = 0; i < n; i++)
        if (ts[i].row_bytes == 0) {
            int rc = muser_errorf(err, MUSER_E_ARG, "synth: %s: type %u cannot hold rows of %llu",
                                  ts[i].name, ts[i].type, (unsigned long long)ts[i].ne0);
            free(ts);
            return rc;
        }
    *out = ts;
    *n_out = n;
    return MUSER_OK;
}

/* ------------------------------------------------------------ generation ---- */

#define CHUNK_BYTES (32u << 20)
#define INLINE_BYTES (64u << 10) /* chunks smaller than this are not worth a thread */

typedef struct gen_job {
    const synth_tensor *t;
    uint64_t r0, r1;   /* rows of the tensor */
    uint8_t *dst;      /* row r0's bytes */
    float *scratch;    /* ne0 floats */
    int rc;
} gen_job;

static void *gen_job_run(void *arg)
{
    gen_job *j = arg;
    j->rc = gen_rows(j->t, j->r0, j->r1, j->dst, j->scratch);
    return NULL;
}

typedef struct synth_gen {
    uint32_t n_threads;
    gen_job *jobs;
    pthread_t *tids;
    float **scratch;   /* [n_threads], max ne0 floats each */
    uint8_t *buf[2];
} synth_gen;

static void synth_gen_free(synth_gen *g)
{
    for (uint32_t i = 0; g->scratch && i < g->n_threads; i++)
        free(g->scratch[i]);
    free(g->scratch);
    free(g->jobs);
    free(g->tids);
    muser_free_aligned(g->buf[0]);
    muser_free_aligned(g->buf[1]);
}

/* Start threads filling rows [r0, r1) of t into dst; small chunks run inline. Returns how
 * many threads were started (0 = done inline; the result is in jobs[0].rc). */
static uint32_t gen_start(synth_gen *g, const synth_tensor *t, uint64_t r0, uint64_t r1,
                          uint8_t *dst)
{
    uint64_t rows = r1 - r0;
    uint32_t nt = g->n_threads;
    if ((uint64_t)nt > rows)
        nt = (uint32_t)rows;
    if (rows * t->row_bytes < INLINE_BYTES || nt <= 1) {
        g->jobs[0] = (gen_job){t, r0, r1, dst, g->scratch[0], 0};
        gen_job_run(&g->jobs[0]);
        return 0;
    }
    for (uint32_t i = 0; i < nt; i++) {
        uint64_t a = r0 + rows * i / nt, b = r0 + rows * (i + 1) / nt;
        g->jobs[i] = (gen_job){t, a, b, dst + (a - r0) * t->row_bytes, g->scratch[i], 0};
        if (pthread_create(&g->tids[i], NULL, gen_job_run, &g->jobs[i]) != 0) {
            gen_job_run(&g->jobs[i]); /* no thread to be had: run this share here */
            g->tids[i] = pthread_self();
        }
    }
    return nt;
}

static int gen_join(synth_gen *g, uint32_t started)
{
    int rc = started ? MUSER_OK : g->jobs[0].rc;
    for (uint32_t i = 0; i < started; i++) {
        if (!pthread_equal(g->tids[i], pthread_self()))
            pthread_join(g->tids[i], NULL);
        if (g->jobs[i].rc && !rc)
            rc = g->jobs[i].rc;
    }
    return rc;
}

static uint32_t online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (uint32_t)n;
}

/* Stream every tensor's bytes to w: chunk k+1 is generated while chunk k is written. */
static int write_tensor_data(gguf_writer *w, const synth_tensor *ts, size_t n_ts,
                             const muser_synth_opts *o, muser_error *err)
{
    synth_gen g = {0};
    g.n_threads = o->n_threads ? o->n_threads : online_cpus();
    uint64_t max_ne0 = 0, max_row = 0, total = 0;
    for (size_t i = 0; i < n_ts; i++) {
        max_ne0 = ts[i].ne0 > max_ne0 ? ts[i].ne0 : max_ne0;
        max_row = ts[i].row_bytes > max_row ? ts[i].row_bytes : max_row;
        total += ts[i].row_bytes * ts[i].ne1;
    }
    const uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : CHUNK_BYTES;
    const uint64_t buf_bytes = max_row > chunk ? max_row : chunk;
    g.jobs = calloc(g.n_threads, sizeof *g.jobs);
    g.tids = calloc(g.n_threads, sizeof *g.tids);
    g.scratch = calloc(g.n_threads, sizeof *g.scratch);
    g.buf[0] = muser_alloc_aligned(buf_bytes);
    g.buf[1] = muser_alloc_aligned(buf_bytes);
    int rc = MUSER_OK;
    if (!g.jobs || !g.tids || !g.scratch || !g.buf[0] || !g.buf[1])
        rc = MUSER_E_NOMEM;
    for (uint32_t i = 0; !rc && i < g.n_threads; i++)
        if (!(g.scratch[i] = malloc(max_ne0 * sizeof(float))))
            rc = MUSER_E_NOMEM;
    if (rc) {
        synth_gen_free(&g);
        return muser_errorf(err, rc, "synth: out of memory for generation buffers");
    }

    muser_progress prog;
    if (o->progress)
        muser_progress_begin(&prog, "synth", total);
    uint64_t written = 0, pending_bytes = 0;
    int cur = 0;
    for (size_t i = 0; i < n_ts && !rc; i++) {
        const synth_tensor *t = &ts[i];
        const uint64_t chunk_rows = buf_bytes / t->row_bytes;
        for (uint64_t r = 0; r < t->ne1 && !rc; r += chunk_rows) {
            uint64_t r1 = r + chunk_rows < t->ne1 ? r + chunk_rows : t->ne1;
            uint32_t started = gen_start(&g, t, r, r1, g.buf[cur]);
            if (pending_bytes) /* write the previous chunk while this one is generated */
                rc = gguf_writer_tensor_data(w, g.buf[cur ^ 1], pending_bytes, err);
            int grc = gen_join(&g, started);
            if (rc)
                break;
            if (grc) {
                rc = muser_errorf(err, grc, "synth: %s: generating rows %llu..%llu failed",
                                  t->name, (unsigned long long)r, (unsigned long long)r1);
                break;
            }
            written += pending_bytes;
            if (o->progress)
                muser_progress_update(&prog, written);
            pending_bytes = (r1 - r) * t->row_bytes;
            cur ^= 1;
        }
    }
    if (!rc && pending_bytes)
        rc = gguf_writer_tensor_data(w, g.buf[cur ^ 1], pending_bytes, err);
    if (o->progress && !rc)
        muser_progress_finish(&prog);
    synth_gen_free(&g);
    return rc;
}

/* ---------------------------------------------------------------- writing ---- */

static int write_hparams_kv(gguf_writer *w, const muser_synth_opts *o, const muser_hparams *hp)
{
    const char *a = muser_arch_name(hp->arch);
    char key[96], desc[160];
    int rc;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    snprintf(desc, sizeof desc, "muser synth: preset %s, arch %s, seed %llu, type %s",
             presets[o->preset].name, a, (unsigned long long)o->seed,
             o->type == MUSER_SYNTH_TYPE_MIX ? "mix" : quant_info((uint32_t)o->type)->name);
    char gname[64];
    snprintf(gname, sizeof gname, "muser-synth-%s", presets[o->preset].name);
    if ((rc = gguf_writer_set_str(w, "general.architecture", a)) ||
        (rc = gguf_writer_set_str(w, "general.name", gname)) ||
        (rc = gguf_writer_set_str(w, "general.description", desc)) ||
        (rc = gguf_writer_set_u32(w, KEY("block_count"), hp->n_layer)) ||
        (rc = gguf_writer_set_u32(w, KEY("context_length"), hp->n_ctx_train)) ||
        (rc = gguf_writer_set_u32(w, KEY("embedding_length"), hp->n_embd)) ||
        (rc = gguf_writer_set_u32(w, KEY("feed_forward_length"), hp->n_ff)) ||
        (rc = gguf_writer_set_u32(w, KEY("attention.head_count"), hp->n_head)) ||
        (rc = gguf_writer_set_u32(w, KEY("attention.head_count_kv"), hp->n_head_kv)) ||
        (rc = gguf_writer_set_u32(w, KEY("attention.key_length"), hp->head_dim)) ||
        (rc = gguf_writer_set_u32(w, KEY("attention.value_length"), hp->head_dim)) ||
        (rc = gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps)) ||
        (rc = gguf_writer_set_f32(w, KEY("rope.freq_base"), hp->rope_theta)) ||
        (rc = gguf_writer_set_u32(w, KEY("rope.dimension_count"), hp->rope_dim)) ||
        (rc = gguf_writer_set_u32(w, KEY("vocab_size"), hp->n_vocab)))
        return rc;
    if (hp->arch == MUSER_ARCH_MUSE &&
        ((rc = gguf_writer_set_f32(w, KEY("attention.post_norm_epsilon"), hp->post_norm_eps)) ||
         (rc = gguf_writer_set_u32(w, KEY("attention.sliding_window"), hp->swa_window)) ||
         (rc = gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), hp->swa_pattern)) ||
         (rc = gguf_writer_set_f32(w, KEY("logit_scale"), hp->logit_scale)) ||
         (rc = gguf_writer_set_f32(w, KEY("final_logit_softcapping"), hp->final_softcap))))
        return rc;
#undef KEY
    return MUSER_OK;
}

int muser_synth_write(const muser_synth_opts *o, const char *path, uint64_t *out_bytes,
                      muser_error *err)
{
    muser_hparams hp;
    int rc = muser_synth_hparams(o, &hp, err);
    if (rc)
        return rc;
    if (!path)
        return muser_errorf(err, MUSER_E_ARG, "synth: NULL output path");
    synth_tensor *ts = NULL;
    size_t n_ts = 0;
    vocab v;
    memset(&v, 0, sizeof v);
    gguf_writer *w = NULL;
    bool begun = false;
    muser_vocab ov; /* o200k (glimmer) */
    memset(&ov, 0, sizeof ov);
    const bool o200k = o->preset == MUSER_SYNTH_GLIMMER && !o->synthetic_vocab;
    if ((rc = build_tensors(o, &hp, &ts, &n_ts, err)))
        goto done;
    if (o200k) {
        if ((rc = muser_vocab_o200k(o->data_dir, &ov, err))) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err ? err->msg : "");
            rc = muser_errorf(err, rc, "synth: glimmer needs the o200k vocabulary (%.400s); "
                                       "a synthetic one can be asked for instead", why);
            goto done;
        }
        if (ov.n != hp.n_vocab) {
            rc = muser_errorf(err, MUSER_E_FORMAT, "synth: o200k vocabulary has %u tokens, "
                                                   "the preset wants %u", ov.n, hp.n_vocab);
            goto done;
        }
    } else if ((rc = build_vocab(&v, hp.n_vocab, err))) {
        goto done;
    }
    w = gguf_writer_new(0);
    if (!w) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "synth: out of memory for the writer");
        goto done;
    }
    if ((rc = write_hparams_kv(w, o, &hp))) {
        rc = muser_errorf(err, rc, "synth: writing hyper-parameter metadata failed");
        goto done;
    }
    if (o200k) {
        if ((rc = muser_vocab_write_gguf(&ov, w, err)))
            goto done;
        muser_vocab_free(&ov);
    } else {
        /* The synthetic merges were learned under GPT-2's pre-tokenizer: pre "default". */
        if ((rc = write_vocab_kv(w, &v, "default", err)))
            goto done;
        vocab_free(&v);
    }
    for (size_t i = 0; i < n_ts; i++) {
        const uint64_t ne[2] = {ts[i].ne0, ts[i].ne1};
        if ((rc = gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].is_norm ? 1 : 2, ne,
                                         err)))
            goto done;
    }
    if ((rc = gguf_writer_begin(w, path, err)))
        goto done;
    begun = true;
    if ((rc = write_tensor_data(w, ts, n_ts, o, err)) || (rc = gguf_writer_finish(w, err)))
        goto done;
    if (out_bytes) {
        struct stat sb;
        *out_bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    }
done:
    gguf_writer_free(w);
    if (rc && begun)
        unlink(path);
    vocab_free(&v);
    if (o200k)
        muser_vocab_free(&ov);
    free(ts);
    return rc;
}

/* ------------------------------------------------------- a DFlash drafter ---- */

/* One tensor of a synthetic drafter: rows of cols values, uniform with std 1/sqrt(cols) for a
 * matrix, 1 + 0.1 u for a norm, std 1 for the mask vector; quantized to type row by row. */
static int dflash_tensor(gguf_writer *w, uint64_t seed, const char *name, uint32_t type, uint64_t cols,
                         uint64_t rows, int kind /* 0 matrix, 1 norm, 2 mask */, float *row, uint8_t *q,
                         muser_error *err)
{
    const float amp = kind == 0 ? (float)sqrt(3.0 / (double)cols) : kind == 2 ? 1.7320508f : 0.1f;
    const uint64_t rb = quant_row_bytes(type, cols);
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t st = mix64(mix64(seed, fnv1a64(name)), r);
        for (uint64_t i = 0; i < cols; i += 2) {
            float a, b;
            uniform2(&st, &a, &b);
            row[i] = (kind == 1 ? 1.0f : 0.0f) + amp * a;
            if (i + 1 < cols)
                row[i + 1] = (kind == 1 ? 1.0f : 0.0f) + amp * b;
        }
        int rc = quant_quantize_row(type, row, q, cols);
        if (rc)
            return muser_errorf(err, rc, "synth dflash: %s: cannot store rows of %llu as %s", name,
                                (unsigned long long)cols, quant_info(type) ? quant_info(type)->name : "?");
        if ((rc = gguf_writer_tensor_data(w, q, rb, err)))
            return rc;
    }
    return MUSER_OK;
}

int muser_synth_dflash_write(const muser_model *target, const muser_synth_dflash_opts *o, const char *path,
                             muser_error *err)
{
    if (!target || !o || !path)
        return muser_errorf(err, MUSER_E_ARG, "muser_synth_dflash_write: NULL argument");
    const muser_hparams *th = &target->hp;
    muser_dflash_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layer = o->n_layer ? o->n_layer : 1;
    hp.block_size = o->block_size ? o->block_size : 8;
    hp.n_embd = th->n_embd;
    hp.n_ff = th->n_ff;
    hp.n_head = th->n_head;
    hp.n_head_kv = th->n_head_kv;
    hp.head_dim = th->head_dim;
    const uint32_t type = o->type < 0 ? GGML_TYPE_F32 : (uint32_t)o->type;
    const quant_type_info *qi = quant_info(type);
    if (!qi || !qi->supported)
        return muser_errorf(err, MUSER_E_ARG, "synth dflash: matrix type %d is not one muser computes with", o->type);
    if (hp.block_size < 2 || hp.block_size > MUSER_DFLASH_MAX_BLOCK || hp.n_layer > 64)
        return muser_errorf(err, MUSER_E_ARG, "synth dflash: block size %u (2..%d), %u layers (1..64)", hp.block_size,
                            MUSER_DFLASH_MAX_BLOCK, hp.n_layer);
    if (o->n_tap) {
        if (o->n_tap > MUSER_DFLASH_MAX_TAP)
            return muser_errorf(err, MUSER_E_ARG, "synth dflash: %u target layers (1..%d)", o->n_tap,
                                MUSER_DFLASH_MAX_TAP);
        hp.n_tap = o->n_tap;
        memcpy(hp.tap_layers, o->tap_layers, o->n_tap * sizeof(uint32_t));
    } else { /* spread: 1, L/2, L-1 (fewer for shallow targets) */
        const uint32_t L = th->n_layer, c[3] = {L > 2 ? 1 : 0, L / 2, L - 1};
        for (int i = 0; i < 3; i++)
            if (!hp.n_tap || c[i] > hp.tap_layers[hp.n_tap - 1])
                hp.tap_layers[hp.n_tap++] = c[i];
    }
    char fp[65];
    int rc = muser_dflash_fingerprint(target, fp, err);
    if (rc)
        return rc;
    const uint64_t E = hp.n_embd, QD = (uint64_t)hp.n_head * hp.head_dim, KVD = (uint64_t)hp.n_head_kv * hp.head_dim;
    gguf_writer *w = gguf_writer_new(0);
    if (!w)
        return muser_errorf(err, MUSER_E_NOMEM, "synth dflash: out of memory");
    gguf_writer_set_str(w, "general.architecture", MUSER_DFLASH_ARCH);
    gguf_writer_set_str(w, "general.name", "synthetic dflash drafter");
    gguf_writer_set_u32(w, "dflash.block_count", hp.n_layer);
    gguf_writer_set_u32(w, "dflash.embedding_length", hp.n_embd);
    gguf_writer_set_u32(w, "dflash.feed_forward_length", hp.n_ff);
    gguf_writer_set_u32(w, "dflash.attention.head_count", hp.n_head);
    gguf_writer_set_u32(w, "dflash.attention.head_count_kv", hp.n_head_kv);
    gguf_writer_set_u32(w, "dflash.attention.key_length", hp.head_dim);
    gguf_writer_set_f32(w, "dflash.attention.layer_norm_rms_epsilon", th->rms_eps);
    gguf_writer_set_f32(w, "dflash.rope.freq_base", th->rope_theta);
    gguf_writer_set_u32(w, "dflash.block_size", hp.block_size);
    gguf_writer_set_arr(w, "dflash.target_layers", GGUF_TYPE_UINT32, hp.tap_layers, hp.n_tap);
    gguf_writer_set_u32(w, "dflash.target.vocab_size", th->n_vocab);
    gguf_writer_set_u32(w, "dflash.target.block_count", th->n_layer);
    gguf_writer_set_str(w, "dflash.target.fingerprint", fp);
    /* name, cols (ne0), rows (0: a vector), kind */
    typedef struct { char name[48]; uint64_t cols, rows; int kind; } spec_t;
    const uint32_t n_ts = 4 + 11 * hp.n_layer;
    spec_t *ts = calloc(n_ts, sizeof *ts);
    float *row = NULL;
    uint8_t *q = NULL;
    bool begun = false;
    if (!ts) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "synth dflash: out of memory");
        goto done;
    }
    uint32_t k = 0;
    ts[k++] = (spec_t){"fc.weight", hp.n_tap * E, E, 0};
    ts[k++] = (spec_t){"hidden_norm.weight", E, 0, 1};
    ts[k++] = (spec_t){"mask_embd.weight", E, 0, 2};
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        static const char *const names[11] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                                              "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
        const uint64_t dims[11][2] = {{E, 0}, {E, QD}, {E, KVD}, {E, KVD}, {hp.head_dim, 0}, {hp.head_dim, 0},
                                      {QD, E}, {E, 0}, {E, hp.n_ff}, {E, hp.n_ff}, {hp.n_ff, E}};
        for (int i = 0; i < 11; i++, k++) {
            snprintf(ts[k].name, sizeof ts[k].name, "blk.%u.%s.weight", l, names[i]);
            ts[k].cols = dims[i][0];
            ts[k].rows = dims[i][1];
            ts[k].kind = dims[i][1] ? 0 : 1;
        }
    }
    ts[k++] = (spec_t){"output_norm.weight", E, 0, 1};
    uint64_t most = 0;
    for (uint32_t i = 0; i < n_ts; i++) {
        const uint32_t ty = ts[i].rows ? type : GGML_TYPE_F32;
        if (ts[i].rows && ts[i].cols % qi->block_elems)
            rc = muser_errorf(err, MUSER_E_ARG, "synth dflash: %s has rows of %llu, not a multiple of the %s block",
                              ts[i].name, (unsigned long long)ts[i].cols, qi->name);
        const uint64_t ne[2] = {ts[i].cols, ts[i].rows ? ts[i].rows : 1};
        if (!rc)
            rc = gguf_writer_add_tensor(w, ts[i].name, ty, ts[i].rows ? 2 : 1, ne, err);
        if (rc)
            goto done;
        if (ts[i].cols > most)
            most = ts[i].cols;
    }
    row = malloc((most + 1) * sizeof(float));
    q = malloc((most + 1) * sizeof(float));
    if (!row || !q) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "synth dflash: out of memory");
        goto done;
    }
    if ((rc = gguf_writer_begin(w, path, err)))
        goto done;
    begun = true;
    for (uint32_t i = 0; i < n_ts && !rc; i++)
        rc = dflash_tensor(w, o->seed, ts[i].name, ts[i].rows ? type : GGML_TYPE_F32, ts[i].cols,
                           ts[i].rows ? ts[i].rows : 1, ts[i].kind, row, q, err);
    if (!rc)
        rc = gguf_writer_finish(w, err);
done:
    gguf_writer_free(w);
    if (rc && begun)
        unlink(path);
    free(ts);
    free(row);
    free(q);
    return rc;
}
