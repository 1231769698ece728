/* Tests for common/release.c: the release formats (1, float32 rows; 2, compact rows; 3, rows with per-item columns),
 * the whole-buffer check, row access, streaming reader and writer. Test data comes from a fixed-seed LCG, so every run sees the same bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "dprec/release.h"
#include "mbedtls_compat.h"

/* ---- helpers ------------------------------------------------------------------------------------------ */

typedef struct lcg {
    uint32_t s;
} lcg;

static uint32_t lcg_next(lcg *g) {
    g->s = g->s * 1664525u + 1013904223u; /* Numerical Recipes constants */
    return g->s >> 8;                     /* the low bits of an LCG are weak */
}

static float lcg_float(lcg *g) { /* uniform in [-1, 1) */
    return (float)lcg_next(g) / 8388608.0f - 1.0f;
}

typedef struct fixture {
    uint32_t m, d;
    int biases;
    float *v;
    float *bias;
    dprec_release_info info;
    unsigned char *buf;
    size_t len;
    unsigned char *unc;     /* m * DPREC_RELEASE_UNCERTAINTY_WIDTH column bytes (fixture_columns > 0), else NULL */
    unsigned char *unknown; /* m * UNKNOWN_WIDTH (fixture_columns == 2) */
} fixture;

/* The encoding fixture_make writes (0: float32 rows; DPREC_RELEASE_ENC_Q16 or _Q8: a compact release). */
static uint16_t fixture_encoding;
/* The columns fixture_make writes (format 3): 0 none; 1 the items' uncertainty; 2 an unknown, skippable column of 3
 * bytes an item first, then the uncertainty. Their bytes come from the LCG too (fixture.cols). */
static int fixture_columns;
#define UNKNOWN_TYPE 9u
#define UNKNOWN_WIDTH 3u

