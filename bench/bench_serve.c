/* bench_serve.c — a load generator for `muser serve`: a fixed number of streaming completions at a
 * fixed concurrency over loopback HTTP/1.1, each its own connection; reports aggregate generated
 * tok/s, time to first token, inter-token latency and end-to-end latency (p50 / p99). Exits 1 if
 * any request does not end with a 200, a usage event and [DONE].
 *
 *   bench_serve --port P [--host 127.0.0.1] [--requests 32] [--concurrency 8] [--max-tokens 64]
 *               [--prompt TEXT | --prompt-file F] [--temperature 0.8] [--top-p 1] [--api-key KEY]
 *
 * The seed of request i is i, so a run's requests are the same from run to run. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    const char *host, *key;
    int port;
    uint32_t requests, concurrency, max_tokens;
    double temperature, top_p;
    char *prompt_json; /* the prompt as a JSON string, quotes included */
} opts;

typedef struct result {
    bool ok;
    double t0, ttft, e2e;
    uint32_t tokens;   /* usage.completion_tokens */
    double *gaps;      /* between content events after the first */
    uint32_t n_gaps;
    char err[160];
} result;

static opts g_o;
static result *g_res;
static atomic_uint g_next;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *json_string(const char *s)
{
    size_t n = strlen(s), k = 0;
    char *o = malloc(6 * n + 3);
    if (!o) return NULL;
    o[k++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            o[k++] = '\\';
            o[k++] = (char)*p;
        } else if (*p < 0x20) {
            k += (size_t)sprintf(o + k, "\\u%04x", *p);
        } else {
            o[k++] = (char)*p;
        }
    }
    o[k++] = '"';
    o[k] = 0;
    return o;
}

/* The body's bytes as they arrive (chunked transfer decoding), split into SSE lines. */
typedef struct stream {
    result *r;
    bool chunked, in_data, done, usage;
    uint64_t chunk_left; /* bytes of the current chunk still to come */
    char line[1 << 16];
    size_t n_line;
    double last;
    uint32_t events, cap_gaps;
} stream;

static void on_line(stream *st, const char *l)
{
    if (strncmp(l, "data: ", 6)) return;
    l += 6;
    if (!strcmp(l, "[DONE]")) {
        st->done = true;
        return;
    }
    const char *u = strstr(l, "\"completion_tokens\":");
    if (u && strstr(l, "\"usage\":{")) {
        st->r->tokens = (uint32_t)strtoul(u + 20, NULL, 10);
        st->usage = true;
    }
    if (!strstr(l, "\"text\":")) return; /* the usage event has no choices */
    const double t = now();
    if (!st->events++) {
        st->r->ttft = t - st->r->t0;
    } else {
        if (st->r->n_gaps == st->cap_gaps) {
            st->cap_gaps = st->cap_gaps ? 2 * st->cap_gaps : 64;
            st->r->gaps = realloc(st->r->gaps, st->cap_gaps * sizeof *st->r->gaps);
        }
        st->r->gaps[st->r->n_gaps++] = t - st->last;
    }
    st->last = t;
}

static void body_bytes(stream *st, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            if (st->n_line && st->line[st->n_line - 1] == '\r') st->n_line--;
            st->line[st->n_line] = 0;
            on_line(st, st->line);
            st->n_line = 0;
        } else if (st->n_line + 1 < sizeof st->line) {
            st->line[st->n_line++] = p[i];
        }
    }
}

/* Raw bytes after the headers: strip the chunked framing (size line, data, CRLF). */
typedef struct dechunk {
    int state; /* 0: size line, 1: data, 2: CRLF after data */
    char size[32];
    size_t n_size;
} dechunk;

