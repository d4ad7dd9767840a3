/* tls.h — the handoff's transport: mutually authenticated TLS 1.3 and frame I/O with a timeout
 * on every read and write.
 *
 * Credentials (hx_auth): a directory holding ca.pem (the one CA trusted: nothing else is), the
 * role's cert.pem and key.pem, and the HMAC key shared by producer and consumer (a file of at
 * least 32 bytes, readable by its owner only). Both roles verify the peer's chain against the
 * pinned CA and refuse a peer without a certificate; TLS 1.3 only; no session resumption, so every
 * connection presents its certificates. Sockets are non-blocking and every wait is a poll() with
 * the connection's timeout: a peer that sends nothing for that long ends the connection with an
 * error naming what was being read. */
#ifndef MUSER_HANDOFF_TLS_H
#define MUSER_HANDOFF_TLS_H

#include "handoff/wire.h"

#include <openssl/ssl.h>
#include <signal.h>

#define HX_KEY_MIN 32u
#define HX_KEY_MAX 1024u

typedef struct hx_auth {
    SSL_CTX *ctx;
    bool server;
    uint8_t key[HX_KEY_MAX];
    size_t key_len;
} hx_auth;

/* Load DIR/ca.pem, DIR/cert.pem, DIR/key.pem and the key file; server: the producer's side. */
int hx_auth_load(hx_auth *a, const char *tls_dir, const char *key_file, bool server, muser_error *err);
void hx_auth_free(hx_auth *a);

typedef struct hx_conn {
    int fd;
    SSL *ssl;
    uint32_t timeout_ms;
    char peer[96];               /* "HOST:PORT" */
    char peer_cn[96];            /* the peer certificate's common name, once verified */
    uint64_t bytes_in, bytes_out;
    volatile sig_atomic_t *interrupt; /* set (by a signal handler): a wait ends MUSER_E_INTERRUPTED */
} hx_conn;

/* TCP connect and TLS handshake, each within timeout_ms; the producer's chain verified. */
int hx_connect(hx_conn *c, const hx_auth *a, const char *host, uint16_t port, uint32_t timeout_ms,
               volatile sig_atomic_t *interrupt, muser_error *err);
/* The handshake on an accepted socket, which c takes over: hx_close it whatever this returns. */
int hx_accept(hx_conn *c, const hx_auth *a, int fd, const char *peer, uint32_t timeout_ms, muser_error *err);
/* Exactly n bytes, each wait at most the timeout. what names the data in errors. */
int hx_read(hx_conn *c, void *buf, size_t n, const char *what, muser_error *err);
int hx_write(hx_conn *c, const void *buf, size_t n, const char *what, muser_error *err);
/* close_notify (best effort, no wait), then free. Safe on a zeroed or closed hx_conn. */
void hx_close(hx_conn *c);
/* Before the producer's hx_close: close_notify and our side shut, then what the peer still sends
 * read and dropped until it closes too (at most ms). Closing with its bytes unread would reset the
 * connection, and the reset would destroy the TLS alert or refusal that says why before the peer
 * reads it. The socket stays open for hx_close. */
void hx_linger(hx_conn *c, uint32_t ms);

/* Frames. A frame buffer is [header][len payload bytes][HX_MAC_BYTES]: hx_frame_seal fills the
 * header and the MAC (REFUSE: no MAC); hx_frame_send seals and writes it in one TLS write. */
uint64_t hx_frame_bytes(uint16_t type, uint32_t len);
void hx_frame_seal(const hx_auth *a, const uint8_t sid[HX_ID_BYTES], uint16_t type, uint32_t index, uint8_t *frame,
                   uint32_t len);
int hx_frame_send(hx_conn *c, const hx_auth *a, const uint8_t sid[HX_ID_BYTES], uint16_t type, uint32_t index,
                  uint8_t *frame, uint32_t len, muser_error *err);
/* A refusal: the reason text, no MAC (best effort: errors are ignored). */
void hx_send_refusal(hx_conn *c, const char *reason);
/* A refusal's payload (len <= HX_REFUSE_MAX) read and turned into one printable line. */
int hx_read_refusal(hx_conn *c, uint32_t len, char *out, size_t cap, muser_error *err);

/* SIGPIPE blocked in this thread for the life of a connection (a peer that resets must not kill
 * the process); restore consumes a SIGPIPE raised meanwhile and restores the mask. */
void hx_sigpipe_block(sigset_t *old);
void hx_sigpipe_restore(const sigset_t *old);

#endif
