/* fuzz_vocab.h — the small vocabularies the tokenizer harnesses start from, as plain lists
 * (tokens, token types, scores, merges) so fuzz_tok_load.c can damage them before writing:
 *   tl_build_bpe  byte-level BPE: 3 control + 1 user-defined special, the 256 byte tokens in
 *                 GPT-2's byte-level form, then every word of `words` merged left to right;
 *   tl_build_spm  SentencePiece: <unk> <s> </s>, a user-defined special, the 256 <0xNN> byte
 *                 tokens, '▁', and every whole-character prefix of each '▁'-escaped word,
 *                 scored so longer pieces win.
 * tl_write sets the tokenizer.ggml.* keys of a list on a GGUF writer. */
#ifndef MUSER_FUZZ_VOCAB_H
#define MUSER_FUZZ_VOCAB_H

#include "fuzz_common.h"
#include "vocab.h"

#define TL_MAX 1024

static const char *const words[] = {
    "the", " the", "hello", " hello", " world", "ing", " and", "er", "123", " 2024", "'s",
    "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", /* привет */
    "\xe4\xbd\xa0\xe5\xa5\xbd",                         /* 你好 */
    "\xf0\x9f\x98\x80",                                 /* 😀 */
    "  ", "\n\n", " \n", "...", "e\xcc\x81",            /* e + combining acute */
};

typedef struct tlist {
    char *s[TL_MAX];
    int32_t type[TL_MAX];
    float score[TL_MAX];
    uint32_t n;
    char *m[TL_MAX];
    uint32_t nm;
} tlist;

static inline int32_t tl_find(const tlist *l, const char *s)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (!strcmp(l->s[i], s))
            return (int32_t)i;
    return -1;
}

static inline int32_t tl_add(tlist *l, const char *s, int32_t type, float score)
{
    int32_t id = tl_find(l, s);
    if (id >= 0 || l->n == TL_MAX)
        return id;
    l->s[l->n] = strdup(s);
    l->type[l->n] = type;
    l->score[l->n] = score;
    return (int32_t)l->n++;
}

static inline void tl_free(tlist *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        free(l->s[i]);
    for (uint32_t i = 0; i < l->nm; i++)
        free(l->m[i]);
    l->n = l->nm = 0;
}

static inline void tl_build_bpe(tlist *l)
{
    tl_add(l, "<|endoftext|>", 3, 0);
    tl_add(l, "<|im_start|>", 3, 0);
    tl_add(l, "<|im_end|>", 3, 0);
    tl_add(l, "<tool>", 4, 0);
    char enc[64], a[64], b[64];
    for (unsigned c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        enc[muser_byte_level_encode(&byte, 1, enc)] = 0;
        tl_add(l, enc, 1, 0);
    }
    for (size_t wi = 0; wi < sizeof words / sizeof words[0]; wi++) {
        const uint8_t *w = (const uint8_t *)words[wi];
        size_t n = strlen(words[wi]);
        a[muser_byte_level_encode(w, 1, a)] = 0;
        for (size_t k = 1; k < n; k++) {
            b[muser_byte_level_encode(w + k, 1, b)] = 0;
            char m[140], joined[128];
            snprintf(m, sizeof m, "%s %s", a, b);
            snprintf(joined, sizeof joined, "%s%s", a, b);
            if (tl_find(l, joined) < 0 && l->nm < TL_MAX) {
                tl_add(l, joined, 1, 0);
                l->m[l->nm++] = strdup(m);
            }
            snprintf(a, sizeof a, "%s", joined);
        }
    }
}

static inline void tl_build_spm(tlist *l)
{
    tl_add(l, "<unk>", 2, 0);
    tl_add(l, "<s>", 3, 0);
    tl_add(l, "</s>", 3, 0);
    tl_add(l, "<|user|>", 4, 0);
    char piece[128];
    for (unsigned c = 0; c < 256; c++) {
        snprintf(piece, sizeof piece, "<0x%02X>", c);
        tl_add(l, piece, 6, 0);
    }
    tl_add(l, "\xe2\x96\x81", 1, -1);
    for (size_t wi = 0; wi < sizeof words / sizeof words[0]; wi++) {
        size_t o = 0;
        for (const char *p = words[wi]; *p && o + 4 < sizeof piece; p++) {
            if (*p == ' ') {
                memcpy(piece + o, "\xe2\x96\x81", 3);
                o += 3;
            } else
                piece[o++] = *p;
            piece[o] = 0;
            if (fuzz_utf8_valid((const uint8_t *)piece, o)) /* whole characters only */
                tl_add(l, piece, 1, -(float)(20 - (o > 19 ? 19 : o)));
        }
    }
}

static inline void tl_write(const tlist *l, gguf_writer *w, bool spm, const char *pre)
{
    gguf_writer_set_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (pre)
        gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)l->s, NULL, l->n);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, l->type, l->n);
    if (spm) {
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, l->score, l->n);
        gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    } else {
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)l->m, NULL,
                                l->nm);
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    }
}

#endif
