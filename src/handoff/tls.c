/* tls.c — mutual TLS 1.3 connections with a timeout on every wait, and frame sealing (tls.h). */
#include "handoff/tls.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* OpenSSL's queued errors of this thread, oldest first, as one line (the queue is emptied). */
static const char *ssl_errors(char *buf, size_t cap)
{
    buf[0] = 0;
    size_t used = 0;
    unsigned long e;
    while ((e = ERR_get_error()) != 0 && used + 8 < cap) {
        char one[256];
        ERR_error_string_n(e, one, sizeof one);
        /* "error:0A000418:SSL routines::tlsv1 alert unknown ca": the reason is the last field */
        const char *reason = strrchr(one, ':');
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", reason ? reason + 1 : one);
    }
    if (!buf[0])
        snprintf(buf, cap, "no detail from OpenSSL");
    return buf;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int load_key(hx_auth *a, const char *path, muser_error *err)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return muser_errorf(err, MUSER_E_IO, "HMAC key %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return muser_errorf(err, MUSER_E_IO, "HMAC key %s: not a regular file", path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return muser_errorf(err, MUSER_E_ARG, "HMAC key %s is readable by others (mode %03o): chmod 600 it", path,
                            (unsigned)(st.st_mode & 0777));
    }
    uint8_t buf[HX_KEY_MAX + 1];
    size_t n = 0;
    for (;;) {
        const ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == sizeof buf)
            break;
    }
    close(fd);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--; /* a trailing newline is the editor's, not the key's */
    if (n > HX_KEY_MAX || n < HX_KEY_MIN) {
        OPENSSL_cleanse(buf, sizeof buf);
        return muser_errorf(err, MUSER_E_ARG, "HMAC key %s holds %s%zu bytes; %u..%u wanted (e.g. openssl rand -hex 32)",
                            path, n > HX_KEY_MAX ? "more than " : "", n > HX_KEY_MAX ? (size_t)HX_KEY_MAX : n,
                            HX_KEY_MIN, HX_KEY_MAX);
    }
    memcpy(a->key, buf, n);
    a->key_len = n;
    OPENSSL_cleanse(buf, sizeof buf);
    return MUSER_OK;
}

