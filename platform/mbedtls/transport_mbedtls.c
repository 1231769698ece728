/* dprec — the mbedTLS transport (dprec/transport_mbedtls.h): one request at a time over one kept-alive TLS
 * connection, on the port's sockets (dprec_net) and entropy and clock (dprec_port).
 *
 * A request is: (re)connect if there is no connection, send the head and the body, feed what arrives to the HTTP/1.1
 * parser (http1.c), which hands the body to the caller's sink. A connection kept from an earlier request may have
 * been closed by the server meanwhile (an idle timeout); if it fails before a single byte of the answer arrived, the
 * request is sent once more on a fresh connection. That may deliver a POST twice, which the protocol allows: a
 * report is idempotent by its id and a registration is answered again (docs/protocol.md).
 *
 * Trust (RFC 9525 for the name; RFC 7469 for the pin's form): mbedTLS verifies the chain and the host name; the
 * verification callback adds what mbedTLS 2.28 lacks, a numeric host matched against the certificate's iPAddress
 * names, and the pin, the SHA-256 of the leaf's SubjectPublicKeyInfo. A failed pin fails the handshake, so not a byte
 * of a request reaches a server that does not hold a pinned key.
 *
 * Failures: no connection, a reset, a close before the handshake ended, or a timeout -> DPREC_ERR_NETWORK; a
 * handshake that fails for any other reason (verification, pin, alert) -> DPREC_ERR_TLS; an answer that is not
 * HTTP/1.x -> DPREC_ERR_NETWORK (as libcurl's transport: retried later); the sink's own code when the sink stops the
 * body. */
#include "dprec/transport_mbedtls.h"

#include <string.h>

#include <mbedtls/version.h>
#include <mbedtls/asn1.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/platform.h>
#include <mbedtls/platform_util.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>
#if MBEDTLS_VERSION_NUMBER >= 0x03000000 && defined(MBEDTLS_PSA_CRYPTO_C)
#include <psa/crypto.h>
#endif

#include "abi.h"
#include "dprec/dprec.h"
#include "http1.h"
#include "mbedtls_compat.h"

#if !defined(MBEDTLS_SSL_CLI_C) || !defined(MBEDTLS_X509_CRT_PARSE_C) || !defined(MBEDTLS_PK_WRITE_C)
#error "the mbedTLS transport needs an mbedTLS built with SSL_CLI, X509_CRT_PARSE and PK_WRITE"
#endif

#define MAX_PINS 8
#define MAX_HOST 254
#define MAX_PREFIX 256

typedef struct tls_impl {
    dprec_port port;
    dprec_net net;
    mbedtls_ssl_context ssl;
    mbedtls_ssl_config conf;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_x509_crt ca;
    void *sock;            /* the connection, or NULL */
    int used;              /* the TLS context carried a connection (reset it before the next) */
    uint64_t deadline;     /* of the current step, in the port's monotonic ms */
    int net_failed;        /* the sockets failed (or timed out) under the last TLS call */
    int pin_mismatch;
    uint32_t connect_timeout_ms, timeout_ms;
    char host[MAX_HOST];   /* without brackets */
    char host_header[MAX_HOST + 8];
    char prefix[MAX_PREFIX];
    uint16_t port_number;
    unsigned char ip[16];  /* the numeric host, if it is one */
    size_t ip_len;         /* 4, 16, or 0 for a name */
    unsigned char pins[MAX_PINS][32];
    size_t npins;
    unsigned char buf[4096]; /* the request's head, then the answer as it arrives */
    dprec_http1 http;
} tls_impl;

static void set_error(dprec_transport_mbedtls *st, int mbed_rc, const char *what) {
    size_t n = strlen(what);
    if (n >= sizeof st->errbuf) n = sizeof st->errbuf - 1;
    memcpy(st->errbuf, what, n);
    st->errbuf[n] = '\0';
    if (mbed_rc != 0) {
        st->last_tls_error = mbed_rc;
#if defined(MBEDTLS_ERROR_C)
        if (n + 3 < sizeof st->errbuf) {
            memcpy(st->errbuf + n, ": ", 3);
            mbedtls_strerror(mbed_rc, st->errbuf + n + 2, sizeof st->errbuf - n - 2);
        }
#endif
    }
}

static uint64_t now_ms(const tls_impl *x) {
    return x->port.monotonic_ms(x->port.ctx);
}

