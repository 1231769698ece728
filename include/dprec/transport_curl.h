/* dprec — the libcurl transport for dprec_client_sync (dprec/sync.h): HTTPS to the aggregator with the system
 * CA store, a private CA file (a self-signed aggregator) and/or public-key pinning. One CURL easy handle per
 * transport, reused for every request so the TLS connection stays alive between calls.
 *
 * Host code (platform/curl), not part of the portable SDK: it allocates through libcurl. A transport is not
 * thread-safe; give each thread its own. _init calls curl_global_init, which is thread-safe from libcurl 7.84;
 * with an older libcurl, call curl_global_init once before starting threads. Link with dprec_transport_curl. */
#ifndef DPREC_TRANSPORT_CURL_H
#define DPREC_TRANSPORT_CURL_H

#include <stddef.h>

#include "dprec/export.h"
#include "dprec/sync.h"

DPREC_BEGIN_DECLS

typedef struct dprec_curl_options {
    uint32_t struct_size; /* sizeof(dprec_curl_options) as the app was compiled (DPREC_STRUCT_INIT; 0: the 0.2.0 layout) */
    /* PEM file of the CA(s) to trust instead of the system store, e.g. the aggregator's self-signed
     * STATE/tls-cert.pem. NULL: the system CA store. */
    const char *ca_file;
    /* Pinned server public key, as libcurl's CURLOPT_PINNEDPUBLICKEY takes it: "sha256//<base64>" (several
     * joined with ';'), or the path of a PEM/DER public key file. The aggregator logs its pin at start and writes
     * it to STATE/tls-pin.txt; whitespace around each pin (that file's final newline) is ignored. NULL: no
     * pinning. Pinning is checked in addition to (not instead of) certificate verification. */
    const char *pinned_public_key;
    long connect_timeout_ms; /* 0: 10 s */
    long timeout_ms;         /* whole request; 0: 60 s */
    /* Tests only: accept http:// base URLs and skip certificate verification (pinning still applies if set).
     * Never set this in an app. */
    int allow_insecure_for_tests;
} dprec_curl_options;

/* The transport's state: place it yourself (stack, static or heap) and keep it alive while the transport is
 * in use. Fields are private. */
typedef struct dprec_transport_curl {
    void *easy;               /* CURL * */
    char base_url[512];
    char errbuf[256];         /* libcurl's message for the last failure */
    int last_curl_code;       /* CURLcode of the last request (0 on success) */
    long last_tls_verify;     /* CURLINFO_SSL_VERIFYRESULT of the last request */
} dprec_transport_curl;

/* Sets *t (t_size bytes: the app's sizeof) up to send requests to base_url ("https://host:port", no trailing path
 * needed) through *state with the options in *opt (NULL: defaults; read by their struct_size). base_url must be
 * https:// unless opt->allow_insecure_for_tests. Returns DPREC_OK, DPREC_ERR_INVALID_ARGUMENT (NULL argument,
 * http:// URL, URL too long), DPREC_ERR_STRUCT_SIZE (t or opt from headers this library cannot use) or
 * DPREC_ERR_NO_MEMORY (libcurl failed to initialise). On failure nothing needs cleaning up. Call it through
 * dprec_transport_curl_init, which passes the app's sizeof. */
DPREC_API int dprec_transport_curl_init_sized(dprec_transport *t, size_t t_size, dprec_transport_curl *state,
                                              const char *base_url, const dprec_curl_options *opt);
static inline int dprec_transport_curl_init(dprec_transport *t, dprec_transport_curl *state, const char *base_url,
                                            const dprec_curl_options *opt) {
    return dprec_transport_curl_init_sized(t, sizeof *t, state, base_url, opt);
}

/* Closes the connection and releases libcurl's resources. NULL and a second call are no-ops. */
DPREC_API void dprec_transport_curl_cleanup(dprec_transport_curl *state);

/* libcurl's description of the last failure (empty string if none). */
DPREC_API const char *dprec_transport_curl_last_error(const dprec_transport_curl *state);

DPREC_END_DECLS

#endif /* DPREC_TRANSPORT_CURL_H */
