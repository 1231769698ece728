/* Tests of the mbedTLS transport's HTTP/1.1 response parser (platform/mbedtls/http1.c): bodies by length, chunked
 * and up to the close, fed in every split; the headers it reads; interim responses; what it refuses; the sink's
 * stop. No network: the transport itself is tested against a real aggregator in test_transport_mbedtls.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http1.h"

typedef struct collected {
    unsigned char body[8192];
    size_t len;
    int stop_after; /* >0: the sink returns 77 once it holds this many bytes */
} collected;

static int collect(void *user, const unsigned char *chunk, size_t len) {
    collected *c = user;
    if (c->len + len > sizeof c->body) return 99;
    memcpy(c->body + c->len, chunk, len);
    c->len += len;
    return c->stop_after > 0 && c->len >= (size_t)c->stop_after ? 77 : 0;
}

/* Feeds text in pieces of `step` bytes (0: all at once); returns the parser's last answer, with eof at the end if
 * the answer was still MORE. *taken: the bytes the parser took. */
static int feed(dprec_http1 *p, const char *text, size_t step, int eof, collected *c, size_t *taken) {
    size_t len = strlen(text), at = 0;
    int r = DPREC_HTTP1_MORE;
    dprec_http1_init(p);
    memset(c->body, 0, sizeof c->body);
    c->len = 0;
    while (at < len && r == DPREC_HTTP1_MORE) {
        size_t n = step == 0 || step > len - at ? len - at : step, used = 0;
        r = dprec_http1_feed(p, (const unsigned char *)text + at, n, &used, collect, c);
        assert_true(used <= n);
        at += used;
        if (r == DPREC_HTTP1_MORE) assert_int_equal(used, n);
    }
    if (r == DPREC_HTTP1_MORE && eof) r = dprec_http1_eof(p);
    if (taken != NULL) *taken = at;
    return r;
}

static void test_http1_reads_a_body_by_its_length_in_every_split(void **state) {
    (void)state;
    const char *text = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n"
                       "Retry-After: 7\r\n\r\n{\"token\":\"x\"}";
    for (size_t step = 0; step <= strlen(text); step++) {
        dprec_http1 p;
        collected c = {{0}, 0, 0};
        size_t taken = 0;
        assert_int_equal(feed(&p, text, step, 0, &c, &taken), DPREC_HTTP1_DONE);
        assert_int_equal(taken, strlen(text));
        assert_int_equal(p.status, 200);
        assert_int_equal(p.retry_after, 7);
        assert_int_equal(c.len, 13);
        assert_memory_equal(c.body, "{\"token\":\"x\"}", 13);
        assert_true(dprec_http1_reusable(&p));
    }
}

static void test_http1_reads_a_chunked_body_with_extensions_and_trailers_in_every_split(void **state) {
    (void)state;
    const char *text = "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n"
                       "5;name=value\r\nhello\r\n1A\r\n abcdefghijklmnopqrstuvwxy\r\n0\r\nX-Trailer: 1\r\n\r\n";
    for (size_t step = 0; step <= strlen(text); step++) {
        dprec_http1 p;
        collected c = {{0}, 0, 0};
        assert_int_equal(feed(&p, text, step, 0, &c, NULL), DPREC_HTTP1_DONE);
        assert_int_equal(p.status, 404);
        assert_int_equal(c.len, 31);
        assert_memory_equal(c.body, "hello abcdefghijklmnopqrstuvwxy", 31);
        assert_true(dprec_http1_reusable(&p));
    }
}

static void test_http1_reads_a_body_without_length_up_to_the_close(void **state) {
    (void)state;
    dprec_http1 p;
    collected c = {{0}, 0, 0};
    assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\n\r\nuntil the end", 3, 1, &c, NULL), DPREC_HTTP1_DONE);
    assert_int_equal(c.len, 13);
    assert_false(dprec_http1_reusable(&p));
    /* the same after an unknown coding */
    assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\nabc", 0, 1, &c,
                          NULL), DPREC_HTTP1_DONE);
    assert_int_equal(c.len, 3);
    assert_false(dprec_http1_reusable(&p));
}

