/* cmd_quantize.c — `muser quantize IN OUT --type f16|q8_0|q4_k|q6_k|mix`: rewrite a GGUF with its
 * weight matrices in another block format.
 *
 * Every key-value pair is copied (general.file_type is then set to match). Each 2-D weight
 * (name ends in ".weight", n_dims >= 2) is converted row by row — dequantize to f32, quantize to
 * the target — by worker threads over chunks of rows, and streamed to OUT.tmp in declaration
 * order; OUT appears only by rename once the file is complete. 1-D tensors (norms) are written
 * as F32; anything else is copied byte for byte. `mix` is the release mix (quant_mix_type,
 * docs/quant.md). A matrix whose rows do not fit the target's block falls back to Q8_0, or F16. */
#include "cli.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QUANT_TYPE_MIX 0xffffffffu
/* Rows are converted and written in chunks of about this many output bytes. */
#define CHUNK_BYTES (32ull << 20)
#define MAX_THREADS 64

static void quantize_help(FILE *f)
{
    fprintf(f,
            "usage: muser quantize IN.gguf OUT.gguf --type f16|q8_0|q4_k|q6_k|mix [options]\n\n"
            "Convert every 2-D weight matrix of IN to the given block format; norms and other\n"
            "1-D tensors are written as f32; all metadata is copied. mix is the release mix:\n"
            "q4_k, with q6_k for output.weight and for attn_v/ffn_down on the first and last\n"
            "eighth of the layers and every third layer between (docs/quant.md). Rows that do\n"
            "not fit the block fall back to q8_0 (or f16). OUT is written as OUT.tmp and renamed\n"
            "when complete.\n\n"
            "options:\n"
            "  --type T          target: f16, q8_0, q4_k, q6_k or mix (required)\n"
            "  -t, --threads N   worker threads (default: all CPUs, at least 2)\n"
            "  -h, --help        this help\n");
}

/* One tensor's conversion plan. */
typedef struct tensor_plan {
    const gguf_tensor *t;
    uint32_t out_type;
    uint64_t rows, row_in, row_out; /* rows of ne0 elements; bytes per row in and out */
    bool convert;                   /* false: copy the bytes as they are */
} tensor_plan;

/* A chunk of rows [r0, r1) of one tensor, split between the workers. */
typedef struct chunk_job {
    const tensor_plan *p;
    uint64_t r0, r1;
    uint8_t *out;     /* row_out * (r1 - r0) bytes */
    uint32_t n_workers;
} chunk_job;

typedef struct worker {
    const chunk_job *job;
    uint32_t index;
    float *buf;       /* ne0 floats */
    int rc;
} worker;

static void *worker_main(void *arg)
{
    worker *wk = arg;
    const chunk_job *j = wk->job;
    const tensor_plan *p = j->p;
    uint64_t n = j->r1 - j->r0, per = (n + j->n_workers - 1) / j->n_workers;
    uint64_t a = wk->index * per, b = a + per < n ? a + per : n;
    const uint8_t *src = (const uint8_t *)p->t->data;
    wk->rc = MUSER_OK;
    for (uint64_t r = a; r < b && !wk->rc; r++) {
        const uint8_t *in = src + (j->r0 + r) * p->row_in;
        uint8_t *out = j->out + r * p->row_out;
        wk->rc = quant_dequantize_row(p->t->type, in, wk->buf, p->t->ne[0]);
        if (!wk->rc)
            wk->rc = quant_quantize_row(p->out_type, wk->buf, out, p->t->ne[0]);
    }
    return NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Layer count for the mix: <arch>.block_count, else one more than the largest blk.N seen. */
static uint32_t layer_count(const gguf_file *f)
{
    gguf_str arch;
    if (!gguf_get_str(f, "general.architecture", &arch, NULL) && arch.len < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
        uint32_t n;
        if (!gguf_get_u32(f, key, &n, NULL))
            return n;
    }
    uint32_t n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name_z;
        if (!strncmp(name, "blk.", 4)) {
            unsigned long l = strtoul(name + 4, NULL, 10);
            if (l + 1 > n && l < 100000)
                n = (uint32_t)(l + 1);
        }
    }
    return n;
}

/* general.file_type values (llama.cpp's enum) for each target. */
static uint32_t file_type_for(uint32_t target)
{
    switch (target) {
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_Q4_K: return 14; /* Q4_K_S */
    case GGML_TYPE_Q6_K: return 18;
    default: return 15;             /* mix: Q4_K_M */
    }
}

