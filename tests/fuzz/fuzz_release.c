/* Fuzz target: the release reader (common/release.c), buffer and stream. Byte 0 picks the stream's chunk size
 * (1 .. 256); the rest is the release. The two readers must agree on the status and, on success, on every header
 * field and the digest; the stream must hand over exactly m rows, in order, each value within the public bound. */
#include <math.h>
#include <string.h>

#include "dprec/release.h"
#include "fuzz.h"

typedef struct rows {
    uint32_t next;
    int bad;
} rows;

static int on_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    rows *r = user;
    if (item != r->next) r->bad = 1;
    if (!(fabsf(bias) <= DPREC_RELEASE_VALUE_MAX)) r->bad = 1;
    for (uint32_t k = 0; k < dim; k++)
        if (!(fabsf(row[k]) <= DPREC_RELEASE_VALUE_MAX)) r->bad = 1;
    r->next++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t chunk = (size_t)data[0] + 1u;
    data++;
    size--;
    dprec_release_info a, b;
    memset(&a, 0, sizeof a);
    int ra = dprec_release_check(data, size, &a);
    static dprec_release_reader r; /* 2.3 KB: keep it off the fuzzer's stack */
    rows seen = {0, 0};
    dprec_release_reader_init(&r, on_row, &seen);
    int rb = DPREC_OK;
    for (size_t off = 0; off < size && rb == DPREC_OK; off += chunk)
        rb = dprec_release_reader_feed(&r, data + off, size - off < chunk ? size - off : chunk);
    if (rb == DPREC_OK) rb = dprec_release_reader_finish(&r);
    FUZZ_CHECK(ra == rb);
    FUZZ_CHECK(dprec_release_reader_finish(&r) == rb); /* repeatable */
    FUZZ_CHECK(!seen.bad);
    if (ra == DPREC_OK) {
        b = r.info;
        FUZZ_CHECK(memcmp(a.digest, b.digest, sizeof a.digest) == 0);
        FUZZ_CHECK(a.num_items == b.num_items && a.dim == b.dim && a.flags == b.flags && a.sig_len == b.sig_len);
        FUZZ_CHECK(a.total_size == size && seen.next == a.num_items);
        float row[DPREC_MAX_DIM], bias;
        FUZZ_CHECK(dprec_release_row(data, &a, a.num_items - 1u, row, &bias) == DPREC_OK);
        FUZZ_CHECK(dprec_release_row(data, &a, a.num_items, row, &bias) == DPREC_ERR_INVALID_ARGUMENT);
    }
    return 0;
}