static void test_http1_skips_interim_responses_and_knows_bodyless_statuses(void **state) {
    (void)state;
    dprec_http1 p;
    collected c = {{0}, 0, 0};
    assert_int_equal(feed(&p, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n"
                              "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 1, 0, &c, NULL), DPREC_HTTP1_DONE);
    assert_int_equal(p.status, 201);
    assert_int_equal(c.len, 2);
    size_t taken = 0;
    const char *two = "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n";
    assert_int_equal(feed(&p, two, 0, 0, &c, &taken), DPREC_HTTP1_DONE);
    assert_int_equal(p.status, 204);
    assert_int_equal(taken, strlen("HTTP/1.1 204 No Content\r\n\r\n")); /* the next response is left alone */
    assert_int_equal(c.len, 0);
    assert_int_equal(feed(&p, "HTTP/1.1 101 Switching Protocols\r\n\r\n", 0, 0, &c, NULL), DPREC_HTTP1_BAD);
}

static void test_http1_reads_connection_and_the_http_1_0_default(void **state) {
    (void)state;
    dprec_http1 p;
    collected c = {{0}, 0, 0};
    assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n", 0, 0, &c, NULL),
                     DPREC_HTTP1_DONE);
    assert_false(dprec_http1_reusable(&p));
    assert_int_equal(feed(&p, "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 0, 0, &c, NULL), DPREC_HTTP1_DONE);
    assert_false(dprec_http1_reusable(&p));
    assert_int_equal(feed(&p, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", 0, 0, &c, NULL),
                     DPREC_HTTP1_DONE);
    assert_true(dprec_http1_reusable(&p));
    /* both a coding and a length: the coding decides, and the connection is not reused */
    assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "2\r\nab\r\n0\r\n\r\n", 0, 0, &c, NULL), DPREC_HTTP1_DONE);
    assert_int_equal(c.len, 2);
    assert_false(dprec_http1_reusable(&p));
    /* a date in Retry-After is not a number of seconds */
    assert_int_equal(feed(&p, "HTTP/1.1 503 Busy\r\nRetry-After: Fri, 31 Dec 1999 23:59:59 GMT\r\nContent-Length: 0"
                              "\r\n\r\n", 0, 0, &c, NULL), DPREC_HTTP1_DONE);
    assert_int_equal(p.retry_after, 0);
}

static void test_http1_refuses_malformed_answers(void **state) {
    (void)state;
    static const char *const bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 200OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nName : value\r\n\r\n",
        "HTTP/1.1 200 OK\r\nA: b\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dprec_http1 p;
        collected c = {{0}, 0, 0};
        int r = feed(&p, bad[i], 0, 1, &c, NULL);
        if (r != DPREC_HTTP1_BAD) fprintf(stderr, "accepted: %s\n", bad[i]);
        assert_int_equal(r, DPREC_HTTP1_BAD);
        size_t used = 0;
        assert_int_equal(dprec_http1_feed(&p, (const unsigned char *)"x", 1, &used, collect, &c), DPREC_HTTP1_BAD);
    }
}

static void test_http1_bounds_lines_and_heads(void **state) {
    (void)state;
    static char text[3 * DPREC_HTTP1_HEAD_MAX];
    dprec_http1 p;
    collected c = {{0}, 0, 0};
    /* one line longer than a line may be */
    int n = snprintf(text, sizeof text, "HTTP/1.1 200 OK\r\nX: ");
    memset(text + n, 'a', DPREC_HTTP1_LINE_MAX);
    strcpy(text + n + DPREC_HTTP1_LINE_MAX, "\r\n\r\n");
    assert_int_equal(feed(&p, text, 0, 0, &c, NULL), DPREC_HTTP1_BAD);
    /* many short lines past the head's bound */
    n = snprintf(text, sizeof text, "HTTP/1.1 200 OK\r\n");
    while ((size_t)n < 2 * DPREC_HTTP1_HEAD_MAX) n += snprintf(text + n, sizeof text - (size_t)n, "X-Pad: 0123456789\r\n");
    strcpy(text + n, "\r\n");
    assert_int_equal(feed(&p, text, 0, 0, &c, NULL), DPREC_HTTP1_BAD);
    /* interim responses count towards the same bound */
    n = 0;
    while ((size_t)n < 2 * DPREC_HTTP1_HEAD_MAX) n += snprintf(text + n, sizeof text - (size_t)n, "HTTP/1.1 100 Continue\r\n\r\n");
    assert_int_equal(feed(&p, text, 0, 0, &c, NULL), DPREC_HTTP1_BAD);
}

static void test_http1_stops_when_the_sink_says_so_and_keeps_its_code(void **state) {
    (void)state;
    dprec_http1 p;
    collected c = {{0}, 0, 4};
    assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", 2, 0, &c, NULL),
                     DPREC_HTTP1_SINK);
    assert_int_equal(p.sink_rc, 77);
    assert_true(c.len >= 4 && c.len <= 5); /* no call after the one that said stop (the head's length is odd) */
    assert_false(dprec_http1_reusable(&p));
    assert_int_equal(dprec_http1_eof(&p), DPREC_HTTP1_SINK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http1_reads_a_body_by_its_length_in_every_split),
        cmocka_unit_test(test_http1_reads_a_chunked_body_with_extensions_and_trailers_in_every_split),
        cmocka_unit_test(test_http1_reads_a_body_without_length_up_to_the_close),
        cmocka_unit_test(test_http1_skips_interim_responses_and_knows_bodyless_statuses),
        cmocka_unit_test(test_http1_reads_connection_and_the_http_1_0_default),
        cmocka_unit_test(test_http1_refuses_malformed_answers),
        cmocka_unit_test(test_http1_bounds_lines_and_heads),
        cmocka_unit_test(test_http1_stops_when_the_sink_says_so_and_keeps_its_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
