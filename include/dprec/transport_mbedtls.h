/* dprec — the mbedTLS transport for dprec_client_sync (dprec/sync.h): HTTPS to the aggregator with mbedTLS's own
 * TLS (1.2; 1.3 too with an mbedTLS 3 built for it) and a small HTTP/1.1 client, over the port's sockets (dprec_net,
 * dprec/platform.h; POSIX: dprec_net_posix_init). The device transport on every target: it needs nothing beyond the
 * mbedTLS the SDK already links (its TLS and X.509 libraries beside the crypto one), no libcurl and no OpenSSL.
 *
 * Trust: the server's certificate chain is verified against a CA file, CAs in memory, or the system's CA bundle, and
 * its host name (or numeric address) checked; a pinned public key (SHA-256 of its SubjectPublicKeyInfo, the form
 * libcurl and the aggregator's tls-pin.txt use) is checked in addition, never instead. The connection is kept
 * between requests (HTTP keep-alive) and opened again when the server closed it.
 *
 * Memory: the TLS contexts and the connection's record buffers (about 2 x 17 KiB with mbedTLS's default
 * MBEDTLS_SSL_IN/OUT_CONTENT_LEN) come from mbedtls_calloc: the C heap, or the app's allocator where mbedTLS was
 * built with MBEDTLS_PLATFORM_MEMORY. No threads; a transport is not thread-safe (give each thread its own).
 * Host code (platform/mbedtls), not part of the portable SDK. Link dprec_transport_mbedtls. */
#ifndef DPREC_TRANSPORT_MBEDTLS_H
#define DPREC_TRANSPORT_MBEDTLS_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/platform.h"
#include "dprec/sync.h"

DPREC_BEGIN_DECLS

typedef struct dprec_mbedtls_options {
    uint32_t struct_size; /* sizeof(dprec_mbedtls_options) as the app was compiled (DPREC_STRUCT_INIT) */
    /* PEM (or DER) file of the CA(s) to trust, e.g. the aggregator's self-signed STATE/tls-cert.pem; read once, by
     * _init. NULL, and no ca_pem: the system's bundle, the first of /etc/ssl/certs/ca-certificates.crt (Debian,
     * Ubuntu, Alpine), /etc/pki/tls/certs/ca-bundle.crt (Fedora), /etc/ssl/cert.pem (macOS, BSD) that exists. */
    const char *ca_file;
    /* CAs in memory, for a target without files: PEM (NUL-terminated, ca_pem_len counting the NUL) or DER. Used
     * in addition to ca_file. Copied by _init. */
    const unsigned char *ca_pem;
    size_t ca_pem_len;
    /* Pinned server public key(s): "sha256//<base64 of the SHA-256 of the DER SubjectPublicKeyInfo>", several
     * joined with ';' (as libcurl's CURLOPT_PINNEDPUBLICKEY and the aggregator's STATE/tls-pin.txt give it;
     * whitespace around each, such as that file's final newline, is ignored). NULL: no pinning. A malformed pin
     * is DPREC_ERR_INVALID_ARGUMENT at _init. */
    const char *pinned_public_key;
    uint32_t connect_timeout_ms; /* TCP connection and TLS handshake; 0: 10 s */
    uint32_t timeout_ms;         /* a whole request, from its first byte sent to its last received; 0: 60 s */
} dprec_mbedtls_options;

/* The transport's state: place it yourself (stack, static or heap) and keep it alive while the transport is in
 * use. Fields are private; read them through the functions below. */
typedef struct dprec_transport_mbedtls {
    void *impl;            /* the TLS contexts and the connection (mbedtls_calloc) */
    char errbuf[256];      /* what went wrong last ("" if nothing) */
    int last_tls_error;    /* mbedTLS's code for the last failure (negative), 0 if none */
    uint32_t last_verify;  /* the certificate verification flags of the last handshake (MBEDTLS_X509_BADCERT_*) */
} dprec_transport_mbedtls;

/* Sets *t (t_size bytes: the app's sizeof) up to send requests to base_url ("https://host[:port][/prefix]"; host a
 * name, an IPv4 address or a bracketed IPv6 one) through *state. port gives the entropy that seeds the TLS
 * random generator and the monotonic clock that bounds each request (both required; the app's dprec_port, copied by
 * its struct_size); net gives the sockets (required; copied). opt may be NULL (defaults; read by its struct_size).
 * Returns DPREC_OK; DPREC_ERR_INVALID_ARGUMENT (a NULL argument, not an https:// URL, a URL too long or with a bad
 * port, a malformed pin); DPREC_ERR_PORT_MISSING (port->entropy, port->monotonic_ms or a function of net is
 * NULL); DPREC_ERR_STRUCT_SIZE (t, port, net or opt from headers this library cannot use); DPREC_ERR_CONFIG (no CA
 * to trust: ca_file or ca_pem unreadable, or no system bundle; the reason in dprec_transport_mbedtls_last_error);
 * DPREC_ERR_ENTROPY (the port's entropy failed); DPREC_ERR_NO_MEMORY. Nothing needs cleaning up on failure. No
 * connection is made before the first request. Call it through dprec_transport_mbedtls_init. */
DPREC_API int dprec_transport_mbedtls_init_sized(dprec_transport *t, size_t t_size, dprec_transport_mbedtls *state,
                                                 const char *base_url, const dprec_port *port, const dprec_net *net,
                                                 const dprec_mbedtls_options *opt);
static inline int dprec_transport_mbedtls_init(dprec_transport *t, dprec_transport_mbedtls *state,
                                               const char *base_url, const dprec_port *port, const dprec_net *net,
                                               const dprec_mbedtls_options *opt) {
    return dprec_transport_mbedtls_init_sized(t, sizeof *t, state, base_url, port, net, opt);
}

/* Closes the connection (with a TLS close_notify) and frees the transport's memory. NULL and a second call are
 * no-ops; state may be reused with _init afterwards. */
DPREC_API void dprec_transport_mbedtls_cleanup(dprec_transport_mbedtls *state);

/* What went wrong with the last failed call: the network, mbedTLS's own text, the certificate's verification
 * flags, or a pin that did not match (empty string if nothing failed). Never NULL. */
DPREC_API const char *dprec_transport_mbedtls_last_error(const dprec_transport_mbedtls *state);

DPREC_END_DECLS

#endif /* DPREC_TRANSPORT_MBEDTLS_H */