static void raw_bytes(stream *st, dechunk *d, const char *p, size_t n)
{
    if (!st->chunked) {
        body_bytes(st, p, n);
        return;
    }
    size_t i = 0;
    while (i < n) {
        if (d->state == 0) {
            if (p[i] == '\n') {
                d->size[d->n_size] = 0;
                st->chunk_left = strtoull(d->size, NULL, 16);
                d->n_size = 0;
                d->state = st->chunk_left ? 1 : 3;
            } else if (p[i] != '\r' && d->n_size + 1 < sizeof d->size) {
                d->size[d->n_size++] = p[i];
            }
            i++;
        } else if (d->state == 1) {
            size_t take = n - i < st->chunk_left ? n - i : (size_t)st->chunk_left;
            body_bytes(st, p + i, take);
            st->chunk_left -= take;
            i += take;
            if (!st->chunk_left) d->state = 2;
        } else if (d->state == 2) {
            if (p[i] == '\n') d->state = 0;
            i++;
        } else {
            i = n; /* the last chunk: trailers follow */
        }
    }
}

static void run_one(uint32_t idx, result *r)
{
    char body[1 << 17];
    const int bn = snprintf(body, sizeof body,
                            "{\"prompt\":%s,\"max_tokens\":%u,\"temperature\":%g,\"top_p\":%g,\"seed\":%u,"
                            "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                            g_o.prompt_json, g_o.max_tokens, g_o.temperature, g_o.top_p, idx);
    if (bn < 0 || (size_t)bn >= sizeof body) {
        snprintf(r->err, sizeof r->err, "the prompt is too long for a request");
        return;
    }
    char head[512];
    char auth[300] = "";
    if (g_o.key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", g_o.key);
    const int hn = snprintf(head, sizeof head,
                            "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                            "%sContent-Length: %d\r\nConnection: close\r\n\r\n",
                            g_o.host, g_o.port, auth, bn);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_o.port);
    if (inet_pton(AF_INET, g_o.host, &a.sin_addr) != 1) {
        snprintf(r->err, sizeof r->err, "--host wants an IPv4 address");
        return;
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    r->t0 = now();
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        snprintf(r->err, sizeof r->err, "connect: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    if (write(fd, head, (size_t)hn) != hn || write(fd, body, (size_t)bn) != bn) {
        snprintf(r->err, sizeof r->err, "write: %s", strerror(errno));
        close(fd);
        return;
    }
    stream *st = calloc(1, sizeof *st);
    dechunk d = {0};
    st->r = r;
    char buf[8192], hdr[8192];
    size_t n_hdr = 0;
    bool in_body = false;
    int status = 0;
    for (;;) {
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        size_t off = 0;
        if (!in_body) {
            while (off < (size_t)n && n_hdr + 1 < sizeof hdr) {
                hdr[n_hdr++] = buf[off++];
                if (n_hdr >= 4 && !memcmp(hdr + n_hdr - 4, "\r\n\r\n", 4)) {
                    hdr[n_hdr] = 0;
                    in_body = true;
                    sscanf(hdr, "HTTP/1.%*d %d", &status);
                    for (char *c = hdr; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
                    st->chunked = strstr(hdr, "transfer-encoding: chunked") != NULL;
                    break;
                }
            }
        }
        if (in_body && off < (size_t)n) raw_bytes(st, &d, buf + off, (size_t)n - off);
    }
    close(fd);
    r->e2e = now() - r->t0;
    if (status != 200)
        snprintf(r->err, sizeof r->err, "HTTP status %d", status);
    else if (!st->done || !st->usage)
        snprintf(r->err, sizeof r->err, "the stream ended without %s", st->usage ? "[DONE]" : "a usage event");
    else
        r->ok = true;
    free(st);
}

static void *worker(void *arg)
{
    (void)arg;
    for (;;) {
        const uint32_t i = atomic_fetch_add(&g_next, 1);
        if (i >= g_o.requests) return NULL;
        run_one(i, &g_res[i]);
    }
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t k = (size_t)(p * (double)(n - 1) + 0.5);
    return v[k];
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_serve --port P [--host 127.0.0.1] [--requests 32] [--concurrency 8] [--max-tokens 64]\n"
               "                   [--prompt TEXT | --prompt-file F] [--temperature 0.8] [--top-p 1] [--api-key KEY]\n"
               "Streams completions from a running `muser serve` and reports aggregate tok/s, TTFT,\n"
               "inter-token and end-to-end latency. Exit 1 when any request fails.\n");
}

int main(int argc, char **argv)
{
    g_o = (opts){.host = "127.0.0.1", .requests = 32, .concurrency = 8, .max_tokens = 64, .temperature = 0.8, .top_p = 1.0};
    const char *prompt = "In the beginning", *prompt_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "bench_serve: %s wants a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--host")) g_o.host = v;
        else if (!strcmp(a, "--port")) g_o.port = atoi(v);
        else if (!strcmp(a, "--requests")) g_o.requests = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--concurrency")) g_o.concurrency = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--max-tokens")) g_o.max_tokens = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--temperature")) g_o.temperature = atof(v);
        else if (!strcmp(a, "--top-p")) g_o.top_p = atof(v);
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--prompt-file")) prompt_file = v;
        else if (!strcmp(a, "--api-key")) g_o.key = v;
        else {
            fprintf(stderr, "bench_serve: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (g_o.port <= 0 || g_o.port > 65535 || !g_o.requests || !g_o.concurrency || !g_o.max_tokens) {
        fprintf(stderr, "bench_serve: --port, --requests, --concurrency and --max-tokens want positive numbers\n");
        return 2;
    }
    char *text = NULL;
    if (prompt_file) {
        FILE *f = fopen(prompt_file, "rb");
        if (!f) {
            fprintf(stderr, "bench_serve: cannot open %s: %s\n", prompt_file, strerror(errno));
            return 2;
        }
        fseek(f, 0, SEEK_END);
        const long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc((size_t)n + 1);
        if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
            fprintf(stderr, "bench_serve: cannot read %s\n", prompt_file);
            return 2;
        }
        text[n] = 0;
        fclose(f);
        prompt = text;
    }
    g_o.prompt_json = json_string(prompt);
    g_res = calloc(g_o.requests, sizeof *g_res);
    if (g_o.concurrency > g_o.requests) g_o.concurrency = g_o.requests;
    pthread_t *th = malloc(g_o.concurrency * sizeof *th);
    const double t0 = now();
    for (uint32_t i = 0; i < g_o.concurrency; i++) pthread_create(&th[i], NULL, worker, NULL);
    for (uint32_t i = 0; i < g_o.concurrency; i++) pthread_join(th[i], NULL);
    const double wall = now() - t0;

    uint32_t ok = 0;
    uint64_t tokens = 0;
    size_t n_gaps = 0;
    for (uint32_t i = 0; i < g_o.requests; i++) n_gaps += g_res[i].n_gaps;
    double *ttft = malloc(g_o.requests * sizeof *ttft), *e2e = malloc(g_o.requests * sizeof *e2e);
    double *gaps = malloc((n_gaps ? n_gaps : 1) * sizeof *gaps);
    size_t k = 0;
    for (uint32_t i = 0; i < g_o.requests; i++) {
        result *r = &g_res[i];
        if (!r->ok) {
            if (i < 5 || ok == 0) fprintf(stderr, "bench_serve: request %u: %s\n", i, r->err);
            free(r->gaps);
            continue;
        }
        ttft[ok] = r->ttft;
        e2e[ok] = r->e2e;
        ok++;
        tokens += r->tokens;
        memcpy(gaps + k, r->gaps, r->n_gaps * sizeof *gaps);
        k += r->n_gaps;
        free(r->gaps);
    }
    printf("requests %u of %u ok, concurrency %u, %llu tokens generated in %.2f s: %.1f tok/s aggregate\n", ok,
           g_o.requests, g_o.concurrency, (unsigned long long)tokens, wall, (double)tokens / wall);
    printf("ttft p50 %.1f ms p99 %.1f ms | inter-token p50 %.2f ms p99 %.2f ms | e2e p50 %.0f ms p99 %.0f ms\n",
           1e3 * pct(ttft, ok, 0.5), 1e3 * pct(ttft, ok, 0.99), 1e3 * pct(gaps, k, 0.5), 1e3 * pct(gaps, k, 0.99),
           1e3 * pct(e2e, ok, 0.5), 1e3 * pct(e2e, ok, 0.99));
    free(ttft);
    free(e2e);
    free(gaps);
    free(th);
    free(g_res);
    free(g_o.prompt_json);
    free(text);
    return ok == g_o.requests ? 0 : 1;
}