/* Writes a release with LCG values; the caller frees with fixture_free. */
static void fixture_make(fixture *f, uint32_t m, uint32_t d, int biases, uint32_t seed) {
    lcg g = {seed};
    size_t i, written = 0;
    uint64_t total;

    memset(f, 0, sizeof *f);
    f->m = m;
    f->d = d;
    f->biases = biases;
    f->v = malloc(sizeof(float) * m * d);
    assert_non_null(f->v);
    for (i = 0; i < (size_t)m * d; i++) f->v[i] = lcg_float(&g);
    if (biases) {
        f->bias = malloc(sizeof(float) * m);
        assert_non_null(f->bias);
        for (i = 0; i < m; i++) f->bias[i] = 0.5f * lcg_float(&g);
    }
    f->info.release_version = 7;
    f->info.job_id = 0x1122334455667788ull;
    f->info.num_items = m;
    f->info.dim = d;
    f->info.rating_min = 1.0f;
    f->info.rating_max = 5.0f;
    f->info.global_mean = biases ? 3.25f : 0.0f;
    f->info.flags = fixture_encoding;
    dprec_release_column_data cols[2];
    uint32_t ncols = 0, colw = 0;
    if (fixture_columns == 2) {
        f->unknown = malloc((size_t)m * UNKNOWN_WIDTH);
        assert_non_null(f->unknown);
        for (i = 0; i < (size_t)m * UNKNOWN_WIDTH; i++) f->unknown[i] = (unsigned char)lcg_next(&g);
        cols[ncols++] = (dprec_release_column_data){UNKNOWN_TYPE, 0, UNKNOWN_WIDTH, f->unknown};
        colw += UNKNOWN_WIDTH;
    }
    if (fixture_columns > 0) {
        f->unc = malloc((size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
        assert_non_null(f->unc);
        for (i = 0; i < (size_t)m * DPREC_RELEASE_UNCERTAINTY_WIDTH; i++) f->unc[i] = (unsigned char)lcg_next(&g);
        cols[ncols++] = (dprec_release_column_data){DPREC_RELEASE_COL_UNCERTAINTY, DPREC_RELEASE_UNC_PINNED0,
                                                    DPREC_RELEASE_UNCERTAINTY_WIDTH, f->unc};
        colw += DPREC_RELEASE_UNCERTAINTY_WIDTH;
    }
    total = dprec_release_size_columns(m, d, (uint16_t)((biases ? DPREC_RELEASE_HAS_BIASES : 0) | fixture_encoding),
                                       colw, 0);
    assert_true(total > 0);
    f->buf = malloc((size_t)total);
    assert_non_null(f->buf);
    assert_int_equal(dprec_release_write_columns(f->buf, (size_t)total, &f->info, f->v, f->bias, cols, ncols, &written),
                     DPREC_OK);
    assert_int_equal(written, total);
    f->len = written;
}

static void fixture_free(fixture *f) {
    free(f->v);
    free(f->bias);
    free(f->buf);
    free(f->unc);
    free(f->unknown);
}

/* Recomputes the digest of a release (cap bytes of storage) whose header or body was patched, where the
 * header's m and d say it belongs; does nothing when they point outside the buffer (such a header fails
 * before its digest is looked at). */
static void rehash(unsigned char *buf, size_t cap) {
    uint64_t m = dprec_ld32(buf + 24), d = dprec_ld32(buf + 28);
    uint16_t flags = dprec_ld16(buf + 6);
    uint64_t rb = (flags & DPREC_RELEASE_HAS_BIASES) ? 4u : 0u;
    if (flags & DPREC_RELEASE_ENC_Q16) rb += 4u + 2u * d;
    else if (flags & DPREC_RELEASE_ENC_Q8) rb += 4u + d;
    else rb += 4u * d;
    if (dprec_ld16(buf + 4) == DPREC_RELEASE_FORMAT_COLUMNS) /* the column table's widths */
        for (unsigned i = 0; i < DPREC_RELEASE_MAX_COLUMNS; i++) rb += dprec_ld16(buf + 48 + 4 * i + 2);
    uint64_t body_end = 64u + m * rb;

    if (body_end + 32u > cap) return;
    assert_int_equal(dprec_sha256(buf, (size_t)body_end, buf + body_end), 0);
}

/* Copies a release into a fresh buffer of len + extra bytes (zero-filled beyond len). */
static unsigned char *dup_buf(const unsigned char *buf, size_t len, size_t extra) {
    unsigned char *p = calloc(1, len + extra + 1);
    assert_non_null(p);
    memcpy(p, buf, len);
    return p;
}

/* Records what the reader delivers and compares it with dprec_release_row on the reference buffer. */
typedef struct collector {
    const unsigned char *ref;          /* a release that passed dprec_release_check, or NULL */
    const dprec_release_info *ref_info;
    uint32_t calls;
    uint32_t abort_at;                 /* return abort_rc when item == abort_at */
    int abort_rc;
    int mismatches;
} collector;

static int collect_row(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    collector *c = user;
    float want[DPREC_MAX_DIM], want_bias = -1.0f;

    if (item != c->calls) c->mismatches++; /* rows must arrive in order, each once */
    c->calls++;
    if (c->ref != NULL) {
        if (dim != c->ref_info->dim ||
            dprec_release_row(c->ref, c->ref_info, item, want, &want_bias) != DPREC_OK ||
            memcmp(want, row, sizeof(float) * dim) != 0 || memcmp(&want_bias, &bias, sizeof bias) != 0) {
            c->mismatches++;
        }
    }
    if (c->abort_rc != 0 && item == c->abort_at) return c->abort_rc;
    return 0;
}

/* Feeds buf in chunks of `chunk` bytes (0: random sizes from an LCG with seed `seed`) and finishes.
 * Returns the first non-OK status, as an app would see it. */
static int feed_all(dprec_release_reader *r, collector *c, const unsigned char *buf, size_t len,
                    size_t chunk, uint32_t seed) {
    lcg g = {seed};
    size_t off = 0;
    int rc;

    dprec_release_reader_init(r, c != NULL ? collect_row : NULL, c);
    while (off < len) {
        size_t n = chunk != 0 ? chunk : (size_t)(lcg_next(&g) % 200u);
        if (n > len - off) n = len - off;
        rc = dprec_release_reader_feed(r, buf + off, n);
        if (rc != DPREC_OK) {
            /* sticky: later feeds and finish repeat it */
            assert_int_equal(dprec_release_reader_feed(r, buf, 1), rc);
            assert_int_equal(dprec_release_reader_finish(r), rc);
            return rc;
        }
        off += n;
    }
    rc = dprec_release_reader_finish(r);
    if (rc != DPREC_OK) { /* a failed finish is sticky too, even if the missing bytes turn up later */
        assert_int_equal(dprec_release_reader_feed(r, buf, 1), rc);
        assert_int_equal(dprec_release_reader_finish(r), rc);
    }
    return rc;
}

static dprec_release_reader reader; /* big (a row buffer and more): keep it off the test's stack */

/* ---- round trips -------------------------------------------------------------------------------------- */

static void round_trip(uint32_t m, uint32_t d, int biases) {
    fixture f;
    dprec_release_info info;
    float row[DPREC_MAX_DIM], b;
    uint32_t j;

    fixture_make(&f, m, d, biases, 1234u + m + d);
    assert_int_equal(f.len, 64u + (size_t)m * (d + (biases ? 1u : 0u)) * 4u + 32u);
    assert_int_equal(dprec_release_check(f.buf, f.len, &info), DPREC_OK);
    assert_int_equal(info.format_version, 1);
    assert_int_equal(info.flags, biases ? DPREC_RELEASE_HAS_BIASES : 0);
    assert_int_equal(info.release_version, 7);
    assert_true(info.job_id == 0x1122334455667788ull);
    assert_int_equal(info.num_items, m);
    assert_int_equal(info.dim, d);
    assert_true(info.rating_min == 1.0f && info.rating_max == 5.0f);
    assert_true(info.global_mean == (biases ? 3.25f : 0.0f));
    assert_int_equal(info.sig_alg, DPREC_SIG_NONE);
    assert_int_equal(info.sig_len, 0);
    assert_int_equal(info.total_size, f.len);
    assert_memory_equal(info.digest, f.info.digest, 32);
    assert_memory_equal(info.digest, f.buf + f.len - 32, 32);
    for (j = 0; j < m; j++) {
        b = -99.0f;
        assert_int_equal(dprec_release_row(f.buf, &info, j, row, &b), DPREC_OK);
        assert_memory_equal(row, f.v + (size_t)j * d, sizeof(float) * d);
        assert_true(b == (biases ? f.bias[j] : 0.0f));
        assert_int_equal(dprec_release_row(f.buf, &info, j, row, NULL), DPREC_OK); /* bias may be NULL */
    }
    fixture_free(&f);
}

static void test_release_round_trips_without_biases(void **state) {
    (void)state;
    round_trip(1, 1, 0);
    round_trip(17, 5, 0);
    round_trip(3, DPREC_MAX_DIM, 0);
}

static void test_release_round_trips_with_biases(void **state) {
    (void)state;
    round_trip(1, 1, 1);
    round_trip(17, 5, 1);
    round_trip(3, DPREC_MAX_DIM, 1);
}

static void test_release_row_refuses_item_out_of_range(void **state) {
    fixture f;
    float row[8];
    (void)state;
    fixture_make(&f, 4, 8, 1, 5u);
    assert_int_equal(dprec_release_row(f.buf, &f.info, 3, row, NULL), DPREC_OK);
    assert_int_equal(dprec_release_row(f.buf, &f.info, 4, row, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_row(f.buf, &f.info, UINT32_MAX, row, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_row(f.buf, &f.info, 0, NULL, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_row(NULL, &f.info, 0, row, NULL), DPREC_ERR_INVALID_ARGUMENT);
    fixture_free(&f);
}

/* ---- streaming ---------------------------------------------------------------------------------------- */

static void reader_matches_check(uint32_t m, uint32_t d, int biases) {
    static const size_t chunks[] = {1, 3, 7, 64, 1000, 0 /* whole buffer */};
    fixture f;
    dprec_release_info info;
    size_t i;
    uint32_t seed;

    fixture_make(&f, m, d, biases, 99u + d);
    assert_int_equal(dprec_release_check(f.buf, f.len, &info), DPREC_OK);
    for (i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        collector c = {f.buf, &info, 0, 0, 0, 0};
        size_t chunk = chunks[i] != 0 ? chunks[i] : f.len;
        assert_int_equal(feed_all(&reader, &c, f.buf, f.len, chunk, 0), DPREC_OK);
        assert_int_equal(c.calls, m);
        assert_int_equal(c.mismatches, 0);
        assert_int_equal(reader.consumed, f.len);
        assert_memory_equal(&reader.info, &info, sizeof info);
    }
    for (seed = 1; seed <= 5; seed++) { /* random chunkings, including 0-byte feeds */
        collector c = {f.buf, &info, 0, 0, 0, 0};
        assert_int_equal(feed_all(&reader, &c, f.buf, f.len, 0, seed), DPREC_OK);
        assert_int_equal(c.calls, m);
        assert_int_equal(c.mismatches, 0);
        assert_memory_equal(reader.info.digest, info.digest, 32);
    }
    /* on_row may be NULL: validation only */
    assert_int_equal(feed_all(&reader, NULL, f.buf, f.len, 5, 0), DPREC_OK);
    fixture_free(&f);
}

static void test_release_reader_delivers_identical_rows_for_any_chunking(void **state) {
    (void)state;
    reader_matches_check(1, 1, 0);
    reader_matches_check(13, 6, 0);
    reader_matches_check(13, 6, 1);
    reader_matches_check(5, DPREC_MAX_DIM, 1); /* a full 1028-byte row: the reader's largest partial row */
    reader_matches_check(300, 16, 1);
}

static void test_release_reader_accepts_empty_feeds_and_refuses_null(void **state) {
    fixture f;
    (void)state;
    fixture_make(&f, 2, 3, 0, 3u);
    dprec_release_reader_init(&reader, NULL, NULL);
    assert_int_equal(dprec_release_reader_feed(&reader, NULL, 0), DPREC_OK);
    assert_int_equal(dprec_release_reader_feed(&reader, f.buf, 0), DPREC_OK);
    assert_int_equal(dprec_release_reader_feed(&reader, f.buf, f.len), DPREC_OK);
    assert_int_equal(dprec_release_reader_feed(&reader, f.buf, 0), DPREC_OK);
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_OK);
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_OK); /* finish is repeatable */

    dprec_release_reader_init(&reader, NULL, NULL);
    assert_int_equal(dprec_release_reader_feed(&reader, NULL, 4), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_reader_feed(&reader, f.buf, f.len), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_ERR_INVALID_ARGUMENT);

    assert_int_equal(dprec_release_reader_feed(NULL, f.buf, 1), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_reader_finish(NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_release_reader_init(NULL, NULL, NULL); /* no-op, no crash */
    fixture_free(&f);
}

/* ---- digest ------------------------------------------------------------------------------------------- */

static void expect_everywhere(const unsigned char *buf, size_t len, int want) {
    dprec_release_info info;
    collector c = {NULL, NULL, 0, 0, 0, 0};
    assert_int_equal(dprec_release_check(buf, len, &info), want);
    assert_int_equal(feed_all(&reader, &c, buf, len, len > 0 ? len : 1, 0), want);
    assert_int_equal(feed_all(&reader, &c, buf, len, 1, 0), want);
    assert_int_equal(feed_all(&reader, &c, buf, len, 0, 77u), want);
}

static void test_release_rejects_wrong_digest_after_body_byte_flip(void **state) {
    fixture f;
    unsigned char *p;
    (void)state;
    fixture_make(&f, 6, 4, 1, 11u);
    p = dup_buf(f.buf, f.len, 0);
    p[64 + 4 * 7] ^= 0x01; /* lowest mantissa byte of a value: still finite, only the digest can tell */
    expect_everywhere(p, f.len, DPREC_ERR_RELEASE_DIGEST);
    free(p);
    p = dup_buf(f.buf, f.len, 0);
    p[8] ^= 0x01; /* release_version: a header field with no validity rule of its own */
    expect_everywhere(p, f.len, DPREC_ERR_RELEASE_DIGEST);
    free(p);
    fixture_free(&f);
}

static void test_release_rejects_wrong_digest_after_digest_byte_flip(void **state) {
    fixture f;
    size_t i;
    (void)state;
    fixture_make(&f, 6, 4, 0, 12u);
    for (i = f.len - 32; i < f.len; i += 31) { /* the first and the last digest byte */
        unsigned char *p = dup_buf(f.buf, f.len, 0);
        p[i] ^= 0x80;
        expect_everywhere(p, f.len, DPREC_ERR_RELEASE_DIGEST);
        free(p);
    }
    fixture_free(&f);
}

/* ---- sizes -------------------------------------------------------------------------------------------- */

static void test_release_refuses_every_truncation(void **state) {
    fixture f;
    size_t len;
    (void)state;
    fixture_make(&f, 3, 2, 1, 13u);
    for (len = 0; len < f.len; len++) {
        unsigned char *p = dup_buf(f.buf, len, 0); /* exactly len bytes: ASan sees any overread */
        expect_everywhere(p, len, DPREC_ERR_RELEASE_TRUNCATED);
        free(p);
    }
    fixture_free(&f);
}

static void test_release_rejects_trailing_bytes(void **state) {
    fixture f;
    unsigned char *p;
    dprec_release_info info;
    (void)state;
    fixture_make(&f, 3, 2, 0, 14u);
    p = dup_buf(f.buf, f.len, 5);
    assert_int_equal(dprec_release_check(p, f.len + 1, &info), DPREC_ERR_RELEASE_TRAILING);
    expect_everywhere(p, f.len + 5, DPREC_ERR_RELEASE_TRAILING);

    /* the trailing byte arrives in its own feed, after a complete release */
    dprec_release_reader_init(&reader, NULL, NULL);
    assert_int_equal(dprec_release_reader_feed(&reader, p, f.len), DPREC_OK);
    assert_int_equal(dprec_release_reader_feed(&reader, p + f.len, 1), DPREC_ERR_RELEASE_TRAILING);
    assert_int_equal(dprec_release_reader_feed(&reader, p, 0), DPREC_ERR_RELEASE_TRAILING);
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_ERR_RELEASE_TRAILING);

    /* even after a successful finish, more bytes are an error */
    dprec_release_reader_init(&reader, NULL, NULL);
    assert_int_equal(dprec_release_reader_feed(&reader, p, f.len), DPREC_OK);
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_OK);
    assert_int_equal(dprec_release_reader_feed(&reader, p, 1), DPREC_ERR_RELEASE_TRAILING);
    free(p);
    fixture_free(&f);
}

static void test_release_size_follows_the_layout(void **state) {
    (void)state;
    assert_int_equal(dprec_release_size(1, 1, 0, 0), 64 + 4 + 32);
    assert_int_equal(dprec_release_size(1, 1, DPREC_RELEASE_HAS_BIASES, 0), 64 + 8 + 32);
    assert_int_equal(dprec_release_size(10, 4, 0, 8), 64 + 10 * 16 + 32 + 8);
    assert_int_equal(dprec_release_size(10, 4, DPREC_RELEASE_HAS_BIASES, DPREC_RELEASE_MAX_SIG),
                     64 + 10 * 20 + 32 + DPREC_RELEASE_MAX_SIG);
    assert_true(dprec_release_size(DPREC_MAX_ITEMS, DPREC_MAX_DIM, DPREC_RELEASE_HAS_BIASES, 128) ==
                64ull + (uint64_t)DPREC_MAX_ITEMS * (DPREC_MAX_DIM + 1) * 4 + 32 + 128);
    assert_int_equal(dprec_release_size(0, 4, 0, 0), 0);
    assert_int_equal(dprec_release_size(4, 0, 0, 0), 0);
    assert_int_equal(dprec_release_size(DPREC_MAX_ITEMS + 1, 4, 0, 0), 0);
    assert_int_equal(dprec_release_size(4, DPREC_MAX_DIM + 1, 0, 0), 0);
    assert_int_equal(dprec_release_size(4, 4, 0x0008, 0), 0);                  /* an unknown flag */
    assert_int_equal(dprec_release_size(4, 4, DPREC_RELEASE_ENC_MASK, 0), 0);  /* both encodings */
    assert_int_equal(dprec_release_size(4, 4, 0, DPREC_RELEASE_MAX_SIG + 1), 0);
    /* compact rows: [bias] scale, then d int16 or int8 */
    assert_int_equal(dprec_release_size(10, 4, DPREC_RELEASE_ENC_Q16, 0), 64 + 10 * (4 + 8) + 32);
    assert_int_equal(dprec_release_size(10, 4, DPREC_RELEASE_ENC_Q8 | DPREC_RELEASE_HAS_BIASES, 0), 64 + 10 * (8 + 4) + 32);
    assert_int_equal(dprec_release_size(100000, 32, DPREC_RELEASE_HAS_BIASES, 72), 13200168);
    assert_int_equal(dprec_release_size(100000, 32, DPREC_RELEASE_HAS_BIASES | DPREC_RELEASE_ENC_Q16, 72), 7200168);
    assert_int_equal(dprec_release_size(100000, 32, DPREC_RELEASE_HAS_BIASES | DPREC_RELEASE_ENC_Q8, 72), 4000168);
}

/* ---- header validation -------------------------------------------------------------------------------- */

typedef struct header_case {
    const char *what;
    size_t off;
    int width;      /* 1, 2, 4: integer patch; -4: float patch */
    uint32_t value;
    float fvalue;
    int want;
} header_case;

static void patch(unsigned char *p, const header_case *hc) {
    switch (hc->width) {
    case 1: p[hc->off] = (unsigned char)hc->value; break;
    case 2: dprec_st16(p + hc->off, (uint16_t)hc->value); break;
    case 4: dprec_st32(p + hc->off, hc->value); break;
    default: dprec_stf32(p + hc->off, hc->fvalue); break;
    }
}

static void test_release_rejects_inconsistent_headers(void **state) {
    static const header_case cases[] = {
        {"bad magic", 0, 1, 'X', 0, DPREC_ERR_RELEASE_MAGIC},
        {"bad magic (last byte)", 3, 1, 'W', 0, DPREC_ERR_RELEASE_MAGIC},
        {"version 0", 4, 2, 0, 0, DPREC_ERR_RELEASE_VERSION},
        {"version 4", 4, 2, 4, 0, DPREC_ERR_RELEASE_VERSION},
        {"version 3 without a column", 4, 2, 3, 0, DPREC_ERR_RELEASE_HEADER},
        {"version 2 with float32 rows", 4, 2, 2, 0, DPREC_ERR_RELEASE_HEADER},
        {"version 1 with a compact encoding", 6, 2, DPREC_RELEASE_ENC_Q16, 0, DPREC_ERR_RELEASE_HEADER},
        {"unknown flag 0x0008", 6, 2, 0x0008, 0, DPREC_ERR_RELEASE_HEADER},
        {"unknown flag 0x8000", 6, 2, 0x8000, 0, DPREC_ERR_RELEASE_HEADER},
        {"m = 0", 24, 4, 0, 0, DPREC_ERR_RELEASE_HEADER},
        {"m > DPREC_MAX_ITEMS", 24, 4, DPREC_MAX_ITEMS + 1, 0, DPREC_ERR_RELEASE_HEADER},
        {"m = UINT32_MAX", 24, 4, UINT32_MAX, 0, DPREC_ERR_RELEASE_HEADER},
        {"d = 0", 28, 4, 0, 0, DPREC_ERR_RELEASE_HEADER},
        {"d > DPREC_MAX_DIM", 28, 4, DPREC_MAX_DIM + 1, 0, DPREC_ERR_RELEASE_HEADER},
        {"rating_min == rating_max", 32, -4, 0, 5.0f, DPREC_ERR_RELEASE_HEADER},
        {"rating_min > rating_max", 32, -4, 0, 6.0f, DPREC_ERR_RELEASE_HEADER},
        {"rating_max < rating_min", 36, -4, 0, 0.5f, DPREC_ERR_RELEASE_HEADER},
        {"rating_min NaN", 32, -4, 0, NAN, DPREC_ERR_RELEASE_HEADER},
        {"rating_min -Inf", 32, -4, 0, -INFINITY, DPREC_ERR_RELEASE_HEADER},
        {"rating_max Inf", 36, -4, 0, INFINITY, DPREC_ERR_RELEASE_HEADER},
        {"global mean without biases", 40, -4, 0, 3.0f, DPREC_ERR_RELEASE_HEADER},
        {"global mean NaN", 40, -4, 0, NAN, DPREC_ERR_RELEASE_HEADER},
        {"global mean past the value bound", 40, -4, 0, 1048577.0f, DPREC_ERR_RELEASE_HEADER},
        {"unknown sig_alg", 44, 2, 2, 0, DPREC_ERR_RELEASE_HEADER},
        {"sig_len without sig_alg", 46, 2, 8, 0, DPREC_ERR_RELEASE_HEADER},
        {"sig_alg without sig_len", 44, 2, DPREC_SIG_ECDSA_P256_SHA256, 0, DPREC_ERR_RELEASE_HEADER},
        {"reserved byte 48", 48, 1, 1, 0, DPREC_ERR_RELEASE_HEADER},
        {"reserved byte 63", 63, 1, 0x80, 0, DPREC_ERR_RELEASE_HEADER},
    };
    fixture f;
    size_t i;
    (void)state;
    fixture_make(&f, 4, 3, 0, 15u);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *p = dup_buf(f.buf, f.len, 0);
        dprec_release_info info;
        size_t k;
        int rc;

        patch(p, &cases[i]);
        rehash(p, f.len); /* so that the header rule, not the digest, is what fails */
        rc = dprec_release_parse_header(p, 64, &info);
        if (rc != cases[i].want) fail_msg("%s: parse_header returned %d, want %d", cases[i].what, rc, cases[i].want);
        rc = dprec_release_check(p, f.len, &info);
        if (rc != cases[i].want) fail_msg("%s: check returned %d, want %d", cases[i].what, rc, cases[i].want);
        expect_everywhere(p, f.len, cases[i].want);
        /* the error comes on the feed that completes the header, not before */
        dprec_release_reader_init(&reader, NULL, NULL);
        for (k = 0; k < 63; k++) assert_int_equal(dprec_release_reader_feed(&reader, p + k, 1), DPREC_OK);
        assert_int_equal(dprec_release_reader_feed(&reader, p + 63, 1), cases[i].want);
        free(p);
    }
    fixture_free(&f);
}

static void test_release_rejects_signature_longer_than_the_maximum(void **state) {
    fixture f;
    unsigned char *p;
    dprec_release_info info;
    (void)state;
    fixture_make(&f, 2, 2, 0, 16u);
    p = dup_buf(f.buf, f.len, DPREC_RELEASE_MAX_SIG + 1);
    dprec_st16(p + 44, DPREC_SIG_ECDSA_P256_SHA256);
    dprec_st16(p + 46, DPREC_RELEASE_MAX_SIG);
    rehash(p, f.len);
    assert_int_equal(dprec_release_check(p, f.len + DPREC_RELEASE_MAX_SIG, &info), DPREC_OK);
    dprec_st16(p + 46, DPREC_RELEASE_MAX_SIG + 1);
    rehash(p, f.len);
    assert_int_equal(dprec_release_check(p, f.len + DPREC_RELEASE_MAX_SIG + 1, &info), DPREC_ERR_RELEASE_HEADER);
    free(p);
    fixture_free(&f);
}

static void test_release_parse_header_refuses_short_or_null_input(void **state) {
    fixture f;
    dprec_release_info info;
    (void)state;
    fixture_make(&f, 2, 2, 1, 17u);
    assert_int_equal(dprec_release_parse_header(f.buf, 63, &info), DPREC_ERR_RELEASE_TRUNCATED);
    assert_int_equal(dprec_release_parse_header(f.buf, 64, &info), DPREC_OK);
    assert_int_equal(info.total_size, f.len);
    assert_int_equal(dprec_release_parse_header(NULL, 64, &info), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_parse_header(f.buf, 64, NULL), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_check(NULL, 64, &info), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_check(f.buf, f.len, NULL), DPREC_ERR_INVALID_ARGUMENT);
    fixture_free(&f);
}

/* ---- values ------------------------------------------------------------------------------------------- */

/* NaN, the infinities, and finite values past the public bound 2^20 (a signed but crafted release could use
 * one to make the local step overflow for the users who rated that item only); the bound itself is fine. */
static void test_release_rejects_nan_inf_and_values_past_the_bound_in_the_body(void **state) {
    static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, 1048577.0f, -1048577.0f, 1e30f};
    fixture f;
    size_t i;
    (void)state;
    fixture_make(&f, 5, 3, 1, 18u);
    {
        unsigned char *p = dup_buf(f.buf, f.len, 0);
        dprec_stf32(p + 64 + 2 * 16 + 4 * 2, DPREC_RELEASE_VALUE_MAX);
        dprec_stf32(p + 64 + 3 * 16, -DPREC_RELEASE_VALUE_MAX);
        rehash(p, f.len);
        expect_everywhere(p, f.len, DPREC_OK);
        free(p);
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t where[2];
        size_t w;
        where[0] = 64 + 2 * 16 + 4 * 2; /* row 2, value v_2[1] */
        where[1] = 64 + 3 * 16;         /* row 3, its bias */
        for (w = 0; w < 2; w++) {
            unsigned char *p = dup_buf(f.buf, f.len, 0);
            collector c = {NULL, NULL, 0, 0, 0, 0};
            dprec_stf32(p + where[w], bad[i]);
            rehash(p, f.len); /* a correct digest: the value rule alone must refuse it */
            expect_everywhere(p, f.len, DPREC_ERR_RELEASE_VALUE);
            /* rows before the bad one are delivered, the bad one and later ones are not */
            assert_int_equal(feed_all(&reader, &c, p, f.len, 7, 0), DPREC_ERR_RELEASE_VALUE);
            assert_int_equal(c.calls, w == 0 ? 2u : 3u);
            free(p);
        }
    }
    fixture_free(&f);
}

/* ---- callback abort ----------------------------------------------------------------------------------- */

static void test_release_on_row_abort_propagates_and_is_sticky(void **state) {
    static const int codes[] = {42, -1, DPREC_ERR_NO_MEMORY};
    fixture f;
    dprec_release_info info;
    size_t i;
    (void)state;
    fixture_make(&f, 6, 2, 1, 19u);
    assert_int_equal(dprec_release_check(f.buf, f.len, &info), DPREC_OK);
    for (i = 0; i < 3; i++) {
        collector c = {f.buf, &info, 0, 2, codes[i], 0};
        assert_int_equal(feed_all(&reader, &c, f.buf, f.len, 3, 0), codes[i]);
        assert_int_equal(c.calls, 3); /* items 0, 1 and the aborting 2; never 3 */
        assert_int_equal(c.mismatches, 0);
        assert_int_equal(reader.error, codes[i]);

        c.calls = 0;
        dprec_release_reader_init(&reader, collect_row, &c);
        assert_int_equal(dprec_release_reader_feed(&reader, f.buf, f.len), codes[i]); /* all at once */
        assert_int_equal(c.calls, 3);
        assert_int_equal(dprec_release_reader_feed(&reader, f.buf, 0), codes[i]);
        assert_int_equal(dprec_release_reader_finish(&reader), codes[i]);
        assert_int_equal(c.calls, 3);
    }
    fixture_free(&f);
}

/* ---- signature placeholder ---------------------------------------------------------------------------- */

static void test_release_with_signature_bytes_is_consumed_exactly(void **state) {
    static const unsigned char sig[8] = {0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01};
    fixture f;
    unsigned char *p;
    size_t len, chunks[] = {1, 3, 7, 64, 1000};
    size_t i;
    dprec_release_info info, ref;
    (void)state;
    fixture_make(&f, 4, 3, 1, 20u);
    len = f.len + sizeof sig;
    p = dup_buf(f.buf, f.len, sizeof sig + 4);
    dprec_st16(p + 44, DPREC_SIG_ECDSA_P256_SHA256);
    dprec_st16(p + 46, (uint16_t)sizeof sig);
    rehash(p, f.len);
    memcpy(p + f.len, sig, sizeof sig);

    assert_int_equal(dprec_release_check(p, len, &ref), DPREC_OK);
    assert_int_equal(ref.sig_alg, DPREC_SIG_ECDSA_P256_SHA256);
    assert_int_equal(ref.sig_len, 8);
    assert_int_equal(ref.total_size, len);
    assert_int_equal(dprec_release_size(4, 3, DPREC_RELEASE_HAS_BIASES, 8), len);
    for (i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        collector c = {p, &ref, 0, 0, 0, 0};
        assert_int_equal(feed_all(&reader, &c, p, len, chunks[i], 0), DPREC_OK);
        assert_int_equal(c.calls, 4);
        assert_int_equal(c.mismatches, 0);
        assert_int_equal(reader.consumed, len);
        assert_memory_equal(&reader.info, &ref, sizeof ref);
    }
    /* the signature is opaque here: any 8 bytes pass (verifying them is the key API's job) */
    p[len - 1] ^= 0xff;
    expect_everywhere(p, len, DPREC_OK);
    /* one signature byte missing, one too many */
    expect_everywhere(p, len - 1, DPREC_ERR_RELEASE_TRUNCATED);
    expect_everywhere(p, f.len, DPREC_ERR_RELEASE_TRUNCATED);
    expect_everywhere(p, len + 1, DPREC_ERR_RELEASE_TRAILING);
    assert_int_equal(dprec_release_check(p, len + 4, &info), DPREC_ERR_RELEASE_TRAILING);
    free(p);
    fixture_free(&f);
}

/* ---- writer ------------------------------------------------------------------------------------------- */

static void test_release_write_refuses_too_small_buffer(void **state) {
    fixture f;
    unsigned char *out;
    dprec_release_info info;
    size_t written = 123;
    (void)state;
    fixture_make(&f, 5, 4, 1, 21u);
    out = malloc(f.len);
    assert_non_null(out);
    info = f.info;
    assert_int_equal(dprec_release_write(out, f.len - 1, &info, f.v, f.bias, &written), DPREC_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(written, 0);
    assert_int_equal(dprec_release_write(out, 63, &info, f.v, f.bias, &written), DPREC_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(dprec_release_write(out, 0, &info, f.v, f.bias, &written), DPREC_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_OK);
    assert_int_equal(written, f.len);
    assert_memory_equal(out, f.buf, f.len); /* the writer is deterministic */
    free(out);
    fixture_free(&f);
}

static void test_release_write_refuses_invalid_content(void **state) {
    fixture f;
    unsigned char *out;
    dprec_release_info info;
    size_t written;
    float saved;
    (void)state;
    fixture_make(&f, 5, 4, 1, 22u);
    out = malloc(f.len + 64);
    assert_non_null(out);

    saved = f.v[13];
    f.v[13] = NAN;
    info = f.info;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_VALUE);
    f.v[13] = INFINITY;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_VALUE);
    f.v[13] = -2.0f * DPREC_RELEASE_VALUE_MAX;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_VALUE);
    f.v[13] = saved;
    saved = f.bias[4];
    f.bias[4] = -INFINITY;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_VALUE);
    f.bias[4] = saved;

    info = f.info; /* global mean 3.25 but no biases */
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, NULL, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.num_items = 0;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    assert_int_equal(dprec_release_write(out, 0, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.dim = DPREC_MAX_DIM + 1;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.rating_max = info.rating_min;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.rating_min = NAN;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.flags = 0x0008;
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    info.flags = DPREC_RELEASE_ENC_MASK; /* both encodings */
    assert_int_equal(dprec_release_write(out, f.len, &info, f.v, f.bias, &written), DPREC_ERR_RELEASE_HEADER);
    info = f.info;
    assert_int_equal(dprec_release_write(NULL, f.len, &info, f.v, f.bias, &written), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_write(out, f.len, NULL, f.v, f.bias, &written), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_write(out, f.len, &info, NULL, f.bias, &written), DPREC_ERR_INVALID_ARGUMENT);

    /* the writer overrides what it owns: sig fields, format version, flags follow item_bias */
    info = f.info;
    info.sig_alg = 9;
    info.sig_len = 77;
    info.format_version = 3;
    info.flags = 0;
    info.total_size = 1;
    assert_int_equal(dprec_release_write(out, f.len + 64, &info, f.v, f.bias, NULL), DPREC_OK);
    assert_int_equal(info.sig_alg, DPREC_SIG_NONE);
    assert_int_equal(info.sig_len, 0);
    assert_int_equal(info.format_version, 1);
    assert_int_equal(info.flags, DPREC_RELEASE_HAS_BIASES);
    assert_int_equal(info.total_size, f.len);
    assert_memory_equal(out, f.buf, f.len);
    free(out);
    fixture_free(&f);
}

/* ---- compact releases (format 2) ------------------------------------------------------------------------- */

/* Writes m x d values (LCG, times `scale`, row j also times 2^(j mod 5) so that rows have different scales) in the
 * encoding, checks the layout and header, and that every decoded value is within half a quantization step of the
 * original (the step s_j = max_k |v_jk| / Q of its row, plus a float rounding). Biases stay exact. */
static void compact_round_trip(uint16_t enc, uint32_t m, uint32_t d, int biases, float scale) {
    int32_t qmax = enc == DPREC_RELEASE_ENC_Q16 ? 32767 : 127;
    size_t wbytes = enc == DPREC_RELEASE_ENC_Q16 ? 2u : 1u;
    fixture_encoding = enc;
    fixture f;
    fixture_make(&f, m, d, biases, 4321u + m + d);
    fixture_encoding = 0;
    for (uint32_t j = 0; j < m; j++) /* rescale and rewrite: the fixture's values are in [-1, 1) */
        for (uint32_t k = 0; k < d; k++) f.v[(size_t)j * d + k] *= scale * (float)(1u << (j % 5u));
    for (uint32_t k = 0; k < d; k++) f.v[k] = 0.0f; /* row 0 all zero: scale 0 */
    size_t written = 0;
    f.info.flags = enc;
    assert_int_equal(dprec_release_write(f.buf, f.len, &f.info, f.v, f.bias, &written), DPREC_OK);
    assert_int_equal(written, 64u + (size_t)m * ((biases ? 4u : 0u) + 4u + wbytes * d) + 32u);
    dprec_release_info info;
    assert_int_equal(dprec_release_check(f.buf, f.len, &info), DPREC_OK);
    assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COMPACT);
    assert_int_equal(info.flags, (biases ? DPREC_RELEASE_HAS_BIASES : 0) | enc);
    assert_memory_equal(&info, &f.info, offsetof(dprec_release_info, digest));
    float row[DPREC_MAX_DIM], b;
    for (uint32_t j = 0; j < m; j++) {
        const float *v = f.v + (size_t)j * d;
        float mx = 0.0f;
        for (uint32_t k = 0; k < d; k++) mx = fmaxf(mx, fabsf(v[k]));
        assert_int_equal(dprec_release_row(f.buf, &info, j, row, &b), DPREC_OK);
        assert_true(b == (biases ? f.bias[j] : 0.0f));
        for (uint32_t k = 0; k < d; k++) {
            double err = fabs((double)row[k] - (double)v[k]), step = (double)mx / qmax;
            if (!(err <= 0.5 * step * (1.0 + 1e-5) + (double)mx * 1e-7))
                fail_msg("enc %u row %u k %u: %.9g decoded as %.9g (step %.3g)", enc, j, k, v[k], row[k], step);
        }
        if (j == 0) for (uint32_t k = 0; k < d; k++) assert_true(row[k] == 0.0f);
    }
    fixture_free(&f);
}

