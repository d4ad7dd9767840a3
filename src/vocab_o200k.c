/* vocab_o200k.c — the o200k vocabulary as a GGUF gpt2-type tokenizer (pre "gpt-4o").
 *
 * Input: o200k_base.tiktoken, OpenAI's rank file: one line "<base64 of the token's bytes> <rank>"
 * per mergeable token, ranks 0..199997 in order. tiktoken merges by rank directly; GGUF wants a
 * merge list instead, so each token of rank r with more than one byte gets the one merge that
 * byte-level BPE would use to build it: run BPE on the token's own bytes allowing only ranks
 * below r (always merging the lowest-ranked adjacent pair) and take the two parts left at the
 * end. The merges are listed in the order of the ranks of the tokens they build, so "merge rank"
 * and "tiktoken rank" order every pair the same way.
 *
 * Output ids: rank r is id r; ids 199998..202047 are control tokens — the o200k specials
 * (<|endoftext|> 199999, <|endofprompt|> 200018), the harmony chat tokens at their usual ids, and
 * "<|reserved_N|>" for the rest. */
#include "vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define O200K_N_RANKS 199998u
#define O200K_N_VOCAB 202048u
#define O200K_FILE "o200k_base.tiktoken"

static const struct {
    int32_t id;
    const char *text;
} o200k_specials[] = {
    {199998, "<|startoftext|>"}, {199999, "<|endoftext|>"}, {200002, "<|return|>"},
    {200003, "<|constrain|>"},   {200005, "<|channel|>"},   {200006, "<|start|>"},
    {200007, "<|end|>"},         {200008, "<|message|>"},   {200012, "<|call|>"},
    {200018, "<|endofprompt|>"},
};

/* A token's bytes inside the decoded blob. */
typedef struct rank_entry {
    uint32_t off, len;
} rank_entry;

typedef struct rank_table {
    const uint8_t *blob;
    const rank_entry *ent;
    uint32_t *slots; /* rank + 1, 0 = empty */
    uint64_t mask;
} rank_table;

static uint64_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int64_t rank_of(const rank_table *t, const uint8_t *s, size_t n)
{
    uint64_t i = hash_bytes(s, n) & t->mask;
    for (;;) {
        uint32_t v = t->slots[i];
        if (!v)
            return -1;
        const rank_entry *e = &t->ent[v - 1];
        if (e->len == n && !memcmp(t->blob + e->off, s, n))
            return v - 1;
        i = (i + 1) & t->mask;
    }
}

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decode base64 s[0..n) (padded) to out; returns the byte count or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out)
{
    if (n == 0 || n % 4)
        return -1;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = b64_value((unsigned char)s[i + k])) < 0)
                return -1;
        }
        uint32_t x = (uint32_t)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        out[o++] = (uint8_t)(x >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(x >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)x;
    }
    return o;
}

static char *read_file(const char *path, size_t *n, muser_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        muser_errorf(err, MUSER_E_IO, "%s: cannot open (the o200k vocabulary data)", path);
        return NULL;
    }
    char *b = NULL;
    long sz = -1;
    if (!fseek(f, 0, SEEK_END) && (sz = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (b = malloc((size_t)sz + 1)) && fread(b, 1, (size_t)sz, f) == (size_t)sz) {
        b[sz] = 0;
        *n = (size_t)sz;
        fclose(f);
        return b;
    }
    free(b);
    fclose(f);
    muser_errorf(err, MUSER_E_IO, "%s: read failed", path);
    return NULL;
}

/* Parse the rank file into blob/ent (rank i at ent[i]); checks ranks are 0..N-1 in order. */
static int parse_ranks(const char *path, const char *text, size_t n, uint8_t *blob,
                       rank_entry *ent, muser_error *err)
{
    uint32_t r = 0, off = 0;
    size_t line = 1;
    for (size_t i = 0; i < n; line++) {
        const char *eol = memchr(text + i, '\n', n - i);
        size_t e = eol ? (size_t)(eol - text) : n;
        if (e == i) { /* blank line (the end) */
            i = e + 1;
            continue;
        }
        const char *sp = memchr(text + i, ' ', e - i);
        if (!sp)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: line %zu: expected '<base64> <rank>'",
                                path, line);
        if (r >= O200K_N_RANKS)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: line %zu: more than %u ranks", path,
                                line, O200K_N_RANKS);
        char *end;
        unsigned long rank = strtoul(sp + 1, &end, 10);
        if (end != text + e || rank != r)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: line %zu: rank %.*s, expected %u", path,
                                line, (int)(text + e - sp - 1), sp + 1, r);
        long bl = b64_decode(text + i, (size_t)(sp - text - (long)i), blob + off);
        if (bl <= 0)
            return muser_errorf(err, MUSER_E_FORMAT, "%s: line %zu: bad base64", path, line);
        ent[r++] = (rank_entry){off, (uint32_t)bl};
        off += (uint32_t)bl;
        i = e + 1;
    }
    if (r != O200K_N_RANKS)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: %u ranks, expected %u", path, r,
                            O200K_N_RANKS);
    return MUSER_OK;
}

