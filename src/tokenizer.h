/* tokenizer.h — tokenizers read from GGUF metadata (tokenizer.ggml.*):
 *   gpt2  byte-level BPE, regex pre-tokenizer (PCRE2) chosen by tokenizer.ggml.pre, merge by rank;
 *   llama SentencePiece BPE with scores, byte fallback <0xNN>, '▁' spaces.
 * Loading needs only the vocabulary metadata, never tensors. */
#ifndef MUSER_TOKENIZER_H
#define MUSER_TOKENIZER_H

#include "gguf.h"

typedef struct muser_tokenizer muser_tokenizer;

int muser_tokenizer_load(muser_tokenizer **out, const gguf_file *f, muser_error *err);
void muser_tokenizer_free(muser_tokenizer *t);

/* Encode text (len bytes). add_bos: prepend BOS if the vocabulary has one. parse_special: match
 * control/special token texts in the input (otherwise they are ordinary text). Invalid UTF-8 is
 * an error (MUSER_E_TOKENIZE naming the byte offset). *out is malloc'ed; caller frees. */
int muser_tokenize(const muser_tokenizer *t, const char *text, size_t len, bool add_bos,
                   bool parse_special, int32_t **out, size_t *n_out, muser_error *err);
/* Bytes of one token as it appears in text (byte-level decoding applied); NULL/0 if invalid. */
const char *muser_token_bytes(const muser_tokenizer *t, int32_t id, size_t *len);
/* Detokenize a whole sequence into a malloc'ed NUL-terminated string. */
int muser_detokenize(const muser_tokenizer *t, const int32_t *ids, size_t n, char **out,
                     muser_error *err);

uint32_t muser_tokenizer_n_vocab(const muser_tokenizer *t);
int32_t muser_token_bos(const muser_tokenizer *t); /* -1 if none */
int32_t muser_token_eos(const muser_tokenizer *t);
int32_t muser_token_eot(const muser_tokenizer *t);
bool muser_token_is_eog(const muser_tokenizer *t, int32_t id); /* EOS, EOT or other end marker */
int32_t muser_token_find(const muser_tokenizer *t, const char *text); /* exact vocab text or -1 */
const char *muser_tokenizer_model(const muser_tokenizer *t); /* "gpt2" / "llama" */
const char *muser_tokenizer_pre(const muser_tokenizer *t);
/* tokenizer.ggml.add_bos_token (SentencePiece default true, gpt2 false; false without a BOS). */
bool muser_tokenizer_add_bos(const muser_tokenizer *t);

/* Streaming detokenizer: feed ids, get back only complete UTF-8 (never half a character). */
typedef struct muser_detok_stream {
    const muser_tokenizer *t;
    char pending[16];
    size_t n_pending;
    bool first;            /* SentencePiece: strip the leading space of the first piece */
} muser_detok_stream;
void muser_detok_stream_init(muser_detok_stream *s, const muser_tokenizer *t);
/* Appends printable bytes to out (cap bytes available, at least 64) and returns their count. */
size_t muser_detok_stream_push(muser_detok_stream *s, int32_t id, char *out, size_t cap);
/* Flush what is left (invalid trailing bytes become U+FFFD). */
size_t muser_detok_stream_flush(muser_detok_stream *s, char *out, size_t cap);
/* A cap that always holds one push or flush whole (longest token, every byte invalid -> U+FFFD);
 * with less, a push stops at a character boundary and drops the rest. */
size_t muser_detok_stream_min_cap(const muser_tokenizer *t);

#endif