static uint32_t left_ms(const tls_impl *x) {
    uint64_t now = now_ms(x);
    if (now >= x->deadline) return 0;
    uint64_t left = x->deadline - now;
    return left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

/* ---- the sockets under TLS ------------------------------------------------------------------------------------ */

static int bio_send(void *ctx, const unsigned char *buf, size_t len) {
    tls_impl *x = ctx;
    uint32_t left = left_ms(x);
    size_t sent = 0;
    if (len > 16384) len = 16384;
    if (left == 0 || x->net.send(x->net.ctx, x->sock, buf, len, left, &sent) != DPREC_OK || sent == 0 || sent > len) {
        x->net_failed = 1;
        return MBEDTLS_ERR_NET_SEND_FAILED;
    }
    return (int)sent;
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len) {
    tls_impl *x = ctx;
    uint32_t left = left_ms(x);
    size_t got = 0;
    if (len > 16384) len = 16384;
    if (left == 0 || x->net.recv(x->net.ctx, x->sock, buf, len, left, &got) != DPREC_OK || got > len) {
        x->net_failed = 1;
        return left == 0 ? MBEDTLS_ERR_SSL_TIMEOUT : MBEDTLS_ERR_NET_RECV_FAILED;
    }
    return (int)got; /* 0: the peer closed */
}

static int drbg_entropy(void *ctx, unsigned char *buf, size_t len) {
    tls_impl *x = ctx;
    return x->port.entropy(x->port.ctx, buf, len) == DPREC_OK ? 0 : MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
}

/* ---- names and pins ------------------------------------------------------------------------------------------- */

static int parse_ipv4(const char *s, unsigned char out[4]) {
    int parts = 0;
    while (parts < 4) {
        unsigned v = 0, digits = 0;
        while (*s >= '0' && *s <= '9' && digits < 4) {
            v = v * 10u + (unsigned)(*s++ - '0');
            digits++;
        }
        if (digits == 0 || digits > 3 || v > 255) return -1;
        out[parts++] = (unsigned char)v;
        if (parts < 4 && *s++ != '.') return -1;
    }
    return *s == '\0' ? 0 : -1;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* RFC 4291 2.2: eight groups of hex, one run of zero groups as "::"; no embedded IPv4 form, no zone. */
static int parse_ipv6(const char *s, unsigned char out[16]) {
    uint16_t g[8];
    int n = 0, gap = -1;
    if (s[0] == ':' && s[1] == ':') {
        gap = 0;
        s += 2;
    }
    while (*s != '\0') {
        if (n == 8) return -1;
        unsigned v = 0;
        int digits = 0;
        while (hexval(*s) >= 0 && digits < 5) {
            v = v * 16u + (unsigned)hexval(*s++);
            digits++;
        }
        if (digits == 0 || digits > 4) return -1;
        g[n++] = (uint16_t)v;
        if (*s == '\0') break;
        if (*s++ != ':') return -1;
        if (*s == ':') {
            if (gap >= 0) return -1;
            gap = n;
            s++;
        } else if (*s == '\0') {
            return -1;
        }
    }
    if (gap < 0 ? n != 8 : n > 7) return -1;
    memset(out, 0, 16);
    int tail = gap < 0 ? 0 : n - gap;
    for (int i = 0; i < n; i++) {
        int at = (gap >= 0 && i >= gap) ? 8 - tail + (i - gap) : i;
        out[2 * at] = (unsigned char)(g[i] >> 8);
        out[2 * at + 1] = (unsigned char)(g[i] & 0xff);
    }
    return 0;
}

static int b64val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* "sha256//" and the 44 base64 characters of 32 bytes (one '=' of padding). */
static int parse_pin(const char *s, size_t n, unsigned char out[32]) {
    if (n != 8 + 44 || memcmp(s, "sha256//", 8) != 0 || s[8 + 43] != '=') return -1;
    s += 8;
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (int i = 0; i < 43; i++) {
        int v = b64val(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o < 32) out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1u;
        }
    }
    return o == 32 && acc == 0 ? 0 : -1; /* the two bits left over must be zero (canonical base64) */
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* "sha256//...;sha256//..." with whitespace around each pin ignored (tls-pin.txt ends with a newline). */
static int parse_pins(tls_impl *x, const char *s) {
    while (*s != '\0') {
        while (is_space(*s) || *s == ';') s++;
        if (*s == '\0') break;
        const char *end = s;
        while (*end != '\0' && *end != ';') end++;
        size_t n = (size_t)(end - s);
        while (n > 0 && is_space(s[n - 1])) n--;
        if (x->npins == MAX_PINS || parse_pin(s, n, x->pins[x->npins]) != 0) return -1;
        x->npins++;
        s = end;
    }
    return x->npins > 0 ? 0 : -1;
}

/* Skips one DER element of any tag. */
static int skip_element(unsigned char **p, const unsigned char *end) {
    size_t len;
    if (end - *p < 2) return -1;
    (*p)++;
    if (mbedtls_asn1_get_len(p, end, &len) != 0) return -1;
    *p += len;
    return 0;
}

/* Whether the certificate's subjectAltName extension lists the address ip[0 .. ip_len) (an iPAddress name, RFC 5280
 * 4.2.1.6). Read from the TBSCertificate itself: mbedTLS 2.28 keeps only the DNS names of the extension. */
static int cert_has_ip(const mbedtls_x509_crt *crt, const unsigned char *ip, size_t ip_len) {
    static const unsigned char san_oid[] = {0x55, 0x1d, 0x11}; /* 2.5.29.17 */
    unsigned char *p = crt->tbs.p, *end = crt->tbs.p + crt->tbs.len;
    size_t len;
    if (mbedtls_asn1_get_tag(&p, end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0) return 0;
    end = p + len;
    /* version [0] (optional), serial, signature, issuer, validity, subject, subjectPublicKeyInfo */
    if (p < end && *p == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_ASN1_CONSTRUCTED | 0) && skip_element(&p, end) != 0)
        return 0;
    for (int i = 0; i < 6; i++)
        if (skip_element(&p, end) != 0) return 0;
    while (p < end) { /* issuerUniqueID [1], subjectUniqueID [2], extensions [3] */
        if (*p != (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_ASN1_CONSTRUCTED | 3)) {
            if (skip_element(&p, end) != 0) return 0;
            continue;
        }
        p++;
        if (mbedtls_asn1_get_len(&p, end, &len) != 0) return 0;
        unsigned char *ext_end = p + len;
        if (mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0) return 0;
        ext_end = p + len;
        while (p < ext_end) {
            unsigned char *one_end;
            if (mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0) return 0;
            one_end = p + len;
            if (mbedtls_asn1_get_tag(&p, one_end, &len, MBEDTLS_ASN1_OID) != 0) return 0;
            int is_san = len == sizeof san_oid && memcmp(p, san_oid, len) == 0;
            p += len;
            if (!is_san) {
                p = one_end;
                continue;
            }
            int critical;
            if (p < one_end && *p == MBEDTLS_ASN1_BOOLEAN && mbedtls_asn1_get_bool(&p, one_end, &critical) != 0)
                return 0;
            if (mbedtls_asn1_get_tag(&p, one_end, &len, MBEDTLS_ASN1_OCTET_STRING) != 0) return 0;
            unsigned char *names_end = p + len;
            if (mbedtls_asn1_get_tag(&p, names_end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0)
                return 0;
            names_end = p + len;
            while (p < names_end) {
                unsigned char tag = *p++;
                if (mbedtls_asn1_get_len(&p, names_end, &len) != 0) return 0;
                if (tag == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | 7) && len == ip_len && memcmp(p, ip, ip_len) == 0) return 1;
                p += len;
            }
            return 0;
        }
        return 0;
    }
    return 0;
}

/* Whether the SHA-256 of the certificate's SubjectPublicKeyInfo is one of the pins. */
static int pin_matches(const tls_impl *x, mbedtls_x509_crt *crt) {
    unsigned char der[2048], digest[32];
    int n = mbedtls_pk_write_pubkey_der(&crt->pk, der, sizeof der); /* written at the end of der */
    if (n <= 0 || dprec_sha256(der + sizeof der - (size_t)n, (size_t)n, digest) != 0) return 0;
    int hit = 0;
    for (size_t i = 0; i < x->npins; i++) {
        unsigned char diff = 0;
        for (size_t k = 0; k < 32; k++) diff |= (unsigned char)(digest[k] ^ x->pins[i][k]);
        hit |= diff == 0;
    }
    return hit;
}

/* mbedTLS calls this for every certificate of the chain, the leaf last (depth 0). */
static int verify_cb(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags) {
    tls_impl *x = ctx;
    if (depth != 0) return 0;
    if ((*flags & MBEDTLS_X509_BADCERT_CN_MISMATCH) != 0 && x->ip_len > 0 && cert_has_ip(crt, x->ip, x->ip_len))
        *flags &= ~(uint32_t)MBEDTLS_X509_BADCERT_CN_MISMATCH;
    if (x->npins > 0 && !pin_matches(x, crt)) {
        x->pin_mismatch = 1;
        *flags |= MBEDTLS_X509_BADCERT_OTHER;
    }
    return 0;
}

/* ---- the connection ------------------------------------------------------------------------------------------- */

static void drop_connection(tls_impl *x, int polite) {
    if (x->sock == NULL) return;
    if (polite) {
        x->deadline = now_ms(x) + 1000u; /* a close_notify must not hold up the caller */
        (void)mbedtls_ssl_close_notify(&x->ssl);
    }
    x->net.close(x->net.ctx, x->sock);
    x->sock = NULL;
}

static int open_connection(dprec_transport_mbedtls *st, tls_impl *x, uint64_t request_deadline) {
    uint64_t now = now_ms(x);
    x->deadline = now + x->connect_timeout_ms;
    if (x->deadline > request_deadline) x->deadline = request_deadline;
    x->net_failed = 0;
    x->pin_mismatch = 0;
    uint32_t left = left_ms(x);
    if (left == 0 || x->net.connect(x->net.ctx, x->host, x->port_number, left, &x->sock) != DPREC_OK ||
        x->sock == NULL) {
        x->sock = NULL;
        set_error(st, 0, left == 0 ? "timed out before connecting" : "cannot connect");
        return DPREC_ERR_NETWORK;
    }
    int rc = 0;
    if (x->used) rc = mbedtls_ssl_session_reset(&x->ssl);
    x->used = 1;
    if (rc == 0) rc = mbedtls_ssl_set_hostname(&x->ssl, x->host);
    mbedtls_ssl_set_bio(&x->ssl, x, bio_send, bio_recv, NULL);
    while (rc == 0 && (rc = mbedtls_ssl_handshake(&x->ssl)) != 0)
        if (rc != MBEDTLS_ERR_SSL_WANT_READ && rc != MBEDTLS_ERR_SSL_WANT_WRITE) break;
    st->last_verify = mbedtls_ssl_get_verify_result(&x->ssl);
    if (rc == 0) return DPREC_OK;
    /* the peer closed the connection before the handshake ended (a server that died; a proxy whose server died): cut,
     * not refused, as a reset is */
    int cut = x->net_failed || (rc == MBEDTLS_ERR_SSL_CONN_EOF && !x->pin_mismatch);
    int result = cut ? DPREC_ERR_NETWORK : DPREC_ERR_TLS;
    if (x->pin_mismatch) {
        set_error(st, rc, "the server's public key matches no pinned key");
    } else if (result == DPREC_ERR_TLS && st->last_verify != 0 && st->last_verify != (uint32_t)-1) {
        char info[160];
        int n = mbedtls_x509_crt_verify_info(info, sizeof info, "", st->last_verify);
        if (n > 0 && info[n - 1] == '\n') info[n - 1] = '\0';
        if (n <= 0) memcpy(info, "the certificate does not verify", sizeof "the certificate does not verify");
        set_error(st, 0, info);
        st->last_tls_error = rc;
    } else {
        set_error(st, rc, result == DPREC_ERR_TLS  ? "TLS handshake"
                          : left_ms(x) == 0        ? "timed out during the TLS handshake"
                                                   : "the connection failed during the TLS handshake");
    }
    drop_connection(x, 0);
    return result;
}

static int write_all(tls_impl *x, const unsigned char *p, size_t n) {
    while (n > 0) {
        int w = mbedtls_ssl_write(&x->ssl, p, n);
        if (w == MBEDTLS_ERR_SSL_WANT_READ || w == MBEDTLS_ERR_SSL_WANT_WRITE) continue;
        if (w <= 0) return w < 0 ? w : MBEDTLS_ERR_NET_SEND_FAILED;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Appends s to the head being built in x->buf; -1 if it does not fit. */
static int put(tls_impl *x, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (n > sizeof x->buf - *len) return -1;
    memcpy(x->buf + *len, s, n);
    *len += n;
    return 0;
}

static int put_u64(tls_impl *x, size_t *len, uint64_t v) {
    char tmp[24];
    int i = (int)sizeof tmp - 1;
    tmp[i] = '\0';
    do {
        tmp[--i] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v > 0);
    return put(x, len, tmp + i);
}

/* Header values go on one line: no CR, LF or NUL in anything that reaches the head. */
static int header_safe(const char *s) {
    if (s == NULL) return 1;
    for (; *s != '\0'; s++)
        if (*s == '\r' || *s == '\n') return 0;
    return 1;
}

/* The head, in order (|| evaluates left to right and stops at the first piece that does not fit). */
static int build_head(tls_impl *x, const dprec_http_request *req, size_t *len) {
    *len = 0;
    int bad = put(x, len, req->method) || put(x, len, " ") || put(x, len, x->prefix) || put(x, len, req->path) ||
              put(x, len, " HTTP/1.1\r\nHost: ") || put(x, len, x->host_header) ||
              put(x, len, "\r\nUser-Agent: dprec-sdk/" DPREC_VERSION_STRING "\r\nAccept: */*\r\n");
    if (!bad && req->bearer != NULL)
        bad = put(x, len, "Authorization: Bearer ") || put(x, len, req->bearer) || put(x, len, "\r\n");
    if (!bad && req->content_type != NULL)
        bad = put(x, len, "Content-Type: ") || put(x, len, req->content_type) || put(x, len, "\r\n");
    if (!bad && (strcmp(req->method, "GET") != 0 || req->body_len > 0))
        bad = put(x, len, "Content-Length: ") || put_u64(x, len, (uint64_t)req->body_len) || put(x, len, "\r\n");
    if (!bad) bad = put(x, len, "\r\n");
    return bad ? -1 : 0;
}

typedef struct attempt_out {
    int answered;   /* some bytes of an answer arrived */
    int mbed_rc;
} attempt_out;

/* One try of a request on the open connection: DPREC_OK once the whole answer was read (or the sink stopped it). */
static int attempt(tls_impl *x, const dprec_http_request *req, size_t head_len, dprec_http_sink sink, void *sink_user,
                   attempt_out *out) {
    x->net_failed = 0;
    out->answered = 0;
    out->mbed_rc = write_all(x, x->buf, head_len);
    if (out->mbed_rc == 0 && req->body_len > 0) out->mbed_rc = write_all(x, req->body, req->body_len);
    if (out->mbed_rc != 0) return DPREC_ERR_NETWORK;
    dprec_http1_init(&x->http);
    for (;;) {
        int r = mbedtls_ssl_read(&x->ssl, x->buf, sizeof x->buf);
        if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE) continue;
#ifdef MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET
        if (r == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET) continue; /* TLS 1.3 (mbedTLS 3) */
#endif
        int h;
        if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || r == MBEDTLS_ERR_SSL_CONN_EOF) {
            h = dprec_http1_eof(&x->http);
            if (h == DPREC_HTTP1_BAD) {
                out->mbed_rc = r;
                return DPREC_ERR_NETWORK;
            }
        } else if (r < 0) {
            out->mbed_rc = r;
            return x->net_failed ? DPREC_ERR_NETWORK : DPREC_ERR_TLS;
        } else {
            out->answered = 1;
            size_t used = 0;
            h = dprec_http1_feed(&x->http, x->buf, (size_t)r, &used, sink, sink_user);
            if (h == DPREC_HTTP1_DONE && used < (size_t)r) x->http.close = 1; /* bytes past the answer: do not reuse */
        }
        if (h == DPREC_HTTP1_DONE || h == DPREC_HTTP1_SINK) return DPREC_OK;
        if (h == DPREC_HTTP1_BAD) return DPREC_ERR_NETWORK;
    }
}

static int tls_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                       dprec_http_response *resp) {
    dprec_transport_mbedtls *st = ctx;
    tls_impl *x = st != NULL ? st->impl : NULL;
    if (x == NULL || req == NULL || req->method == NULL || req->path == NULL || resp == NULL || req->path[0] != '/' ||
        (req->body == NULL && req->body_len != 0) || !header_safe(req->method) || !header_safe(req->path) ||
        !header_safe(req->bearer) || !header_safe(req->content_type) || strchr(req->method, ' ') != NULL ||
        strchr(req->path, ' ') != NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    resp->status = 0;
    resp->retry_after = 0;
    st->errbuf[0] = '\0';
    st->last_tls_error = 0;
    size_t head_len;
    if (build_head(x, req, &head_len) != 0) {
        set_error(st, 0, "the request's head is too long");
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    uint64_t deadline = now_ms(x) + x->timeout_ms;
    for (int tries = 0;; tries++) {
        int fresh = x->sock == NULL;
        if (fresh) {
            int rc = open_connection(st, x, deadline);
            if (rc != DPREC_OK) return rc;
        }
        if (tries > 0) (void)build_head(x, req, &head_len); /* x->buf held the first try's answer */
        x->deadline = deadline;
        attempt_out out;
        int rc = attempt(x, req, head_len, sink, sink_user, &out);
        if (rc == DPREC_OK && x->http.sink_rc != 0) {
            drop_connection(x, 0); /* the rest of the answer is unread */
            return x->http.sink_rc;
        }
        if (rc == DPREC_OK) {
            resp->status = x->http.status;
            resp->retry_after = x->http.retry_after;
            if (!dprec_http1_reusable(&x->http)) drop_connection(x, 1);
            return DPREC_OK;
        }
        drop_connection(x, 0);
        /* a kept connection the server had closed: nothing of the answer came, so send it again, once, afresh */
        if (!fresh && !out.answered && tries == 0 && left_ms(x) > 0) continue;
        set_error(st, out.mbed_rc, x->net_failed ? (left_ms(x) == 0 ? "timed out" : "the connection failed")
                                   : rc == DPREC_ERR_TLS ? "TLS" : "the answer is not HTTP/1.x");
        return rc;
    }
}

/* dprec_transport.last_error: the text of the last request that got no answer ("" after one that got one). */
static const char *tls_last_error(void *ctx) {
    const dprec_transport_mbedtls *st = ctx;
    return st != NULL ? st->errbuf : "";
}

/* ---- set-up ------------------------------------------------------------------------------------------------- */

/* "https://host[:port][/prefix]" */
static int parse_url(tls_impl *x, const char *url) {
    if (strncmp(url, "https://", 8) != 0 || !header_safe(url)) return -1;
    const char *h = url + 8, *h_end;
    if (*h == '[') {
        h_end = strchr(h, ']');
        if (h_end == NULL) return -1;
        h++;
    } else {
        h_end = h;
        while (*h_end != '\0' && *h_end != ':' && *h_end != '/') h_end++;
    }
    size_t hn = (size_t)(h_end - h);
    if (hn == 0 || hn >= sizeof x->host) return -1;
    for (size_t i = 0; i < hn; i++) /* a host name, an IPv4 or an IPv6 address: nothing else (no user@, no spaces) */
        if (!((h[i] >= 'a' && h[i] <= 'z') || (h[i] >= 'A' && h[i] <= 'Z') || (h[i] >= '0' && h[i] <= '9') ||
              h[i] == '.' || h[i] == '-' || h[i] == ':'))
            return -1;
    memcpy(x->host, h, hn);
    x->host[hn] = '\0';
    const char *p = *h_end == ']' ? h_end + 1 : h_end;
    unsigned long port = 443;
    if (*p == ':') {
        p++;
        port = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 6) {
            port = port * 10u + (unsigned long)(*p++ - '0');
            digits++;
        }
        if (digits == 0 || port == 0 || port > 65535) return -1;
    }
    if (*p != '\0' && *p != '/') return -1;
    size_t pn = strlen(p);
    while (pn > 0 && p[pn - 1] == '/') pn--; /* request paths start with '/' */
    if (pn >= sizeof x->prefix || memchr(p, '?', pn) != NULL || memchr(p, '#', pn) != NULL ||
        memchr(p, ' ', pn) != NULL)
        return -1;
    memcpy(x->prefix, p, pn);
    x->prefix[pn] = '\0';
    x->port_number = (uint16_t)port;
    if (parse_ipv4(x->host, x->ip) == 0) {
        x->ip_len = 4;
    } else if (*h_end == ']') {
        if (parse_ipv6(x->host, x->ip) != 0) return -1;
        x->ip_len = 16;
    } else if (strchr(x->host, ':') != NULL) {
        return -1; /* an IPv6 address needs its brackets */
    }
    /* Host: as in the URL (RFC 9110 7.2), the port only when it is not https's */
    size_t n = 0;
    const char *open_b = x->ip_len == 16 ? "[" : "", *close_b = x->ip_len == 16 ? "]" : "";
    memcpy(x->host_header, open_b, strlen(open_b));
    n += strlen(open_b);
    memcpy(x->host_header + n, x->host, hn);
    n += hn;
    memcpy(x->host_header + n, close_b, strlen(close_b));
    n += strlen(close_b);
    x->host_header[n] = '\0';
    if (port != 443) {
        char tmp[8];
        int i = (int)sizeof tmp - 1;
        tmp[i] = '\0';
        for (unsigned long v = port; v > 0; v /= 10u) tmp[--i] = (char)('0' + v % 10u);
        tmp[--i] = ':';
        memcpy(x->host_header + n, tmp + i, strlen(tmp + i) + 1);
    }
    return 0;
}

/* The CAs: ca_pem, ca_file, else the system's bundle. DPREC_OK with at least one certificate. */
static int load_cas(dprec_transport_mbedtls *st, tls_impl *x, const dprec_mbedtls_options *opt) {
    int rc;
    if (opt->ca_pem != NULL) {
        rc = mbedtls_x509_crt_parse(&x->ca, opt->ca_pem, opt->ca_pem_len);
        if (rc < 0 || x->ca.version == 0) {
            set_error(st, rc < 0 ? rc : 0, "ca_pem holds no certificate");
            return DPREC_ERR_CONFIG;
        }
    }
#if defined(MBEDTLS_FS_IO)
    if (opt->ca_file != NULL) {
        rc = mbedtls_x509_crt_parse_file(&x->ca, opt->ca_file);
        if (rc < 0 || x->ca.version == 0) {
            set_error(st, rc < 0 ? rc : 0, "ca_file holds no certificate");
            return DPREC_ERR_CONFIG;
        }
    }
    if (opt->ca_pem == NULL && opt->ca_file == NULL) {
        static const char *const bundles[] = {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                                              "/etc/ssl/cert.pem"};
        for (size_t i = 0; i < sizeof bundles / sizeof bundles[0] && x->ca.version == 0; i++)
            (void)mbedtls_x509_crt_parse_file(&x->ca, bundles[i]); /* a few bad entries in a bundle are skipped */
    }
#else
    if (opt->ca_file != NULL) {
        set_error(st, 0, "ca_file: this mbedTLS has no file support (MBEDTLS_FS_IO); use ca_pem");
        return DPREC_ERR_CONFIG;
    }
#endif
    if (x->ca.version == 0) {
        set_error(st, 0, "no CA to trust: set ca_file or ca_pem (no system CA bundle found)");
        return DPREC_ERR_CONFIG;
    }
    return DPREC_OK;
}

static void free_impl(tls_impl *x) {
    mbedtls_ssl_free(&x->ssl);
    mbedtls_ssl_config_free(&x->conf);
    mbedtls_ctr_drbg_free(&x->drbg);
    mbedtls_x509_crt_free(&x->ca);
    mbedtls_platform_zeroize(x, sizeof *x);
    mbedtls_free(x);
}

int dprec_transport_mbedtls_init_sized(dprec_transport *t, size_t t_size, dprec_transport_mbedtls *state,
                                       const char *base_url, const dprec_port *app_port, const dprec_net *app_net,
                                       const dprec_mbedtls_options *app_opt) {
    if (t == NULL || state == NULL || base_url == NULL || app_port == NULL || app_net == NULL)
        return DPREC_ERR_INVALID_ARGUMENT;
    memset(state, 0, sizeof *state);
    /* an app of 0.2's headers has no last_error (added in 0.3): its smaller struct is filled as far as it goes */
    if (t_size < offsetof(dprec_transport, last_error) || t_size > sizeof *t + DPREC_ABI_MAX_GROWTH)
        return DPREC_ERR_STRUCT_SIZE;
    dprec_mbedtls_options opt;
    DPREC_STRUCT_INIT(&opt);
    if (app_opt != NULL && DPREC_ABI_COPY_IN(&opt, app_opt) != DPREC_OK) return DPREC_ERR_STRUCT_SIZE;
    tls_impl *x = mbedtls_calloc(1, sizeof *x);
    if (x == NULL) return DPREC_ERR_NO_MEMORY;
    mbedtls_ssl_init(&x->ssl);
    mbedtls_ssl_config_init(&x->conf);
    mbedtls_ctr_drbg_init(&x->drbg);
    mbedtls_x509_crt_init(&x->ca);
    int rc = DPREC_OK;
    if (DPREC_ABI_COPY_IN(&x->port, app_port) != DPREC_OK || DPREC_ABI_COPY_IN(&x->net, app_net) != DPREC_OK) {
        rc = DPREC_ERR_STRUCT_SIZE;
    } else if (x->port.entropy == NULL || x->port.monotonic_ms == NULL || x->net.connect == NULL ||
               x->net.send == NULL || x->net.recv == NULL || x->net.close == NULL) {
        rc = DPREC_ERR_PORT_MISSING;
    } else if (parse_url(x, base_url) != 0) {
        set_error(state, 0, "base_url is not https://host[:port][/prefix]");
        rc = DPREC_ERR_INVALID_ARGUMENT;
    } else if (opt.pinned_public_key != NULL && parse_pins(x, opt.pinned_public_key) != 0) {
        set_error(state, 0, "pinned_public_key is not sha256//<base64>[;sha256//<base64>...]");
        rc = DPREC_ERR_INVALID_ARGUMENT;
    }
    x->connect_timeout_ms = opt.connect_timeout_ms > 0 ? opt.connect_timeout_ms : 10000u;
    x->timeout_ms = opt.timeout_ms > 0 ? opt.timeout_ms : 60000u;
    static const unsigned char pers[] = "dprec transport mbedtls";
    if (rc == DPREC_OK) {
        int m = mbedtls_ctr_drbg_seed(&x->drbg, drbg_entropy, x, pers, sizeof pers - 1);
        if (m != 0) {
            set_error(state, m, "seeding the TLS random generator from the port's entropy");
            rc = DPREC_ERR_ENTROPY;
        }
    }
    if (rc == DPREC_OK) rc = load_cas(state, x, &opt);
#if MBEDTLS_VERSION_NUMBER >= 0x03000000 && defined(MBEDTLS_PSA_CRYPTO_C)
    if (rc == DPREC_OK && psa_crypto_init() != PSA_SUCCESS) rc = DPREC_ERR_ENTROPY; /* TLS 1.3 runs on PSA */
#endif
    if (rc == DPREC_OK) {
        int m = mbedtls_ssl_config_defaults(&x->conf, MBEDTLS_SSL_IS_CLIENT, MBEDTLS_SSL_TRANSPORT_STREAM,
                                            MBEDTLS_SSL_PRESET_DEFAULT);
        if (m == 0) {
            mbedtls_ssl_conf_authmode(&x->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
            mbedtls_ssl_conf_ca_chain(&x->conf, &x->ca, NULL);
            mbedtls_ssl_conf_rng(&x->conf, mbedtls_ctr_drbg_random, &x->drbg);
            mbedtls_ssl_conf_verify(&x->conf, verify_cb, x);
#if MBEDTLS_VERSION_NUMBER >= 0x03020000
            mbedtls_ssl_conf_min_tls_version(&x->conf, MBEDTLS_SSL_VERSION_TLS1_2);
#elif MBEDTLS_VERSION_NUMBER < 0x03000000
            mbedtls_ssl_conf_min_version(&x->conf, MBEDTLS_SSL_MAJOR_VERSION_3, MBEDTLS_SSL_MINOR_VERSION_3);
#endif
            m = mbedtls_ssl_setup(&x->ssl, &x->conf);
        }
        if (m != 0) {
            set_error(state, m, "setting up TLS");
            rc = m == MBEDTLS_ERR_SSL_ALLOC_FAILED ? DPREC_ERR_NO_MEMORY : DPREC_ERR_CONFIG;
        }
    }
    if (rc != DPREC_OK) {
        free_impl(x);
        return rc;
    }
    state->impl = x;
    memset(t, 0, t_size);
    t->struct_size = (uint32_t)t_size;
    t->ctx = state;
    t->request = tls_request;
    if (t_size >= offsetof(dprec_transport, last_error) + sizeof t->last_error) t->last_error = tls_last_error;
    return DPREC_OK;
}

void dprec_transport_mbedtls_cleanup(dprec_transport_mbedtls *state) {
    if (state == NULL || state->impl == NULL) return;
    tls_impl *x = state->impl;
    drop_connection(x, 1);
    free_impl(x);
    state->impl = NULL;
}

const char *dprec_transport_mbedtls_last_error(const dprec_transport_mbedtls *state) {
    return state != NULL ? state->errbuf : "";
}