/* Plan every tensor; fills plans (n_tensors entries). Prints a note for each fallback. */
static int plan_tensors(const gguf_file *f, uint32_t target, tensor_plan *plans, muser_error *err)
{
    uint32_t n_layer = layer_count(f);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        tensor_plan *p = &plans[i];
        const quant_type_info *ti = quant_info(t->type);
        p->t = t;
        p->out_type = t->type;
        p->convert = false;
        p->rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++)
            p->rows *= t->ne[d];
        p->row_in = quant_row_bytes(t->type, t->ne[0]);
        bool matrix = t->n_dims >= 2 && ends_with(t->name_z, ".weight");
        bool vector = t->n_dims == 1;
        if (matrix) {
            uint32_t want = target == QUANT_TYPE_MIX
                                ? quant_mix_type(t->name_z, n_layer, GGML_TYPE_Q4_K)
                                : target;
            p->out_type = quant_fallback_type(want, t->ne[0]);
            if (p->out_type != want)
                fprintf(stderr, "note: %s: ne0 = %llu is not a multiple of %u, using %s\n",
                        t->name_z, (unsigned long long)t->ne[0], quant_info(want)->block_elems,
                        quant_info(p->out_type)->name);
        } else if (vector && ti && ti->supported) {
            p->out_type = GGML_TYPE_F32;
        }
        if (p->out_type != t->type) {
            if (!ti || !ti->supported || !p->row_in)
                return muser_errorf(err, MUSER_E_UNSUPPORTED,
                                    "%s: tensor '%s' has type %s, which muser cannot convert",
                                    f->path, t->name_z, ti ? ti->name : "unknown");
            p->convert = true;
        }
        p->row_out = p->convert ? quant_row_bytes(p->out_type, t->ne[0]) : p->row_in;
    }
    return MUSER_OK;
}

/* Convert (or copy) one tensor and stream it to the writer, chunk by chunk. */
static int write_tensor(gguf_writer *w, const tensor_plan *p, uint32_t n_threads, uint8_t *chunk,
                        uint64_t chunk_cap, worker *workers, muser_progress *prog,
                        uint64_t *done, muser_error *err)
{
    if (!p->convert) {
        int rc = gguf_writer_tensor_data(w, p->t->data, p->t->nbytes, err);
        *done += p->t->nbytes;
        muser_progress_update(prog, *done);
        return rc;
    }
    uint64_t rows_per = chunk_cap / p->row_out;
    if (rows_per == 0)
        rows_per = 1;
    for (uint64_t r0 = 0; r0 < p->rows; r0 += rows_per) {
        uint64_t r1 = r0 + rows_per < p->rows ? r0 + rows_per : p->rows;
        chunk_job job = {p, r0, r1, chunk, n_threads};
        uint32_t nw = r1 - r0 < n_threads ? (uint32_t)(r1 - r0) : n_threads;
        job.n_workers = nw;
        pthread_t tid[MAX_THREADS];
        bool started[MAX_THREADS] = {false};
        for (uint32_t k = 1; k < nw; k++) {
            workers[k].job = &job;
            workers[k].index = k;
            started[k] = pthread_create(&tid[k], NULL, worker_main, &workers[k]) == 0;
        }
        workers[0].job = &job;
        workers[0].index = 0;
        worker_main(&workers[0]); /* this thread is worker 0 */
        for (uint32_t k = 1; k < nw; k++) {
            if (started[k])
                pthread_join(tid[k], NULL);
            else
                worker_main(&workers[k]); /* could not start a thread: do its share here */
        }
        for (uint32_t k = 0; k < nw; k++)
            if (workers[k].rc)
                return muser_errorf(err, workers[k].rc, "tensor '%s': conversion to %s failed",
                                    p->t->name_z, quant_info(p->out_type)->name);
        int rc = gguf_writer_tensor_data(w, chunk, (r1 - r0) * p->row_out, err);
        if (rc)
            return rc;
        *done += (r1 - r0) * p->row_out;
        muser_progress_update(prog, *done);
    }
    return MUSER_OK;
}

