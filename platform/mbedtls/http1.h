/* dprec internal (platform/mbedtls) — an HTTP/1.1 response parser that is pushed bytes as they arrive (from TLS, or
 * a test) and hands the body to a callback without holding it: a status line, headers (Content-Length,
 * Transfer-Encoding: chunked, Connection, Retry-After read; the others skipped), then a body by length, in chunks, or
 * up to the end of the connection. Interim 1xx responses are skipped. Bounded: a line of at most
 * DPREC_HTTP1_LINE_MAX bytes, a head of at most DPREC_HTTP1_HEAD_MAX; anything else malformed is refused, never
 * guessed at. No allocation, no I/O: tests/test_http1.c and the fuzz target tests/fuzz/fuzz_http1.c drive it. */
#ifndef DPREC_HTTP1_H
#define DPREC_HTTP1_H

#include <stddef.h>
#include <stdint.h>

#define DPREC_HTTP1_LINE_MAX 2048u  /* one status, header, chunk-size or trailer line, CRLF included */
#define DPREC_HTTP1_HEAD_MAX 16384u /* the status line and headers of one response (and its trailers) */

enum {
    DPREC_HTTP1_MORE = 0,  /* every byte taken; the response goes on */
    DPREC_HTTP1_DONE = 1,  /* the response is complete; bytes past it were not taken (*used says) */
    DPREC_HTTP1_BAD = -1,  /* not a well-formed HTTP/1.x response, or past a bound */
    DPREC_HTTP1_SINK = -2  /* the body callback returned non-zero: its value is in sink_rc */
};

/* Receives the body in chunks of any size; non-zero stops the parser (DPREC_HTTP1_SINK). */
typedef int (*dprec_http1_body_fn)(void *user, const unsigned char *chunk, size_t len);

typedef struct dprec_http1 {
    int state;
    int status;            /* the final response's status (after any 1xx) */
    int minor;             /* HTTP/1.minor */
    uint32_t retry_after;  /* Retry-After in seconds (the delay form; 0 if absent or a date) */
    int chunked;           /* Transfer-Encoding ends in chunked */
    int other_coding;      /* another Transfer-Encoding: the body runs to the end of the connection */
    int has_length;
    uint64_t length;       /* Content-Length */
    uint64_t remaining;    /* of the body (by length) or of the current chunk */
    int close;             /* the connection cannot carry another request after this response */
    int keep_alive;        /* "Connection: keep-alive" (HTTP/1.0) */
    int sink_rc;
    size_t head_bytes;
    size_t line_len;
    char line[DPREC_HTTP1_LINE_MAX];
} dprec_http1;

void dprec_http1_init(dprec_http1 *p);

/* Takes in[0 .. len), passing body bytes to fn(user, ...); *used is how many bytes were taken. Returns one of the
 * DPREC_HTTP1_* values above; after DONE, BAD or SINK every further call returns the same. */
int dprec_http1_feed(dprec_http1 *p, const unsigned char *in, size_t len, size_t *used, dprec_http1_body_fn fn,
                     void *user);

/* The peer closed the connection: DONE for a body that runs to the end of the connection (or a response already
 * complete), BAD for a response cut short. */
int dprec_http1_eof(dprec_http1 *p);

/* Whether the connection may carry another request once the response is DONE. */
int dprec_http1_reusable(const dprec_http1 *p);

#endif /* DPREC_HTTP1_H */