static void test_compact_releases_round_trip_within_half_a_step(void **state) {
    (void)state;
    uint16_t encs[2] = {DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    for (int e = 0; e < 2; e++) {
        compact_round_trip(encs[e], 1, 1, 0, 1.0f);
        compact_round_trip(encs[e], 17, 5, 1, 1.0f);
        compact_round_trip(encs[e], 40, 32, 1, 0.01f);
        compact_round_trip(encs[e], 6, DPREC_MAX_DIM, 0, 1000.0f);
        compact_round_trip(encs[e], 5, 3, 1, 65536.0f); /* up to 2^20: the scale rule decides */
    }
}

/* A row whose largest value is the bound itself: the writer lowers the scale until s * Q <= 2^20, the rule every
 * reader checks, and the value still decodes within a step of 2^20 and never past it. */
static void test_compact_writer_keeps_the_scale_rule_at_the_bound(void **state) {
    (void)state;
    float v[3] = {DPREC_RELEASE_VALUE_MAX, -DPREC_RELEASE_VALUE_MAX, 0.5f};
    uint16_t encs[2] = {DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    for (int e = 0; e < 2; e++) {
        dprec_release_info info;
        memset(&info, 0, sizeof info);
        info.num_items = 1;
        info.dim = 3;
        info.rating_min = 1.0f;
        info.rating_max = 5.0f;
        info.flags = encs[e];
        unsigned char buf[256];
        size_t written = 0;
        assert_int_equal(dprec_release_write(buf, sizeof buf, &info, v, NULL, &written), DPREC_OK);
        float s = dprec_ldf32(buf + 64), qmax = encs[e] == DPREC_RELEASE_ENC_Q16 ? 32767.0f : 127.0f;
        assert_true(s > 0.0f && s * qmax <= DPREC_RELEASE_VALUE_MAX);
        float row[3];
        assert_int_equal(dprec_release_check(buf, written, &info), DPREC_OK);
        assert_int_equal(dprec_release_row(buf, &info, 0, row, NULL), DPREC_OK);
        assert_true(row[0] <= DPREC_RELEASE_VALUE_MAX && row[0] >= DPREC_RELEASE_VALUE_MAX - s);
        assert_true(row[1] == -row[0]);
    }
}

static void test_compact_reader_delivers_identical_rows_for_any_chunking(void **state) {
    (void)state;
    fixture_encoding = DPREC_RELEASE_ENC_Q8;
    reader_matches_check(1, 1, 0);
    reader_matches_check(13, 6, 1);
    reader_matches_check(5, DPREC_MAX_DIM, 1);
    fixture_encoding = DPREC_RELEASE_ENC_Q16;
    reader_matches_check(1, 1, 1); /* a 10-byte row, longer than the float32 row of d = 1 */
    reader_matches_check(13, 7, 0);
    reader_matches_check(5, DPREC_MAX_DIM, 1);
    fixture_encoding = 0;
}

/* Rule 4 for compact rows: a scale that is negative, not finite, or with s * Q past 2^20, and the one integer outside
 * [-Q, Q] (-128, -32768), are refused by check and reader alike, digest recomputed. */
static void test_compact_rows_past_their_rules_are_refused(void **state) {
    (void)state;
    uint16_t encs[2] = {DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    for (int e = 0; e < 2; e++) {
        fixture_encoding = encs[e];
        fixture f;
        fixture_make(&f, 5, 3, 1, 31u);
        fixture_encoding = 0;
        uint32_t q = encs[e] == DPREC_RELEASE_ENC_Q16 ? 32767u : 127u;
        size_t rb = 4u + 4u + (encs[e] == DPREC_RELEASE_ENC_Q16 ? 6u : 3u);
        size_t scale_at = 64u + 2u * rb + 4u, int_at = scale_at + 4u; /* row 2 */
        float bad_scales[] = {-1.0f, -0.0f, NAN, INFINITY, DPREC_RELEASE_VALUE_MAX / (float)q * 1.001f, 2e20f};
        for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++) {
            unsigned char *p = dup_buf(f.buf, f.len, 0);
            dprec_stf32(p + scale_at, bad_scales[i]);
            rehash(p, f.len);
            expect_everywhere(p, f.len, DPREC_ERR_RELEASE_VALUE);
            free(p);
        }
        unsigned char *p = dup_buf(f.buf, f.len, 0); /* the largest scale the rule allows is fine */
        dprec_stf32(p + scale_at, DPREC_RELEASE_VALUE_MAX / (float)q * 0.999f);
        rehash(p, f.len);
        expect_everywhere(p, f.len, DPREC_OK);
        free(p);
        p = dup_buf(f.buf, f.len, 0);
        if (encs[e] == DPREC_RELEASE_ENC_Q16) dprec_st16(p + int_at + 2, 0x8000u);
        else p[int_at + 1] = 0x80u;
        rehash(p, f.len);
        expect_everywhere(p, f.len, DPREC_ERR_RELEASE_VALUE);
        free(p);
        fixture_free(&f);
    }
}

/* The 2000 mutations of test_release_parsers_agree_on_random_mutations, on compact releases. */
static void parsers_agree_on_mutations_of(uint16_t enc, uint32_t seed);

static void test_compact_parsers_agree_on_random_mutations(void **state) {
    (void)state;
    parsers_agree_on_mutations_of(DPREC_RELEASE_ENC_Q16, 20260601u);
    parsers_agree_on_mutations_of(DPREC_RELEASE_ENC_Q8, 20260602u);
}

/* ---- fuzz --------------------------------------------------------------------------------------------- */

/* 2000 mutations of a small valid release, fed to both parsers. The reader must return exactly what check
 * returns, whatever the chunking (release.c reports errors in stream order for that reason), and a release
 * check accepts must stream without error. Half the mutants get a recomputed digest so that mutations
 * reach the value and size rules instead of all dying at the digest. */
static void parsers_agree_on_mutations_of(uint16_t enc, uint32_t seed) {
    fixture f;
    lcg g = {seed};
    int iter, ok = 0;
    fixture_encoding = enc;
    fixture_make(&f, 4, 3, 1, 23u);
    fixture_encoding = 0;
    fixture_columns = 0;
    for (iter = 0; iter < 2000; iter++) {
        size_t cap = f.len + 64, len = f.len;
        unsigned char *p = dup_buf(f.buf, f.len, 64);
        dprec_release_info info;
        collector c = {NULL, NULL, 0, 0, 0, 0};
        int n = 1 + (int)(lcg_next(&g) % 4u), k, rc_check, rc_read;

        for (k = 0; k < n; k++) {
            uint32_t r = lcg_next(&g);
            size_t at = (size_t)(lcg_next(&g) % (uint32_t)cap);
            switch (r % 7u) {
            case 0: p[at] ^= (unsigned char)(1u << (lcg_next(&g) % 8u)); break; /* bit flip */
            case 1: p[at] = (unsigned char)lcg_next(&g); break;                  /* random byte */
            case 2: p[at % 64] = (unsigned char)lcg_next(&g); break;              /* header byte */
            case 3: len = (size_t)(lcg_next(&g) % (uint32_t)(cap + 1)); break;   /* truncate/extend */
            case 4: dprec_st16(p + 46, (uint16_t)(lcg_next(&g) % 16u)); break;   /* sig_len */
            case 5:
                if (lcg_next(&g) % 2u) { /* the column table (format 3), or the version that gives it meaning */
                    p[48 + lcg_next(&g) % 16u] = (unsigned char)(lcg_next(&g) % 8u);
                    break;
                }
                /* fall through */
            default: dprec_st32(p + 24 + 4 * (lcg_next(&g) % 2u), lcg_next(&g) % 8u); break; /* m or d */
            }
        }
        if (lcg_next(&g) % 2u) rehash(p, cap);
        rc_check = dprec_release_check(p, len, &info);
        rc_read = feed_all(&reader, &c, p, len, 1 + lcg_next(&g) % 50u, 0);
        if (rc_read != rc_check) fail_msg("iteration %d: check %d, reader %d", iter, rc_check, rc_read);
        rc_read = feed_all(&reader, &c, p, len, 0, (uint32_t)iter);
        if (rc_read != rc_check) fail_msg("iteration %d: check %d, reader %d (random chunks)", iter, rc_check, rc_read);
        if (rc_check == DPREC_OK) {
            ok++;
            assert_memory_equal(&reader.info, &info, sizeof info);
        }
        free(p);
    }
    /* the mutations are not all fatal: some mutants (release_version, signature bytes, ...) stay valid */
    print_message("fuzz (encoding %u): %d of 2000 mutants were valid releases\n", enc, ok);
    fixture_free(&f);
}

static void test_release_parsers_agree_on_random_mutations(void **state) {
    (void)state;
    parsers_agree_on_mutations_of(0, 20240601u);
}

/* ---- format 3: per-item columns ---------------------------------------------------------------------------- */

/* The same mutations of releases with columns (the uncertainty column, and an unknown one before it). */
static void test_column_parsers_agree_on_random_mutations(void **state) {
    (void)state;
    fixture_columns = 2;
    parsers_agree_on_mutations_of(0, 20261101u);
    fixture_columns = 1;
    parsers_agree_on_mutations_of(DPREC_RELEASE_ENC_Q8, 20261102u);
}

typedef struct unc_collector {
    const unsigned char *ref;
    const dprec_release_info *info;
    uint32_t calls;
    int mismatches;
} unc_collector;

/* Compares each streamed row and its uncertainty with the buffer's. */
static int collect_unc(void *user, uint32_t item, float bias, const float *row, uint32_t dim) {
    unc_collector *c = user;
    float want[DPREC_MAX_DIM], want_bias;
    dprec_item_uncertainty a, b;
    int ra = dprec_release_reader_uncertainty(&reader, &a), rb = dprec_release_item_uncertainty(c->ref, c->info, item, &b);
    if (item != c->calls || ra != rb || memcmp(&a, &b, sizeof a) != 0) c->mismatches++;
    if (dprec_release_row(c->ref, c->info, item, want, &want_bias) != DPREC_OK ||
        memcmp(want, row, sizeof(float) * dim) != 0 || memcmp(&want_bias, &bias, sizeof bias) != 0)
        c->mismatches++;
    c->calls++;
    return 0;
}

static int stream_uncertainty(const fixture *f, const dprec_release_info *info, size_t chunk, uint32_t seed) {
    unc_collector c = {f->buf, info, 0, 0};
    lcg g = {seed};
    dprec_release_reader_init(&reader, collect_unc, &c);
    for (size_t off = 0; off < f->len;) {
        size_t n = chunk != 0 ? chunk : (size_t)(lcg_next(&g) % 97u);
        if (n > f->len - off) n = f->len - off;
        assert_int_equal(dprec_release_reader_feed(&reader, f->buf + off, n), DPREC_OK);
        off += n;
    }
    assert_int_equal(dprec_release_reader_finish(&reader), DPREC_OK);
    assert_int_equal(c.calls, f->m);
    return c.mismatches;
}

/* A release with columns: format 3, its rows those of the same release without them, each item's uncertainty the
 * decoding of its column bytes, the same from the buffer and from the stream however it is chunked; the unknown column
 * before it is skipped (its offset counted). */
static void test_column_releases_round_trip_with_each_items_uncertainty(void **state) {
    static const uint16_t encodings[] = {0, DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    (void)state;
    for (int cols = 1; cols <= 2; cols++)
        for (size_t e = 0; e < 3; e++) {
            fixture f, plain;
            dprec_release_info info, pinfo;
            fixture_encoding = encodings[e];
            fixture_columns = 0;
            fixture_make(&plain, 7, 3, 1, 555u);
            fixture_columns = cols;
            fixture_make(&f, 7, 3, 1, 555u);
            fixture_columns = 0;
            fixture_encoding = 0;
            uint32_t colw = DPREC_RELEASE_UNCERTAINTY_WIDTH + (cols == 2 ? UNKNOWN_WIDTH : 0u);
            assert_int_equal(dprec_release_check(f.buf, f.len, &info), DPREC_OK);
            assert_int_equal(dprec_release_check(plain.buf, plain.len, &pinfo), DPREC_OK);
            assert_int_equal(info.format_version, DPREC_RELEASE_FORMAT_COLUMNS);
            assert_int_equal(info.flags, pinfo.flags);
            assert_int_equal(f.len, plain.len + 7u * colw);
            assert_int_equal(info.total_size, f.len);
            dprec_release_column list[DPREC_RELEASE_MAX_COLUMNS];
            uint32_t n = 0;
            assert_int_equal(dprec_release_columns(f.buf, 64, list, DPREC_RELEASE_MAX_COLUMNS, &n), DPREC_OK);
            assert_int_equal(n, (uint32_t)cols);
            assert_int_equal(list[n - 1].type, DPREC_RELEASE_COL_UNCERTAINTY);
            assert_int_equal(list[n - 1].width, DPREC_RELEASE_UNCERTAINTY_WIDTH);
            assert_int_equal(list[n - 1].offset, cols == 2 ? UNKNOWN_WIDTH : 0u);
            assert_int_equal(dprec_release_columns(plain.buf, 64, list, DPREC_RELEASE_MAX_COLUMNS, &n), DPREC_OK);
            assert_int_equal(n, 0);
            for (uint32_t j = 0; j < 7; j++) {
                float row[DPREC_MAX_DIM], prow[DPREC_MAX_DIM], b, pb;
                assert_int_equal(dprec_release_row(f.buf, &info, j, row, &b), DPREC_OK);
                assert_int_equal(dprec_release_row(plain.buf, &pinfo, j, prow, &pb), DPREC_OK);
                assert_memory_equal(row, prow, sizeof(float) * 3);
                assert_true(b == pb);
                dprec_item_uncertainty got, want;
                assert_int_equal(dprec_release_item_uncertainty(f.buf, &info, j, &got), DPREC_OK);
                dprec_uncertainty_decode(f.unc + (size_t)j * DPREC_RELEASE_UNCERTAINTY_WIDTH, DPREC_RELEASE_UNC_PINNED0, &want);
                assert_memory_equal(&got, &want, sizeof got);
                assert_int_equal(got.pinned, 1);
                /* a release without the column: the identity, and NOT_FOUND */
                assert_int_equal(dprec_release_item_uncertainty(plain.buf, &pinfo, j, &got), DPREC_ERR_NOT_FOUND);
                assert_true(got.bias_keep == 1.0f && got.v_keep == 1.0f && got.pinned == 0);
            }
            assert_int_equal(stream_uncertainty(&f, &info, f.len, 0), 0);
            assert_int_equal(stream_uncertainty(&f, &info, 1, 0), 0);
            assert_int_equal(stream_uncertainty(&f, &info, 0, 31u + (uint32_t)e), 0);
            dprec_item_uncertainty outside;
            assert_int_equal(dprec_release_reader_uncertainty(&reader, &outside), DPREC_ERR_STATE); /* not in on_row */
            fixture_free(&f);
            fixture_free(&plain);
        }
}

/* A column of a type this build does not know is skipped when it is not critical (above) and refused when it is, by
 * every reader and by the writer: a release that needs it is never misread. */
static void test_a_critical_column_of_an_unknown_type_is_refused(void **state) {
    fixture f;
    (void)state;
    fixture_columns = 2;
    fixture_make(&f, 5, 2, 1, 77u);
    fixture_columns = 0;
    unsigned char *p = dup_buf(f.buf, f.len, 0);
    p[48 + 1] = DPREC_RELEASE_COL_CRITICAL; /* slot 0: the unknown column */
    rehash(p, f.len);
    dprec_release_info info;
    assert_int_equal(dprec_release_parse_header(p, 64, &info), DPREC_ERR_RELEASE_COLUMN);
    expect_everywhere(p, f.len, DPREC_ERR_RELEASE_COLUMN);
    /* the uncertainty column may be critical: a reader that knows it reads it */
    free(p);
    p = dup_buf(f.buf, f.len, 0);
    p[48 + 4 + 1] |= DPREC_RELEASE_COL_CRITICAL;
    rehash(p, f.len);
    expect_everywhere(p, f.len, DPREC_OK);
    free(p);
    /* the writer refuses what the readers would */
    static unsigned char bytes[5 * 3];
    dprec_release_column_data col = {UNKNOWN_TYPE, DPREC_RELEASE_COL_CRITICAL, 3, bytes};
    unsigned char out[512];
    size_t written = 0;
    dprec_release_info wi = f.info;
    assert_int_equal(dprec_release_write_columns(out, sizeof out, &wi, f.v, f.bias, &col, 1, &written),
                     DPREC_ERR_RELEASE_COLUMN);
    fixture_free(&f);
}

/* Column tables the format does not allow are refused at the header, by every reader (DPREC_ERR_RELEASE_HEADER). */
static void test_malformed_column_tables_are_refused(void **state) {
    static const header_case cases[] = {
        {"the uncertainty column 5 bytes wide", 48 + 4 + 2, 2, 5, 0, DPREC_ERR_RELEASE_HEADER},
        {"an unknown flag on the uncertainty column", 48 + 4 + 1, 1, 0x04, 0, DPREC_ERR_RELEASE_HEADER},
        {"a gap before a column", 48, 1, 0, 0, DPREC_ERR_RELEASE_HEADER},
        {"a column 0 bytes wide", 48 + 2, 2, 0, 0, DPREC_ERR_RELEASE_HEADER},
        {"a type twice", 48, 1, DPREC_RELEASE_COL_UNCERTAINTY, 0, DPREC_ERR_RELEASE_HEADER},
        {"an empty slot with flags", 48 + 8 + 1, 1, 1, 0, DPREC_ERR_RELEASE_HEADER},
        {"an empty slot with a width", 48 + 12 + 2, 2, 4, 0, DPREC_ERR_RELEASE_HEADER},
        {"more than 64 column bytes", 48 + 2, 2, 59, 0, DPREC_ERR_RELEASE_HEADER},
        {"format 1 with a column table", 4, 2, 1, 0, DPREC_ERR_RELEASE_HEADER},
        {"format 2 with float32 rows and a column table", 4, 2, 2, 0, DPREC_ERR_RELEASE_HEADER},
    };
    fixture f;
    (void)state;
    fixture_columns = 2;
    fixture_make(&f, 4, 3, 1, 99u);
    fixture_columns = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *p = dup_buf(f.buf, f.len, 0);
        dprec_release_info info;
        patch(p, &cases[i]);
        rehash(p, f.len);
        int rc = dprec_release_parse_header(p, 64, &info);
        if (rc != cases[i].want) fail_msg("%s: parse_header returned %d, want %d", cases[i].what, rc, cases[i].want);
        expect_everywhere(p, f.len, cases[i].want);
        free(p);
    }
    /* and 64 bytes exactly is allowed: the unknown column 58 wide beside the uncertainty's 6 */
    unsigned char *p = dup_buf(f.buf, f.len, 0);
    dprec_st16(p + 48 + 2, 58);
    dprec_release_info info;
    assert_int_equal(dprec_release_parse_header(p, 64, &info), DPREC_OK);
    assert_int_equal(info.total_size, 64u + 4u * (4u + 12u + 64u) + 32u);
    free(p);
    fixture_free(&f);
}

/* The log-scale codes: 0 is exactly 0 and 255 is "no information"; every other code decodes to 2^((c - 128) / 16) and
 * codes back to itself; gains are code / 255; and the shrinkage's limits (dprec_item_uncertainty): no noise keeps the
 * value whole, no spread or no gain keeps nothing, and it never exceeds 1. */
static void test_uncertainty_codes_and_the_limits_of_the_shrinkage(void **state) {
    (void)state;
    assert_true(dprec_uncertainty_sd(0) == 0.0f);
    assert_true(isinf(dprec_uncertainty_sd(255)));
    assert_int_equal(dprec_uncertainty_code(0.0), 0);
    assert_int_equal(dprec_uncertainty_code(-1.0), 0);
    assert_int_equal(dprec_uncertainty_code(NAN), 255);
    assert_int_equal(dprec_uncertainty_code(INFINITY), 255);
    assert_int_equal(dprec_uncertainty_code(1e-30), 1);
    assert_int_equal(dprec_uncertainty_code(1e30), 255);
    assert_true(dprec_uncertainty_sd(128) == 1.0f);
    assert_true(dprec_uncertainty_sd(144) == 2.0f);
    assert_true(dprec_uncertainty_sd(112) == 0.5f);
    for (int c = 1; c <= 254; c++) {
        float sd = dprec_uncertainty_sd((uint8_t)c);
        assert_true(fabs((double)sd / exp2((c - 128) / 16.0) - 1.0) < 1e-6);
        assert_int_equal(dprec_uncertainty_code(sd), c);
        if (c > 1) assert_true(sd > dprec_uncertainty_sd((uint8_t)(c - 1)));
    }
    /* gains: code / 255 */
    assert_true(dprec_uncertainty_gain(0) == 0.0f && dprec_uncertainty_gain(255) == 1.0f);
    assert_int_equal(dprec_uncertainty_gain_code(-1.0), 0);
    assert_int_equal(dprec_uncertainty_gain_code(NAN), 0);
    assert_int_equal(dprec_uncertainty_gain_code(2.0), 255);
    for (int c = 0; c <= 255; c++) assert_int_equal(dprec_uncertainty_gain_code(dprec_uncertainty_gain((uint8_t)c)), c);
    /* [b: noise][gain][spread] then the same for v */
    const unsigned char zero[6] = {0, 120, 100, 0, 0, 0}, none[6] = {120, 200, 0, 120, 0, 100},
                        full[6] = {110, 255, 255, 110, 255, 100}, low[6] = {60, 40, 128, 255, 255, 128};
    dprec_item_uncertainty u;
    dprec_uncertainty_decode(zero, 0, &u);
    assert_true(u.bias_keep == 1.0f && u.v_keep == 1.0f && u.pinned == 0); /* no noise: the identity, whatever the gain */
    dprec_uncertainty_decode(none, DPREC_RELEASE_UNC_PINNED0, &u);
    assert_true(u.bias_keep == 0.0f && u.v_keep == 0.0f && u.pinned == 1); /* no spread, or nothing of the item */
    dprec_uncertainty_decode(full, 0, &u);
    assert_true(u.bias_keep == 1.0f);                     /* an infinite spread: 1 / gain, capped */
    double n = dprec_uncertainty_sd(110), sp = dprec_uncertainty_sd(100); /* gain 1: the James-Stein factor */
    assert_true(fabs(u.v_keep - sp * sp / (sp * sp + n * n)) < 1e-6);
    dprec_uncertainty_decode(low, 0, &u);
    assert_true(u.bias_keep == 1.0f);                     /* gain 40/255, little noise: 1 / gain would exceed 1 */
    assert_true(u.v_keep == 0.0f);                        /* infinite noise: no information */
    /* in between, the formula, decreasing in the noise */
    float last = 1.0f;
    for (int c = 60; c <= 160; c += 5) {
        const unsigned char x[6] = {(unsigned char)c, 200, 120, 0, 0, 0};
        dprec_uncertainty_decode(x, 0, &u);
        double g = 200.0 / 255.0, s2 = pow(dprec_uncertainty_sd(120), 2), n2 = pow(dprec_uncertainty_sd((uint8_t)c), 2);
        double want = g * s2 / (g * g * s2 + n2);
        assert_true(fabs(u.bias_keep - (want < 1.0 ? want : 1.0)) < 1e-6);
        assert_true(u.bias_keep <= last);
        last = u.bias_keep;
    }
    assert_true(last < 0.2f); /* noise 2^(32/16) = 4 times the spread's 2^(-8/16) times 5.7 */
}

/* The bit test every reader uses (bytes.h) is the public bound's own bit pattern, and orders as the values do. */
static void test_the_value_bound_bits_are_the_public_bound(void **state) {
    (void)state;
    float bound = DPREC_RELEASE_VALUE_MAX, above = nextafterf(bound, 2.0f * bound);
    uint32_t bits;
    memcpy(&bits, &bound, sizeof bits);
    assert_int_equal(bits, DPREC_VALUE_MAX_BITS);
    assert_true(dprec_bounded_bits(bits) && dprec_bounded_bits(bits | 0x80000000u));
    memcpy(&bits, &above, sizeof bits);
    assert_false(dprec_bounded_bits(bits) || dprec_bounded_bits(bits | 0x80000000u));
    assert_false(dprec_bounded_bits(0x7fc00000u) || dprec_bounded_bits(0x7f800000u)); /* NaN, +inf */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_value_bound_bits_are_the_public_bound),
        cmocka_unit_test(test_compact_releases_round_trip_within_half_a_step),
        cmocka_unit_test(test_compact_writer_keeps_the_scale_rule_at_the_bound),
        cmocka_unit_test(test_compact_reader_delivers_identical_rows_for_any_chunking),
        cmocka_unit_test(test_compact_rows_past_their_rules_are_refused),
        cmocka_unit_test(test_compact_parsers_agree_on_random_mutations),
        cmocka_unit_test(test_release_round_trips_without_biases),
        cmocka_unit_test(test_release_round_trips_with_biases),
        cmocka_unit_test(test_release_row_refuses_item_out_of_range),
        cmocka_unit_test(test_release_reader_delivers_identical_rows_for_any_chunking),
        cmocka_unit_test(test_release_reader_accepts_empty_feeds_and_refuses_null),
        cmocka_unit_test(test_release_rejects_wrong_digest_after_body_byte_flip),
        cmocka_unit_test(test_release_rejects_wrong_digest_after_digest_byte_flip),
        cmocka_unit_test(test_release_refuses_every_truncation),
        cmocka_unit_test(test_release_rejects_trailing_bytes),
        cmocka_unit_test(test_release_size_follows_the_layout),
        cmocka_unit_test(test_release_rejects_inconsistent_headers),
        cmocka_unit_test(test_release_rejects_signature_longer_than_the_maximum),
        cmocka_unit_test(test_release_parse_header_refuses_short_or_null_input),
        cmocka_unit_test(test_release_rejects_nan_inf_and_values_past_the_bound_in_the_body),
        cmocka_unit_test(test_release_on_row_abort_propagates_and_is_sticky),
        cmocka_unit_test(test_release_with_signature_bytes_is_consumed_exactly),
        cmocka_unit_test(test_release_write_refuses_too_small_buffer),
        cmocka_unit_test(test_release_write_refuses_invalid_content),
        cmocka_unit_test(test_release_parsers_agree_on_random_mutations),
        cmocka_unit_test(test_column_releases_round_trip_with_each_items_uncertainty),
        cmocka_unit_test(test_a_critical_column_of_an_unknown_type_is_refused),
        cmocka_unit_test(test_malformed_column_tables_are_refused),
        cmocka_unit_test(test_uncertainty_codes_and_the_limits_of_the_shrinkage),
        cmocka_unit_test(test_column_parsers_agree_on_random_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