int cmd_quantize(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        quantize_help(stdout);
        return 0;
    }
    const char *in = NULL, *out = NULL, *type_name = NULL;
    uint64_t threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--type") || !strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc)
                return cli_usage_error("quantize", "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--type"))
                type_name = v;
            else if (!muser_parse_u64(v, &threads) || threads == 0 || threads > MAX_THREADS)
                return cli_usage_error("quantize", "bad thread count '%s' (1..%d)", v, MAX_THREADS);
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("quantize", "unknown option '%s'", a);
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            return cli_usage_error("quantize", "unexpected argument '%s'", a);
        }
    }
    if (!in || !out)
        return cli_usage_error("quantize", "needs IN and OUT paths");
    if (!type_name)
        return cli_usage_error("quantize", "needs --type f16|q8_0|q4_k|q6_k|mix");
    uint32_t target;
    if (!strcmp(type_name, "mix")) {
        target = QUANT_TYPE_MIX;
    } else {
        int t = quant_type_from_name(type_name);
        if (t != GGML_TYPE_F16 && t != GGML_TYPE_Q8_0 && t != GGML_TYPE_Q4_K && t != GGML_TYPE_Q6_K)
            return cli_usage_error("quantize", "unknown --type '%s' (f16, q8_0, q4_k, q6_k, mix)",
                                   type_name);
        target = (uint32_t)t;
    }
    if (!threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc < 2 ? 2 : nc > MAX_THREADS ? MAX_THREADS : (uint64_t)nc;
    }

    muser_error err = {0};
    gguf_file *f = NULL;
    if (gguf_open(&f, in, &err)) {
        fprintf(stderr, "muser quantize: %s\n", err.msg);
        return 1;
    }
    int rc = MUSER_OK;
    double t0 = muser_now_s();
    tensor_plan *plans = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *plans);
    worker *workers = calloc(threads, sizeof *workers);
    uint8_t *chunk = NULL;
    gguf_writer *w = NULL;
    size_t tmp_len = strlen(out) + 5;
    char *tmp = malloc(tmp_len);
    if (!plans || !workers || !tmp) {
        rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory");
        goto done;
    }
    snprintf(tmp, tmp_len, "%s.tmp", out);
    rc = plan_tensors(f, target, plans, &err);
    if (rc)
        goto done;

    /* buffers: one chunk of output rows, one f32 row per worker */
    uint64_t max_ne0 = 1, max_row_out = 0, total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (plans[i].convert) {
            max_ne0 = plans[i].t->ne[0] > max_ne0 ? plans[i].t->ne[0] : max_ne0;
            max_row_out = plans[i].row_out > max_row_out ? plans[i].row_out : max_row_out;
            total += plans[i].rows * plans[i].row_out;
        } else {
            total += plans[i].t->nbytes;
        }
    }
    uint64_t chunk_cap = max_row_out > CHUNK_BYTES ? max_row_out : CHUNK_BYTES;
    chunk = max_row_out ? malloc(chunk_cap) : NULL;
    if (max_row_out && !chunk) {
        rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory for a %llu-byte chunk",
                          (unsigned long long)chunk_cap);
        goto done;
    }
    for (uint64_t k = 0; k < threads; k++) {
        workers[k].buf = malloc(max_ne0 * sizeof(float));
        if (!workers[k].buf) {
            rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory");
            goto done;
        }
    }

    /* header: all metadata, then the file type, then the tensor infos */
    w = gguf_writer_new((uint32_t)f->alignment);
    if (!w) {
        rc = muser_errorf(&err, MUSER_E_NOMEM, "out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < f->n_kv && !rc; i++)
        if ((rc = gguf_writer_copy_kv(w, &f->kv[i])))
            muser_errorf(&err, rc, "%s: cannot copy key '%.*s'", in, (int)f->kv[i].key.len,
                         f->kv[i].key.ptr);
    if (!rc)
        rc = gguf_writer_set_u32(w, "general.file_type", file_type_for(target));
    if (!rc && target != GGML_TYPE_F16)
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (rc) {
        if (!err.msg[0])
            muser_errorf(&err, rc, "cannot set metadata");
        goto done;
    }
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++)
        rc = gguf_writer_add_tensor(w, plans[i].t->name_z, plans[i].out_type, plans[i].t->n_dims,
                                    plans[i].t->ne, &err);
    if (!rc)
        rc = gguf_writer_begin(w, tmp, &err);
    if (rc)
        goto done;

    muser_progress prog;
    muser_progress_begin(&prog, "quantize", total);
    uint64_t written = 0;
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++)
        rc = write_tensor(w, &plans[i], (uint32_t)threads, chunk, chunk_cap, workers, &prog,
                          &written, &err);
    muser_progress_finish(&prog);
    if (!rc)
        rc = gguf_writer_finish(w, &err);
    if (!rc && rename(tmp, out) != 0) {
        rc = muser_errorf(&err, MUSER_E_IO, "%s: cannot rename to %s: %s", tmp, out,
                          strerror(errno));
        unlink(tmp);
    }
    if (!rc) {
        /* summary: tensors per output type */
        uint64_t count[GGML_TYPE_COUNT] = {0};
        for (uint64_t i = 0; i < f->n_tensors; i++)
            if (plans[i].out_type < GGML_TYPE_COUNT)
                count[plans[i].out_type]++;
        fprintf(stderr, "muser quantize: wrote %s: %llu tensors (", out,
                (unsigned long long)f->n_tensors);
        const char *sep = "";
        for (uint32_t t = 0; t < GGML_TYPE_COUNT; t++)
            if (count[t]) {
                fprintf(stderr, "%s%llu %s", sep, (unsigned long long)count[t], quant_info(t)->name);
                sep = ", ";
            }
        fprintf(stderr, "), %.3f GB in %.1f s with %llu threads\n", (double)written / 1e9,
                muser_now_s() - t0, (unsigned long long)threads);
    }

done:
    if (rc)
        fprintf(stderr, "muser quantize: %s\n", err.msg[0] ? err.msg : muser_status_name(rc));
    gguf_writer_free(w); /* removes OUT.tmp if it was not finished */
    if (workers)
        for (uint64_t k = 0; k < threads; k++)
            free(workers[k].buf);
    free(workers);
    free(chunk);
    free(plans);
    free(tmp);
    gguf_close(f);
    return rc ? 1 : 0;
}