int hx_auth_load(hx_auth *a, const char *tls_dir, const char *key_file, bool server, muser_error *err)
{
    memset(a, 0, sizeof *a);
    a->server = server;
    if (!tls_dir || !key_file)
        return muser_errorf(err, MUSER_E_ARG, "handoff: a TLS directory and an HMAC key file are both needed");
    char ca[4096], cert[4096], key[4096], why[512];
    snprintf(ca, sizeof ca, "%s/ca.pem", tls_dir);
    snprintf(cert, sizeof cert, "%s/cert.pem", tls_dir);
    snprintf(key, sizeof key, "%s/key.pem", tls_dir);
    const char *files[3] = {ca, cert, key};
    for (int i = 0; i < 3; i++)
        if (!file_exists(files[i]))
            return muser_errorf(err, MUSER_E_IO, "TLS directory %s: %s is missing (ca.pem, cert.pem and key.pem wanted)",
                                tls_dir, files[i]);
    int rc = load_key(a, key_file, err);
    if (rc)
        return rc;
    ERR_clear_error();
    a->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    const char *step = "context";
    bool ok = a->ctx != NULL;
    ok = ok && (step = "TLS 1.3 only", SSL_CTX_set_min_proto_version(a->ctx, TLS1_3_VERSION) == 1 &&
                                           SSL_CTX_set_max_proto_version(a->ctx, TLS1_3_VERSION) == 1);
    ok = ok && (step = cert, SSL_CTX_use_certificate_chain_file(a->ctx, cert) == 1);
    ok = ok && (step = key, SSL_CTX_use_PrivateKey_file(a->ctx, key, SSL_FILETYPE_PEM) == 1);
    ok = ok && (step = "the key does not match the certificate", SSL_CTX_check_private_key(a->ctx) == 1);
    /* the pinned CA is the only trust anchor: no system store */
    ok = ok && (step = ca, SSL_CTX_load_verify_locations(a->ctx, ca, NULL) == 1);
    if (ok && server) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(ca);
        ok = (step = ca, names != NULL);
        if (ok)
            SSL_CTX_set_client_CA_list(a->ctx, names);
    }
    if (!ok) {
        rc = muser_errorf(err, MUSER_E_IO, "TLS setup (%s): %s", step, ssl_errors(why, sizeof why));
        hx_auth_free(a);
        return rc;
    }
    SSL_CTX_set_verify(a->ctx, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_verify_depth(a->ctx, 4);
    /* every connection a full handshake with both certificates: no tickets, no session cache */
    SSL_CTX_set_session_cache_mode(a->ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(a->ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
    if (server)
        SSL_CTX_set_num_tickets(a->ctx, 0);
    return MUSER_OK;
}

void hx_auth_free(hx_auth *a)
{
    SSL_CTX_free(a->ctx);
    OPENSSL_cleanse(a->key, sizeof a->key);
    memset(a, 0, sizeof *a);
}

/* ---- waiting ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Wait until fd is ready for events or the timeout passes (a stalled peer). */
static int wait_fd(hx_conn *c, short events, const char *what, muser_error *err)
{
    const double until = now_ms() + c->timeout_ms;
    for (;;) {
        const double left = until - now_ms();
        struct pollfd p = {.fd = c->fd, .events = events};
        const int r = left > 0 ? poll(&p, 1, (int)(left + 1)) : 0;
        if (r > 0)
            return MUSER_OK;
        if (r < 0 && errno == EINTR && c->interrupt && *c->interrupt)
            return muser_errorf(err, MUSER_E_INTERRUPTED, "%s: interrupted while %s %s", c->peer,
                                events & POLLIN ? "reading" : "writing", what);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return muser_errorf(err, MUSER_E_IO, "%s: poll: %s", c->peer, strerror(errno));
        return muser_errorf(err, MUSER_E_IO, "%s: nothing %s for %u ms while %s %s (timeout: a stalled peer)", c->peer,
                            events & POLLIN ? "arrived" : "could be sent", c->timeout_ms,
                            events & POLLIN ? "reading" : "writing", what);
    }
}

/* An SSL call that did not succeed: wait and retry (0), or the error (< 0). */
static int ssl_retry_or_fail(hx_conn *c, int r, const char *doing, const char *what, muser_error *err)
{
    const int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return wait_fd(c, POLLIN, what, err);
    if (e == SSL_ERROR_WANT_WRITE)
        return wait_fd(c, POLLOUT, what, err);
    char why[512];
    if (e == SSL_ERROR_ZERO_RETURN)
        return muser_errorf(err, MUSER_E_IO, "%s closed the connection while we were %s %s (an early close)", c->peer,
                            doing, what);
    if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
        return muser_errorf(err, MUSER_E_IO, "%s: the connection ended while we were %s %s (%s)", c->peer, doing, what,
                            errno && errno != EAGAIN ? strerror(errno) : "closed without a TLS close_notify: an early close");
    const long v = SSL_get_verify_result(c->ssl);
    ssl_errors(why, sizeof why);
    if (v != X509_V_OK)
        return muser_errorf(err, MUSER_E_IO, "%s: TLS while %s %s: %s (the peer's certificate: %s)", c->peer, doing,
                            what, why, X509_verify_cert_error_string(v));
    return muser_errorf(err, MUSER_E_IO, "%s: TLS while %s %s: %s", c->peer, doing, what, why);
}

/* Exactly n bytes in (or out), waiting whenever TLS asks to. */
static int ssl_io(hx_conn *c, uint8_t *p, size_t n, bool out, const char *what, muser_error *err)
{
    size_t done = 0;
    ERR_clear_error();
    while (done < n) {
        size_t k = 0;
        const int r = out ? SSL_write_ex(c->ssl, p + done, n - done, &k) : SSL_read_ex(c->ssl, p + done, n - done, &k);
        if (r == 1) {
            done += k;
            *(out ? &c->bytes_out : &c->bytes_in) += k;
            continue;
        }
        const int rc = ssl_retry_or_fail(c, r, out ? "writing" : "reading", what, err);
        if (rc)
            return rc;
    }
    return MUSER_OK;
}

int hx_read(hx_conn *c, void *buf, size_t n, const char *what, muser_error *err)
{
    return ssl_io(c, buf, n, false, what, err);
}

int hx_write(hx_conn *c, const void *buf, size_t n, const char *what, muser_error *err)
{
    return ssl_io(c, (uint8_t *)buf, n, true, what, err);
}

/* ---- connections ---- */

static void set_socket_options(int fd)
{
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small frames (request, end) go at once */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* The handshake on c->fd, then the peer's name from its verified certificate. */
static int handshake(hx_conn *c, const hx_auth *a, muser_error *err)
{
    c->ssl = SSL_new(a->ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1)
        return muser_errorf(err, MUSER_E_NOMEM, "%s: cannot start TLS", c->peer);
    ERR_clear_error();
    for (;;) {
        const int r = a->server ? SSL_accept(c->ssl) : SSL_connect(c->ssl);
        if (r == 1)
            break;
        const int rc = ssl_retry_or_fail(c, r, "doing", "the TLS handshake", err);
        if (rc)
            return rc;
    }
    X509 *peer = SSL_get1_peer_certificate(c->ssl);
    const long v = SSL_get_verify_result(c->ssl);
    if (!peer || v != X509_V_OK) {
        X509_free(peer);
        return muser_errorf(err, MUSER_E_IO, "%s: the peer's certificate %s", c->peer,
                            peer ? X509_verify_cert_error_string(v) : "is missing");
    }
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, c->peer_cn, sizeof c->peer_cn) < 0)
        snprintf(c->peer_cn, sizeof c->peer_cn, "(no common name)");
    X509_free(peer);
    return MUSER_OK;
}

int hx_connect(hx_conn *c, const hx_auth *a, const char *host, uint16_t port, uint32_t timeout_ms,
               volatile sig_atomic_t *interrupt, muser_error *err)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->timeout_ms = timeout_ms;
    c->interrupt = interrupt;
    snprintf(c->peer, sizeof c->peer, "%s:%u", host, port);
    char service[16];
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    const int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0)
        return muser_errorf(err, MUSER_E_IO, "%s: cannot resolve the host: %s", c->peer, gai_strerror(g));
    int rc = MUSER_E_IO; /* the message comes with the attempt that failed, or below */
    bool tried = false;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        c->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (c->fd < 0)
            continue;
        tried = true;
        set_socket_options(c->fd);
        int r = connect(c->fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            rc = wait_fd(c, POLLOUT, "the TCP connection", err);
            int so = 0;
            socklen_t len = sizeof so;
            if (!rc && getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &len) == 0 && so == 0)
                r = 0;
            else if (!rc)
                rc = muser_errorf(err, MUSER_E_IO, "%s: cannot connect: %s", c->peer, strerror(so));
        } else if (r != 0) {
            rc = muser_errorf(err, MUSER_E_IO, "%s: cannot connect: %s", c->peer, strerror(errno));
        }
        if (r == 0) {
            rc = MUSER_OK;
            break;
        }
        close(c->fd);
        c->fd = -1;
    }
    freeaddrinfo(res);
    if (rc && !tried)
        muser_errorf(err, MUSER_E_IO, "%s: no address to connect to: %s", c->peer, strerror(errno));
    if (!rc)
        rc = handshake(c, a, err);
    if (rc)
        hx_close(c);
    return rc;
}

