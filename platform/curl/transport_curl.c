/* dprec — libcurl transport (dprec/transport_curl.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "dprec/dprec.h"
#include "abi.h"
#include "dprec/transport_curl.h"

typedef struct sink_ctx {
    dprec_http_sink sink;
    void *user;
    int result;
} sink_ctx;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    sink_ctx *s = userdata;
    size_t n = size * nmemb;
    if (n == 0 || s->sink == NULL) {
        return n;
    }
    int rc = s->sink(s->user, (const unsigned char *)ptr, n);
    if (rc != 0) {
        s->result = rc;
        return 0; /* any short count makes libcurl abort with CURLE_WRITE_ERROR */
    }
    return n;
}

static int is_tls_failure(CURLcode rc)
{
    switch (rc) {
    case CURLE_PEER_FAILED_VERIFICATION: /* also CURLE_SSL_CACERT in current libcurl */
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_USE_SSL_FAILED:
        return 1;
    default:
        return 0;
    }
}

/* Whether a failed handshake was the connection cut under it (the peer reset or closed it: a server that died, a proxy
 * whose server died), which is a network failure to retry, as the mbedTLS transport has it, and not a TLS one: no
 * certificate was refused and no alert came. libcurl reports both as CURLE_SSL_CONNECT_ERROR; the socket's errno
 * (ECONNRESET, EPIPE) or the TLS library's own name for "the transport failed" (OpenSSL's SSL_ERROR_SYSCALL, GnuTLS's
 * "non-properly terminated") tells them apart. Anything else stays a TLS failure. */