/* BPE on token r's bytes using only ranks < r; *split = length of the left part when exactly
 * two parts remain. bounds[] holds part starts (scratch, len + 1 entries). */
static bool derive_merge(const rank_table *t, uint32_t r, uint32_t *bounds, uint32_t *split)
{
    const uint8_t *s = t->blob + t->ent[r].off;
    uint32_t len = t->ent[r].len, np = len; /* parts: [bounds[k], bounds[k+1]) */
    for (uint32_t k = 0; k <= len; k++)
        bounds[k] = k;
    while (np > 2) {
        int64_t best = -1;
        uint32_t at = 0;
        for (uint32_t k = 0; k + 1 < np; k++) {
            int64_t q = rank_of(t, s + bounds[k], bounds[k + 2] - bounds[k]);
            if (q >= 0 && q < (int64_t)r && (best < 0 || q < best)) {
                best = q;
                at = k;
            }
        }
        if (best < 0)
            return false;
        memmove(bounds + at + 1, bounds + at + 2, (np - at - 1) * sizeof *bounds);
        np--;
    }
    *split = bounds[1];
    return np == 2;
}

int muser_vocab_o200k(const char *data_dir, muser_vocab *out, muser_error *err)
{
    memset(out, 0, sizeof *out);
    char dir[1024], path[1200];
    if (data_dir)
        snprintf(dir, sizeof dir, "%s", data_dir);
    else if (getenv("MUSER_DATA_DIR") && *getenv("MUSER_DATA_DIR"))
        snprintf(dir, sizeof dir, "%s/tokenizers", getenv("MUSER_DATA_DIR"));
    else
        snprintf(dir, sizeof dir, "%s/tokenizers", MUSER_DATA_DIR);
    snprintf(path, sizeof path, "%s/%s", dir, O200K_FILE);

    size_t n;
    char *text = read_file(path, &n, err);
    if (!text)
        return err ? err->code : MUSER_E_IO;
    int rc = MUSER_OK;
    uint8_t *blob = malloc(n);           /* decoded bytes are fewer than their base64 */
    rank_entry *ent = malloc(O200K_N_RANKS * sizeof *ent);
    rank_table tab = {blob, ent, NULL, (1u << 19) - 1};
    tab.slots = calloc(tab.mask + 1, sizeof *tab.slots);
    uint32_t *bounds = NULL, *split = malloc(O200K_N_RANKS * sizeof *split);
    if (!blob || !ent || !tab.slots || !split) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((rc = parse_ranks(path, text, n, blob, ent, err)))
        goto done;
    uint32_t max_len = 0;
    for (uint32_t r = 0; r < O200K_N_RANKS; r++) {
        uint64_t h = hash_bytes(blob + ent[r].off, ent[r].len) & tab.mask;
        while (tab.slots[h]) {
            const rank_entry *e = &ent[tab.slots[h] - 1];
            if (e->len == ent[r].len && !memcmp(blob + e->off, blob + ent[r].off, e->len)) {
                rc = muser_errorf(err, MUSER_E_FORMAT, "%s: rank %u repeats rank %u's bytes",
                                  path, r, tab.slots[h] - 1);
                goto done;
            }
            h = (h + 1) & tab.mask;
        }
        tab.slots[h] = r + 1;
        if (ent[r].len > max_len)
            max_len = ent[r].len;
    }
    bounds = malloc((max_len + 1) * sizeof *bounds);
    if (!bounds) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    uint32_t n_merges = 0;
    uint64_t bytes = 0; /* storage: token texts (<= 2 bytes per byte) and merge strings */
    for (uint32_t r = 0; r < O200K_N_RANKS; r++) {
        bytes += 2 * (uint64_t)ent[r].len + 1;
        if (ent[r].len < 2)
            continue;
        if (!derive_merge(&tab, r, bounds, &split[r])) {
            rc = muser_errorf(err, MUSER_E_FORMAT,
                              "%s: rank %u cannot be built by merging two lower ranks", path, r);
            goto done;
        }
        n_merges++;
        bytes += 2 * (uint64_t)ent[r].len + 2;
    }
    bytes += (O200K_N_VOCAB - O200K_N_RANKS) * 24u;

    out->storage = malloc(bytes);
    out->tokens = malloc(O200K_N_VOCAB * sizeof *out->tokens);
    out->types = malloc(O200K_N_VOCAB * sizeof *out->types);
    out->merges = malloc(n_merges * sizeof *out->merges);
    if (!out->storage || !out->tokens || !out->types || !out->merges) {
        rc = muser_errorf(err, MUSER_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    char *p = out->storage;
    for (uint32_t r = 0; r < O200K_N_RANKS; r++) {
        out->tokens[r] = p;
        out->types[r] = 1;
        p += muser_byte_level_encode(blob + ent[r].off, ent[r].len, p);
        *p++ = 0;
    }
    for (uint32_t id = O200K_N_RANKS; id < O200K_N_VOCAB; id++) {
        const char *name = NULL;
        for (size_t k = 0; k < sizeof o200k_specials / sizeof o200k_specials[0]; k++)
            if (o200k_specials[k].id == (int32_t)id)
                name = o200k_specials[k].text;
        out->tokens[id] = p;
        out->types[id] = 3;
        p += (name ? snprintf(p, 24, "%s", name) : snprintf(p, 24, "<|reserved_%u|>", id)) + 1;
    }
    for (uint32_t r = 0; r < O200K_N_RANKS; r++) {
        if (ent[r].len < 2)
            continue;
        out->merges[out->n_merges++] = p;
        const uint8_t *s = blob + ent[r].off;
        p += muser_byte_level_encode(s, split[r], p);
        *p++ = ' ';
        p += muser_byte_level_encode(s + split[r], ent[r].len - split[r], p);
        *p++ = 0;
    }
    out->n = O200K_N_VOCAB;
    out->model = "gpt2";
    out->pre = "gpt-4o";
    out->bos = 199998; /* <|startoftext|>; tiktoken never adds it, so add_bos is false */
    out->eos = 199999; /* <|endoftext|> */
    out->eot = 200007; /* <|end|> */
    out->add_bos = false;
done:
    free(text);
    free(blob);
    free(ent);
    free(tab.slots);
    free(bounds);
    free(split);
    if (rc)
        muser_vocab_free(out);
    return rc;
}

int muser_vocab_write_gguf(const muser_vocab *v, gguf_writer *w, muser_error *err)
{
    int rc;
    if ((rc = gguf_writer_set_str(w, "tokenizer.ggml.model", v->model)) ||
        (rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre)) ||
        (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->tokens, NULL, v->n)) ||
        (rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types,
                                  v->n)) ||
        (rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", v->merges, NULL,
                                      v->n_merges)) ||
        (rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos)))
        return muser_errorf(err, rc, "vocabulary: writing tokenizer.ggml.* failed");
    const struct {
        const char *key;
        int32_t id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", v->bos},
               {"tokenizer.ggml.eos_token_id", v->eos},
               {"tokenizer.ggml.eot_token_id", v->eot}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id >= 0 && (rc = gguf_writer_set_u32(w, ids[i].key, (uint32_t)ids[i].id)))
            return muser_errorf(err, rc, "vocabulary: writing %s failed", ids[i].key);
    return MUSER_OK;
}

