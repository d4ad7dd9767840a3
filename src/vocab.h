/* vocab.h — vocabularies muser builds itself rather than reads from a model file, in the form
 * GGUF stores them (tokenizer.ggml.*), so a synthetic model can carry a real tokenizer.
 *
 *   o200k  OpenAI's o200k_base ranks (data/tokenizers/o200k_base.tiktoken, MIT) as a gpt2-type
 *          BPE with pre = "gpt-4o": 199998 mergeable tokens, their merges derived at load, and
 *          control tokens (the o200k/harmony specials, the rest "<|reserved_N|>") up to 202048. */
#ifndef MUSER_VOCAB_H
#define MUSER_VOCAB_H

#include "gguf.h"
#include "tokenizer.h"

typedef struct muser_vocab {
    uint32_t n;               /* tokens */
    const char **tokens;      /* [n] NUL-terminated, GPT-2 byte-level form (as GGUF stores it) */
    int32_t *types;           /* [n] token_type: 1 normal, 3 control */
    uint32_t n_merges;
    const char **merges;      /* [n_merges] "left right", rank order */
    const char *model;        /* tokenizer.ggml.model: "gpt2" */
    const char *pre;          /* tokenizer.ggml.pre: "gpt-4o" */
    int32_t bos, eos, eot;    /* -1 if none */
    bool add_bos;
    char *storage;            /* owns every string above */
} muser_vocab;

/* Build the o200k vocabulary from data_dir/o200k_base.tiktoken (data_dir NULL: $MUSER_DATA_DIR/
 * tokenizers, else the source tree's data/tokenizers). Errors name the file and line. */
int muser_vocab_o200k(const char *data_dir, muser_vocab *out, muser_error *err);
/* Set every tokenizer.ggml.* key of v on a GGUF writer. */
int muser_vocab_write_gguf(const muser_vocab *v, gguf_writer *w, muser_error *err);
void muser_vocab_free(muser_vocab *v);
/* A tokenizer for v, built the way every tokenizer is: v is written as a vocabulary-only GGUF
 * in memory (memfd) and loaded from there. */
int muser_tokenizer_load_vocab(muser_tokenizer **out, const muser_vocab *v, muser_error *err);
/* The CLI's way in: vocab_name ("o200k") if not NULL, else the GGUF at model_path. */
int muser_tokenizer_open(muser_tokenizer **out, const char *model_path, const char *vocab_name,
                         muser_error *err);

/* GPT-2's byte-level form of n bytes (each byte -> one printable codepoint, UTF-8): writes at
 * most 2n bytes to out and returns the count. Implemented in tokenizer.c. */
size_t muser_byte_level_encode(const uint8_t *bytes, size_t n, char *out);

#endif
