/* test_trained_model.c — the embedded default model (models/default.gguf, trained with
 * tools/train/) against an independent framework:
 *   1. its tokenizer against Hugging Face `tokenizers` encodings (tests/data/tokenizer_ref.txt):
 *      exact ids;
 *   2. muser's oracle against PyTorch logits of the same release-mix weights
 *      (tests/data/ref_logits.{txt,bin}, sequences longer than the 64-row window): max
 *      |Δ log_softmax| <= 1e-3 over every vocabulary row (SPEC §4), and the same top-1 wherever
 *      the reference's best two logits are more than 1e-3 apart. */
#include "check.h"
#include "session.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void log_softmax(const float *x, uint32_t n, double *out)
{
    double m = -INFINITY, s = 0;
    for (uint32_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (uint32_t i = 0; i < n; i++)
        s += exp((double)x[i] - m);
    double lse = m + log(s);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (double)x[i] - lse;
}

static void check_tokenizer(const char *dir, const muser_tokenizer *tok)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer_ref.txt", dir);
    size_t n;
    char *buf = check_read_file(path, &n);
    CHECKF(buf != NULL, "cannot read %s", path);
    if (!buf)
        return;
    char *p = buf, *end = buf + n;
    int cases = 0;
    while (p < end) {
        if (*p == '#') { /* comment line */
            p = strchr(p, '\n');
            p = p ? p + 1 : end;
            continue;
        }
        char *nl;
        unsigned long len = strtoul(p, &nl, 10);
        if (*nl != '\n' || nl + 1 + len > end)
            break;
        const char *text = nl + 1;
        p = (char *)text + len + 1; /* skip text and its newline */
        char *line_end = strchr(p, '\n');
        if (!line_end)
            break;
        *line_end = 0;
        int32_t want[1024];
        size_t n_want = 0;
        for (char *q = p; *q && n_want < 1024;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q)
                break;
            want[n_want++] = (int32_t)v;
            q = e;
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        muser_error err = {0};
        int rc = muser_tokenize(tok, text, len, false, false, &ids, &n_ids, &err);
        CHECKF(rc == 0, "tokenize case %d: %s", cases, err.msg);
        bool same = rc == 0 && n_ids == n_want && (n_ids == 0 || !memcmp(ids, want, n_ids * 4));
        CHECKF(same, "case %d (%.*s): %zu ids, want %zu", cases, (int)(len > 40 ? 40 : len), text,
               n_ids, n_want);
        free(ids);
        cases++;
        p = line_end + 1;
    }
    CHECKF(cases >= 30, "only %d tokenizer cases parsed", cases);
    printf("tokenizer: %d cases match Hugging Face tokenizers\n", cases);
    free(buf);
}

int main(void)
{
    const char *dir = getenv("MUSER_SOURCE_DIR");
    if (!dir)
        dir = ".";
    char path[1024];
    snprintf(path, sizeof path, "%s/models/default.gguf", dir);
    muser_error err = {0};
    muser_model *m = NULL;
    if (muser_model_load(&m, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    muser_tokenizer *tok = NULL;
    CHECK_OK(muser_tokenizer_load(&tok, m->gguf, &err), &err);
    if (tok)
        check_tokenizer(dir, tok);

    /* the reference belongs to these exact weights */
    char sha[65];
    muser_sha256_hex(m->gguf->map, m->gguf->size, sha);
    snprintf(path, sizeof path, "%s/tests/data/ref_logits.txt", dir);
    size_t n_txt, n_bin;
    char *txt = check_read_file(path, &n_txt);
    snprintf(path, sizeof path, "%s/tests/data/ref_logits.bin", dir);
    char *bin = check_read_file(path, &n_bin);
    CHECK(txt && bin);
    if (!txt || !bin)
        return check_report("trained_model");
    CHECKF(strstr(txt, sha) != NULL, "models/default.gguf (sha256 %s) is not the model the "
                                     "reference was computed for: rerun tools/train/reference.py",
           sha);
    const uint32_t V = m->hp.n_vocab;
    double *la = malloc(sizeof(double) * V), *lb = malloc(sizeof(double) * V);
    const float *ref = (const float *)bin;
    size_t ref_rows = n_bin / (sizeof(float) * V);

    /* The CPU engine's routes are checked against the same data by test_cpu_trained.c. */
    const muser_backend_kind kinds[] = {MUSER_BACKEND_ORACLE};
    for (int b = 0; b < (int)(sizeof kinds / sizeof kinds[0]); b++) {
        size_t row = 0;
        double worst = 0;
        int top1_bad = 0;
        for (char *line = strstr(txt, "\nids "); line; line = strstr(line + 1, "\nids ")) {
            int32_t ids[1024];
            uint32_t n = 0;
            for (char *q = line + 5; *q && *q != '\n' && n < 1024;) {
                char *e;
                long v = strtol(q, &e, 10);
                if (e == q)
                    break;
                ids[n++] = (int32_t)v;
                q = e;
            }
            CHECK(row + n <= ref_rows);
            if (row + n > ref_rows)
                break;
            muser_session_opts o = {.backend = kinds[b], .n_ctx = n};
            muser_session *s = NULL;
            CHECK_OK(muser_session_new(&s, m, &o, &err), &err);
            float *logits = malloc(sizeof(float) * V * n);
            CHECK_OK(muser_session_forward(s, ids, n, logits, true, &err), &err);
            for (uint32_t p = 0; p < n; p++) {
                const float *r = ref + (row + p) * V;
                log_softmax(r, V, la);
                log_softmax(logits + (size_t)p * V, V, lb);
                uint32_t t1 = 0, t2 = 1, g1 = 0;
                for (uint32_t i = 0; i < V; i++) {
                    double d = fabs(la[i] - lb[i]);
                    worst = d > worst ? d : worst;
                    if (r[i] > r[t1]) {
                        t2 = t1;
                        t1 = i;
                    } else if (i != t1 && r[i] > r[t2]) {
                        t2 = i;
                    }
                    if (logits[(size_t)p * V + i] > logits[(size_t)p * V + g1])
                        g1 = i;
                }
                if (r[t1] - r[t2] > 1e-3f && g1 != t1)
                    top1_bad++;
            }
            row += n;
            free(logits);
            muser_session_free(s);
        }
        printf("%s vs PyTorch: %zu positions, max |d log_softmax| = %.3e, top-1 mismatches %d\n",
               muser_backend_name(kinds[b]), row, worst, top1_bad);
        CHECK(row == ref_rows);
        CHECKF(worst <= 1e-3, "%s: max |d log_softmax| %.3e > 1e-3", muser_backend_name(kinds[b]),
               worst);
        CHECK(top1_bad == 0);
    }
    free(la);
    free(lb);
    free(txt);
    free(bin);
    muser_tokenizer_free(tok);
    muser_model_free(m);
    return check_report("trained_model");
}