int muser_tokenizer_load_vocab(muser_tokenizer **out, const muser_vocab *v, muser_error *err)
{
    *out = NULL;
    int fd = memfd_create("muser-vocab", MFD_CLOEXEC);
    if (fd < 0)
        return muser_errorf(err, MUSER_E_IO, "vocabulary: memfd_create failed");
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    gguf_writer *w = gguf_writer_new(0);
    int rc = w ? MUSER_OK : muser_errorf(err, MUSER_E_NOMEM, "vocabulary: out of memory");
    if (!rc)
        rc = muser_vocab_write_gguf(v, w, err);
    if (!rc)
        rc = gguf_writer_begin(w, path, err);
    if (!rc)
        rc = gguf_writer_finish(w, err);
    gguf_writer_free(w);
    gguf_file *f = NULL;
    if (!rc)
        rc = gguf_open(&f, path, err);
    if (!rc)
        rc = muser_tokenizer_load(out, f, err);
    gguf_close(f);
    close(fd);
    return rc;
}

int muser_tokenizer_open(muser_tokenizer **out, const char *model_path, const char *vocab_name,
                         muser_error *err)
{
    *out = NULL;
    if (vocab_name) {
        if (strcmp(vocab_name, "o200k"))
            return muser_errorf(err, MUSER_E_ARG, "unknown built-in vocabulary '%s' (o200k)",
                                vocab_name);
        muser_vocab v;
        int rc = muser_vocab_o200k(NULL, &v, err);
        if (rc)
            return rc;
        rc = muser_tokenizer_load_vocab(out, &v, err);
        muser_vocab_free(&v);
        return rc;
    }
    gguf_file *f = NULL;
    int rc = gguf_open(&f, model_path, err);
    if (rc)
        return rc;
    rc = muser_tokenizer_load(out, f, err);
    gguf_close(f);
    return rc;
}

void muser_vocab_free(muser_vocab *v)
{
    if (!v)
        return;
    free(v->storage);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}