static int cut_in_handshake(CURL *easy, CURLcode rc, const char *errbuf)
{
    if (rc != CURLE_SSL_CONNECT_ERROR) return 0;
    long os_errno = 0;
    if (curl_easy_getinfo(easy, CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK &&
        (os_errno == ECONNRESET || os_errno == EPIPE || os_errno == ECONNABORTED))
        return 1;
    return strstr(errbuf, "SSL_ERROR_SYSCALL") != NULL || strstr(errbuf, "Connection reset by peer") != NULL ||
           strstr(errbuf, "non-properly terminated") != NULL;
}

/* The pin(s) as libcurl takes them, without the whitespace around each ("sha256//a; sha256//b\n" becomes
 * "sha256//a;sha256//b"): the aggregator's tls-pin.txt ends with a newline, which libcurl would take as part of the
 * pin and then match no key. Returns -1 if it does not fit. */
static int trim_pins(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    while (*in != '\0') {
        while (*in == ' ' || *in == '\t' || *in == '\r' || *in == '\n') in++;
        const char *end = in;
        while (*end != '\0' && *end != ';') end++;
        size_t n = (size_t)(end - in);
        while (n > 0 && (in[n - 1] == ' ' || in[n - 1] == '\t' || in[n - 1] == '\r' || in[n - 1] == '\n')) n--;
        if (n > 0) {
            if (o + (o > 0) + n + 1 > cap) return -1;
            if (o > 0) out[o++] = ';';
            memcpy(out + o, in, n);
            o += n;
        }
        in = *end == ';' ? end + 1 : end;
    }
    out[o] = '\0';
    return 0;
}

/* Header values go on one line: refuse CR and LF so a token cannot inject headers. */
static int header_safe(const char *s)
{
    return s == NULL || strpbrk(s, "\r\n") == NULL;
}

static int curl_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                        dprec_http_response *resp)
{
    dprec_transport_curl *st = ctx;
    if (st == NULL || st->easy == NULL || req == NULL || req->method == NULL || req->path == NULL ||
        resp == NULL || req->path[0] != '/' || !header_safe(req->bearer) || !header_safe(req->content_type) ||
        !header_safe(req->path) || (req->body == NULL && req->body_len != 0)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    CURL *easy = st->easy;
    resp->status = 0;
    resp->retry_after = 0;
    st->errbuf[0] = '\0';
    st->last_curl_code = 0;
    st->last_tls_verify = 0;

    size_t base_len = strlen(st->base_url);
    size_t url_cap = base_len + strlen(req->path) + 1;
    char *url = malloc(url_cap);
    if (url == NULL) {
        return DPREC_ERR_NO_MEMORY;
    }
    memcpy(url, st->base_url, base_len);
    memcpy(url + base_len, req->path, strlen(req->path) + 1);

    struct curl_slist *headers = NULL, *h = NULL;
    char line[512];
    int ok = 1;
    if (req->bearer != NULL) {
        if ((size_t)snprintf(line, sizeof line, "Authorization: Bearer %s", req->bearer) >= sizeof line) {
            ok = 0;
        } else if ((h = curl_slist_append(headers, line)) != NULL) {
            headers = h;
        } else {
            ok = 0;
        }
    }
    if (ok && req->content_type != NULL) {
        if ((size_t)snprintf(line, sizeof line, "Content-Type: %s", req->content_type) >= sizeof line) {
            ok = 0;
        } else if ((h = curl_slist_append(headers, line)) != NULL) {
            headers = h;
        } else {
            ok = 0;
        }
    }
    /* No "Expect: 100-continue" round trip before large reports. */
    if (ok && (h = curl_slist_append(headers, "Expect:")) != NULL) {
        headers = h;
    } else {
        ok = 0;
    }
    if (!ok) {
        curl_slist_free_all(headers);
        free(url);
        return DPREC_ERR_INVALID_ARGUMENT;
    }

    sink_ctx sc = {sink, sink_user, 0};
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sc);
    if (strcmp(req->method, "GET") == 0) {
        curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, NULL);
    } else if (strcmp(req->method, "POST") == 0) {
        curl_easy_setopt(easy, CURLOPT_POST, 1L);
        curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, NULL);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, req->body != NULL ? (const char *)req->body : "");
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else {
        curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, req->method);
    }

    CURLcode rc = curl_easy_perform(easy);
    st->last_curl_code = (int)rc;
    int result = DPREC_OK;
    if (rc == CURLE_OK) {
        long status = 0;
        curl_off_t retry = 0;
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        resp->status = (int)status;
        if (curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &retry) == CURLE_OK && retry > 0) {
            resp->retry_after = retry > (curl_off_t)UINT32_MAX ? UINT32_MAX : (uint32_t)retry;
        }
    } else if (rc == CURLE_WRITE_ERROR && sc.result != 0) {
        result = sc.result; /* the sink aborted: hand its own code back */
    } else if (is_tls_failure(rc) && !cut_in_handshake(easy, rc, st->errbuf)) {
        curl_easy_getinfo(easy, CURLINFO_SSL_VERIFYRESULT, &st->last_tls_verify);
        result = DPREC_ERR_TLS;
    } else if (rc == CURLE_OUT_OF_MEMORY) {
        result = DPREC_ERR_NO_MEMORY;
    } else {
        result = DPREC_ERR_NETWORK;
    }
    if (rc != CURLE_OK && st->errbuf[0] == '\0') {
        snprintf(st->errbuf, sizeof st->errbuf, "%s", curl_easy_strerror(rc));
    }
    /* The header list and body belong to this call; keep the handle (and its connection) for the next. */
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, NULL);
    curl_slist_free_all(headers);
    free(url);
    return result;
}

/* libcurl's text for the last request that got no answer (dprec_transport.last_error). */
static const char *curl_last_error(void *ctx)
{
    const dprec_transport_curl *st = ctx;
    return st != NULL && st->last_curl_code != 0 ? st->errbuf : "";
}

/* t_size is the app's sizeof(dprec_transport), all of it written; the options are read by the size the app
 * compiled them with (common/abi.h). */