int hx_accept(hx_conn *c, const hx_auth *a, int fd, const char *peer, uint32_t timeout_ms, muser_error *err)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->timeout_ms = timeout_ms;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    set_socket_options(fd);
    return handshake(c, a, err);
}

void hx_close(hx_conn *c)
{
    if (c->ssl) {
        ERR_clear_error();
        if (SSL_is_init_finished(c->ssl))
            SSL_shutdown(c->ssl); /* one try: non-blocking, nobody waits for the peer's reply */
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    if (c->fd >= 0)
        close(c->fd);
    c->ssl = NULL;
    c->fd = -1;
}

void hx_linger(hx_conn *c, uint32_t ms)
{
    if (c->ssl) {
        ERR_clear_error();
        if (SSL_is_init_finished(c->ssl))
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        ERR_clear_error();
        c->ssl = NULL;
    }
    if (c->fd >= 0 && shutdown(c->fd, SHUT_WR) == 0) {
        const double until = now_ms() + ms;
        char sink[4096];
        size_t dropped = 0;
        for (double left; (left = until - now_ms()) > 0 && dropped < (1u << 20);) {
            struct pollfd p = {.fd = c->fd, .events = POLLIN};
            if (poll(&p, 1, (int)left + 1) <= 0) break;
            const ssize_t r = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (r <= 0) break;
            dropped += (size_t)r;
        }
    }
}

/* ---- frames ---- */

uint64_t hx_frame_bytes(uint16_t type, uint32_t len)
{
    return HX_HEADER_BYTES + (uint64_t)len + (type == HX_REFUSE ? 0 : HX_MAC_BYTES);
}

void hx_frame_seal(const hx_auth *a, const uint8_t sid[HX_ID_BYTES], uint16_t type, uint32_t index, uint8_t *frame,
                   uint32_t len)
{
    const hx_header h = {.type = type, .index = index, .length = len};
    hx_header_encode(&h, frame);
    if (type != HX_REFUSE)
        hx_mac(a->key, a->key_len, sid, frame, frame + HX_HEADER_BYTES, len, frame + HX_HEADER_BYTES + len);
}

int hx_frame_send(hx_conn *c, const hx_auth *a, const uint8_t sid[HX_ID_BYTES], uint16_t type, uint32_t index,
                  uint8_t *frame, uint32_t len, muser_error *err)
{
    hx_frame_seal(a, sid, type, index, frame, len);
    char what[64];
    snprintf(what, sizeof what, "the %s frame %u", hx_type_name(type), index);
    return hx_write(c, frame, hx_frame_bytes(type, len), what, err);
}

void hx_send_refusal(hx_conn *c, const char *reason)
{
    uint8_t frame[HX_HEADER_BYTES + HX_REFUSE_MAX];
    size_t n = strlen(reason);
    if (n > HX_REFUSE_MAX)
        n = HX_REFUSE_MAX;
    memcpy(frame + HX_HEADER_BYTES, reason, n);
    const hx_header h = {.type = HX_REFUSE, .length = (uint32_t)n};
    hx_header_encode(&h, frame);
    muser_error ignored;
    hx_write(c, frame, HX_HEADER_BYTES + n, "a refusal", &ignored);
}

int hx_read_refusal(hx_conn *c, uint32_t len, char *out, size_t cap, muser_error *err)
{
    char buf[HX_REFUSE_MAX];
    if (len > HX_REFUSE_MAX)
        return muser_errorf(err, MUSER_E_FORMAT, "%s: a refusal of %u bytes (at most %u)", c->peer, len, HX_REFUSE_MAX);
    const int rc = hx_read(c, buf, len, "a refusal", err);
    if (rc)
        return rc;
    size_t k = 0;
    for (uint32_t i = 0; i < len && k + 1 < cap; i++) /* one printable line, whatever was sent */
        out[k++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
    out[k] = 0;
    return MUSER_OK;
}

void hx_sigpipe_block(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

void hx_sigpipe_restore(const sigset_t *old)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) && !sigismember(old, SIGPIPE)) {
        const struct timespec zero = {0, 0};
        sigtimedwait(&set, NULL, &zero); /* the one our writes raised */
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}
