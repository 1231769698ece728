/* Fuzz target: the release reader (common/release.c), buffer and stream. Byte 0 picks the stream's chunk size
 * (1 .. 256); the rest is the release. The two readers must agree on the status and, on success, on every header
 * field and the digest; the stream must hand over exactly m rows, in order, each value within the public bound, and
 * each row's uncertainty (format 3) a shrinkage in [0, 1], the same as the buffer's. */
#include <math.h>
#include <string.h>

#include "dprec/release.h"
#include "fuzz.h"

typedef struct rows {
    uint32_t next;
    int bad;
    int unc_rc;                  /* the last row's dprec_release_reader_uncertainty */
    dprec_item_uncertainty unc;  /* and what it gave */
} rows;

static dprec_release_reader reader; /* 2.3 KB: keep it off the fuzzer's stack */

static int keep_ok(float k) {
    return k >= 0.0f && k <= 1.0f;
}

static int on_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    rows *r = user;
    if (item != r->next) r->bad = 1;
    /* the row's uncertainty (format 3): found or not, a shrinkage in [0, 1] */
    r->unc_rc = dprec_release_reader_uncertainty(&reader, &r->unc);
    if ((r->unc_rc != DPREC_OK && r->unc_rc != DPREC_ERR_NOT_FOUND) || !keep_ok(r->unc.bias_keep) ||
        !keep_ok(r->unc.v_keep) || r->unc.pinned > 1u)
        r->bad = 1;
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
    rows seen;
    memset(&seen, 0, sizeof seen);
    dprec_release_reader_init(&reader, on_row, &seen);
    int rb = DPREC_OK;
    for (size_t off = 0; off < size && rb == DPREC_OK; off += chunk)
        rb = dprec_release_reader_feed(&reader, data + off, size - off < chunk ? size - off : chunk);
    if (rb == DPREC_OK) rb = dprec_release_reader_finish(&reader);
    FUZZ_CHECK(ra == rb);
    FUZZ_CHECK(dprec_release_reader_finish(&reader) == rb); /* repeatable */
    FUZZ_CHECK(!seen.bad);
    if (ra == DPREC_OK) {
        b = reader.info;
        FUZZ_CHECK(memcmp(a.digest, b.digest, sizeof a.digest) == 0);
        FUZZ_CHECK(a.num_items == b.num_items && a.dim == b.dim && a.flags == b.flags && a.sig_len == b.sig_len);
        FUZZ_CHECK(a.total_size == size && seen.next == a.num_items);
        float row[DPREC_MAX_DIM], bias;
        FUZZ_CHECK(dprec_release_row(data, &a, a.num_items - 1u, row, &bias) == DPREC_OK);
        FUZZ_CHECK(dprec_release_row(data, &a, a.num_items, row, &bias) == DPREC_ERR_INVALID_ARGUMENT);
        /* the last item's uncertainty: the buffer's is the stream's */
        dprec_item_uncertainty u;
        FUZZ_CHECK(dprec_release_item_uncertainty(data, &a, a.num_items - 1u, &u) == seen.unc_rc);
        FUZZ_CHECK(memcmp(&u, &seen.unc, sizeof u) == 0);
    }
    return 0;
}