int dprec_transport_curl_init_sized(dprec_transport *t, size_t t_size, dprec_transport_curl *state,
                                    const char *base_url, const dprec_curl_options *app_opt)
{
    if (t == NULL || state == NULL || base_url == NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    /* an app of 0.2's headers has no last_error (added in 0.3): its smaller struct is filled as far as it goes */
    if (t_size < offsetof(dprec_transport, last_error) || t_size > sizeof *t + DPREC_ABI_MAX_GROWTH) {
        return DPREC_ERR_STRUCT_SIZE;
    }
    dprec_curl_options options;
    const dprec_curl_options *opt = &options;
    DPREC_STRUCT_INIT(&options);
    if (app_opt != NULL && DPREC_ABI_COPY_IN(&options, app_opt) != DPREC_OK) {
        return DPREC_ERR_STRUCT_SIZE;
    }
    memset(state, 0, sizeof *state);
    int https = strncmp(base_url, "https://", 8) == 0;
    int http = strncmp(base_url, "http://", 7) == 0;
    if (!https && !(http && opt->allow_insecure_for_tests)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    size_t n = strlen(base_url);
    while (n > 0 && base_url[n - 1] == '/') {
        n--; /* request paths start with '/' */
    }
    if (n >= sizeof state->base_url || !header_safe(base_url)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    memcpy(state->base_url, base_url, n);
    state->base_url[n] = '\0';
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        return DPREC_ERR_NO_MEMORY;
    }
    CURL *easy = curl_easy_init();
    if (easy == NULL) {
        curl_global_cleanup();
        return DPREC_ERR_NO_MEMORY;
    }
    int bad = 0;
    bad |= curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, state->errbuf) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: CURLOPT_PROTOCOLS_STR */
    bad |= curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, opt->allow_insecure_for_tests ? "https,http" : "https") !=
           CURLE_OK;
#else
    bad |= curl_easy_setopt(easy, CURLOPT_PROTOCOLS,
                            opt->allow_insecure_for_tests ? (long)(CURLPROTO_HTTPS | CURLPROTO_HTTP)
                                                          : (long)CURLPROTO_HTTPS) != CURLE_OK;
#endif
    bad |= curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                            opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : 10000L) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, opt->timeout_ms > 0 ? opt->timeout_ms : 60000L) != CURLE_OK;
    bad |= curl_easy_setopt(easy, CURLOPT_USERAGENT, "dprec-sdk/" DPREC_VERSION_STRING) != CURLE_OK;
    if (opt->ca_file != NULL) {
        bad |= curl_easy_setopt(easy, CURLOPT_CAINFO, opt->ca_file) != CURLE_OK;
    }
    if (opt->pinned_public_key != NULL) {
        char pins[1024]; /* libcurl copies it */
        bad |= trim_pins(opt->pinned_public_key, pins, sizeof pins) != 0 || pins[0] == '\0' ||
               curl_easy_setopt(easy, CURLOPT_PINNEDPUBLICKEY, pins) != CURLE_OK;
    }
    if (opt->allow_insecure_for_tests) {
        bad |= curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L) != CURLE_OK;
        bad |= curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L) != CURLE_OK;
    }
    if (bad) {
        curl_easy_cleanup(easy);
        curl_global_cleanup();
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    state->easy = easy;
    memset(t, 0, t_size);
    t->struct_size = (uint32_t)t_size;
    t->ctx = state;
    t->request = curl_request;
    if (t_size >= offsetof(dprec_transport, last_error) + sizeof t->last_error) {
        t->last_error = curl_last_error;
    }
    return DPREC_OK;
}

void dprec_transport_curl_cleanup(dprec_transport_curl *state)
{
    if (state == NULL || state->easy == NULL) {
        return;
    }
    curl_easy_cleanup(state->easy);
    state->easy = NULL;
    curl_global_cleanup();
}

const char *dprec_transport_curl_last_error(const dprec_transport_curl *state)
{
    return state != NULL ? state->errbuf : "";
}
