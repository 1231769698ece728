/* dprec — the HTTP/1.1 response parser of the mbedTLS transport (http1.h). RFC 9112: the status line (section 4),
 * header fields (5; obsolete line folding refused), the message body's length (6.3: no body for 1xx, 204 and 304;
 * Transfer-Encoding over Content-Length, and then the connection is not reused; else Content-Length; else up to
 * the close), chunked coding (7.1; extensions and trailers skipped). */
#include "http1.h"

#include <string.h>

enum { S_STATUS, S_HEADERS, S_BODY_LENGTH, S_CHUNK_SIZE, S_CHUNK_DATA, S_CHUNK_END, S_TRAILERS, S_BODY_EOF, S_DONE,
       S_BAD, S_SINK };

void dprec_http1_init(dprec_http1 *p) {
    memset(p, 0, sizeof *p);
    p->state = S_STATUS;
}

static int lower(int c) {
    return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* Whether s[0 .. n) equals the lowercase word w, ignoring case. */
static int word_is(const char *s, size_t n, const char *w) {
    size_t k = strlen(w);
    if (n != k) return 0;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)s[i]) != w[i]) return 0;
    return 1;
}

static int is_ows(char c) {
    return c == ' ' || c == '\t';
}

/* Decimal digits only, at most 19 of them (below 2^63). */
static int parse_decimal(const char *s, size_t n, uint64_t *out) {
    if (n == 0 || n > 19) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10u + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* "HTTP/1.x SSS[ reason]" */
static int status_line(dprec_http1 *p, const char *s, size_t n) {
    if (n < 12 || memcmp(s, "HTTP/1.", 7) != 0 || s[7] < '0' || s[7] > '9' || s[8] != ' ') return -1;
    int status = 0;
    for (int i = 9; i < 12; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        status = status * 10 + (s[i] - '0');
    }
    if (status < 100 || (n > 12 && s[12] != ' ')) return -1;
    p->minor = s[7] - '0';
    p->status = status;
    return 0;
}

/* Whether the comma-separated list s[0 .. n) holds the token w (any case). */
static int list_has(const char *s, size_t n, const char *w) {
    size_t i = 0;
    while (i < n) {
        while (i < n && (is_ows(s[i]) || s[i] == ',')) i++;
        size_t start = i;
        while (i < n && s[i] != ',') i++;
        size_t end = i;
        while (end > start && is_ows(s[end - 1])) end--;
        if (end > start && word_is(s + start, end - start, w)) return 1;
    }
    return 0;
}

/* Whether the last element of the comma-separated list s[0 .. n) is the token w (any case). */
static int list_ends_with(const char *s, size_t n, const char *w) {
    while (n > 0 && (is_ows(s[n - 1]) || s[n - 1] == ',')) n--;
    size_t start = n;
    while (start > 0 && s[start - 1] != ',') start--;
    while (start < n && is_ows(s[start])) start++;
    return word_is(s + start, n - start, w);
}

static int header_line(dprec_http1 *p, const char *s, size_t n) {
    if (is_ows(s[0])) return -1; /* obsolete line folding */
    const char *colon = memchr(s, ':', n);
    if (colon == NULL || colon == s) return -1;
    size_t name_len = (size_t)(colon - s);
    for (size_t i = 0; i < name_len; i++)
        if (s[i] <= ' ' || s[i] >= 127) return -1; /* no whitespace before the colon (RFC 9112 5.1) */
    const char *v = colon + 1;
    size_t vn = n - name_len - 1;
    while (vn > 0 && is_ows(v[0])) {
        v++;
        vn--;
    }
    while (vn > 0 && is_ows(v[vn - 1])) vn--;
    if (word_is(s, name_len, "content-length")) {
        uint64_t len;
        if (parse_decimal(v, vn, &len) != 0 || (p->has_length && len != p->length)) return -1;
        p->has_length = 1;
        p->length = len;
    } else if (word_is(s, name_len, "transfer-encoding")) {
        if (list_ends_with(v, vn, "chunked")) {
            p->chunked = 1;
            p->other_coding = 0;
        } else {
            p->chunked = 0;
            p->other_coding = 1;
        }
    } else if (word_is(s, name_len, "connection")) {
        if (list_has(v, vn, "close")) p->close = 1;
        if (list_has(v, vn, "keep-alive")) p->keep_alive = 1;
    } else if (word_is(s, name_len, "retry-after")) {
        uint64_t secs;
        if (parse_decimal(v, vn, &secs) == 0) p->retry_after = secs > UINT32_MAX ? UINT32_MAX : (uint32_t)secs;
    }
    return 0;
}

/* The head is complete: where the body is, and how long (RFC 9112 6.3). */
static int end_of_head(dprec_http1 *p) {
    if (p->status < 200) { /* an interim response (100 Continue, 103 Early Hints): the real one follows */
        if (p->status == 101) return -1; /* never asked to switch protocols */
        size_t head = p->head_bytes; /* the bound is on every head of the response together */
        dprec_http1_init(p);
        p->head_bytes = head;
        return S_STATUS;
    }
    if (p->minor == 0 && !p->keep_alive) p->close = 1;
    if (p->status == 204 || p->status == 304) return S_DONE;
    if (p->chunked || p->other_coding) {
        if (p->has_length) p->close = 1; /* both: the coding decides, and the connection is not trusted further */
        if (p->other_coding) {
            p->close = 1;
            return S_BODY_EOF;
        }
        return S_CHUNK_SIZE;
    }
    if (p->has_length) {
        p->remaining = p->length;
        return p->length == 0 ? S_DONE : S_BODY_LENGTH;
    }
    p->close = 1;
    return S_BODY_EOF;
}

/* "HEX[;extensions]" */
static int chunk_size_line(dprec_http1 *p, const char *s, size_t n) {
    size_t i = 0;
    uint64_t v = 0;
    for (; i < n; i++) {
        int c = lower((unsigned char)s[i]), d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else break;
        if (i >= 15) return -1; /* below 2^60 */
        v = v * 16u + (uint64_t)d;
    }
    if (i == 0) return -1;
    while (i < n && is_ows(s[i])) i++;
    if (i < n && s[i] != ';') return -1;
    p->remaining = v;
    return 0;
}

/* One complete line (without its CRLF) in the state that reads lines. */
static int on_line(dprec_http1 *p, const char *s, size_t n) {
    switch (p->state) {
    case S_STATUS:
        return status_line(p, s, n) == 0 ? S_HEADERS : S_BAD;
    case S_HEADERS:
        if (n == 0) {
            int next = end_of_head(p);
            return next < 0 ? S_BAD : next;
        }
        return header_line(p, s, n) == 0 ? S_HEADERS : S_BAD;
    case S_CHUNK_SIZE:
        if (chunk_size_line(p, s, n) != 0) return S_BAD;
        return p->remaining == 0 ? S_TRAILERS : S_CHUNK_DATA;
    case S_CHUNK_END:
        return n == 0 ? S_CHUNK_SIZE : S_BAD;
    case S_TRAILERS:
        return n == 0 ? S_DONE : S_TRAILERS;
    default:
        return S_BAD;
    }
}

static int result_of(const dprec_http1 *p) {
    switch (p->state) {
    case S_DONE:
        return DPREC_HTTP1_DONE;
    case S_BAD:
        return DPREC_HTTP1_BAD;
    case S_SINK:
        return DPREC_HTTP1_SINK;
    default:
        return DPREC_HTTP1_MORE;
    }
}

static int body(dprec_http1 *p, const unsigned char *in, size_t n, dprec_http1_body_fn fn, void *user) {
    if (n == 0 || fn == NULL) return 0;
    int rc = fn(user, in, n);
    if (rc != 0) {
        p->sink_rc = rc;
        p->state = S_SINK;
        return -1;
    }
    return 0;
}

int dprec_http1_feed(dprec_http1 *p, const unsigned char *in, size_t len, size_t *used, dprec_http1_body_fn fn,
                     void *user) {
    size_t i = 0;
    while (i < len && result_of(p) == DPREC_HTTP1_MORE) {
        if (p->state == S_BODY_LENGTH || p->state == S_CHUNK_DATA) {
            size_t n = len - i;
            if ((uint64_t)n > p->remaining) n = (size_t)p->remaining;
            if (body(p, in + i, n, fn, user) != 0) break;
            i += n;
            p->remaining -= n;
            if (p->remaining == 0) p->state = p->state == S_BODY_LENGTH ? S_DONE : S_CHUNK_END;
            continue;
        }
        if (p->state == S_BODY_EOF) {
            if (body(p, in + i, len - i, fn, user) != 0) break;
            i = len;
            continue;
        }
        /* a line: up to LF, the CR before it dropped */
        unsigned char c = in[i++];
        int in_head = p->state == S_STATUS || p->state == S_HEADERS || p->state == S_TRAILERS;
        if (in_head && ++p->head_bytes > DPREC_HTTP1_HEAD_MAX) {
            p->state = S_BAD;
            break;
        }
        if (c != '\n') {
            if (p->line_len + 1 >= sizeof p->line || c == '\0') {
                p->state = S_BAD;
                break;
            }
            p->line[p->line_len++] = (char)c;
            continue;
        }
        size_t n = p->line_len;
        if (n > 0 && p->line[n - 1] == '\r') n--;
        p->line_len = 0;
        p->state = on_line(p, p->line, n);
    }
    *used = i;
    return result_of(p);
}

int dprec_http1_eof(dprec_http1 *p) {
    if (p->state == S_BODY_EOF) p->state = S_DONE;
    else if (p->state != S_DONE && p->state != S_SINK) p->state = S_BAD;
    return result_of(p);
}

int dprec_http1_reusable(const dprec_http1 *p) {
    return p->state == S_DONE && !p->close;
}
