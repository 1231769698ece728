/* Fuzz target: the mbedTLS transport's HTTP/1.1 response parser (platform/mbedtls/http1.c), which reads whatever the
 * server sends back: a broken or hostile server must not break the device. Byte 0 picks the size of the pieces the
 * rest is fed in (1 .. 256); the text is also fed whole, then the end of the connection. Both ways must agree on
 * everything: the outcome, the bytes taken, the status, the body. A body never holds more bytes than arrived, and
 * a complete response has a final status. */
#include <string.h>

#include "fuzz.h"
#include "http1.h"

typedef struct body {
    unsigned char bytes[1 << 16];
    size_t len;
    uint64_t calls;
} body;

static int take(void *user, const unsigned char *chunk, size_t len) {
    body *b = user;
    FUZZ_CHECK(len > 0);
    size_t n = len < sizeof b->bytes - b->len ? len : sizeof b->bytes - b->len;
    memcpy(b->bytes + b->len, chunk, n);
    b->len += n;
    b->calls++;
    return 0;
}

static int run(const unsigned char *in, size_t len, size_t step, dprec_http1 *p, body *b, size_t *taken) {
    dprec_http1_init(p);
    b->len = 0;
    b->calls = 0;
    size_t at = 0;
    int r = DPREC_HTTP1_MORE;
    while (at < len && r == DPREC_HTTP1_MORE) {
        size_t n = len - at < step ? len - at : step, used = 0;
        r = dprec_http1_feed(p, in + at, n, &used, take, b);
        FUZZ_CHECK(used <= n);
        FUZZ_CHECK(r != DPREC_HTTP1_MORE || used == n);
        at += used;
    }
    if (r == DPREC_HTTP1_MORE) r = dprec_http1_eof(p);
    *taken = at;
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > sizeof(((body *)0)->bytes)) return 0;
    size_t step = (size_t)data[0] + 1;
    static dprec_http1 whole_p, piece_p;
    static body whole_b, piece_b;
    size_t whole_taken, piece_taken;
    int whole = run(data + 1, size - 1, size, &whole_p, &whole_b, &whole_taken);
    int piece = run(data + 1, size - 1, step, &piece_p, &piece_b, &piece_taken);
    FUZZ_CHECK(whole == piece);
    FUZZ_CHECK(whole_taken == piece_taken);
    FUZZ_CHECK(whole_b.len == piece_b.len && memcmp(whole_b.bytes, piece_b.bytes, whole_b.len) == 0);
    FUZZ_CHECK(whole_b.len <= size - 1);
    FUZZ_CHECK(whole != DPREC_HTTP1_SINK);
    if (whole == DPREC_HTTP1_DONE) {
        FUZZ_CHECK(whole_p.status >= 200 && whole_p.status <= 999 && whole_p.status == piece_p.status);
        FUZZ_CHECK(whole_p.retry_after == piece_p.retry_after);
        FUZZ_CHECK(dprec_http1_reusable(&whole_p) == dprec_http1_reusable(&piece_p));
    }
    return 0;
}
