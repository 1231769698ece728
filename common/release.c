/* dprec — release formats 1 (float32 rows), 2 (compact: quantized rows) and 3 (rows of either kind followed by
 * per-item columns, such as the items' uncertainty): header parsing, whole-buffer check, row access, streaming
 * reader, writer.
 *
 * docs/release-format.md is the format description. Two rules shape this file:
 *  - The whole-buffer check and the streaming reader report the same status for the same bytes, whatever
 *    the chunking: problems are reported in stream order (header, then each complete row's values, then
 *    trailing bytes, then truncation, then the digest), which is the only order a stream can see them in.
 *    So both check values *before* the digest; a flipped body byte that makes a NaN is a VALUE error.
 *  - Nothing here allocates or recurses: the reader keeps its partial header, row and digest in the fixed
 *    buffers of dprec_release_reader, and the SHA-256 context in its `sha` union. */
#include "dprec/release.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bytes.h"
#include "mbedtls_compat.h"
#include "release_priv.h"
#include "sha256.h"

/* The reader stores its SHA-256 context (sha256.h) in storage declared in the public header, so that header needs
 * no internal include. These fail the build if the context grows beyond the reserved space or needs stricter
 * alignment than the union gives. */
_Static_assert(sizeof(dprec_sha2_ctx) <= sizeof(((dprec_release_reader *)0)->sha),
               "dprec_release_reader.sha is too small for dprec_sha2_ctx");
_Static_assert(_Alignof(dprec_sha2_ctx) <= _Alignof(uint64_t),
               "dprec_release_reader.sha is not aligned enough for dprec_sha2_ctx");

/* header field offsets (docs/release-format.md) */
enum {
    OFF_MAGIC = 0,
    OFF_FORMAT_VERSION = 4,
    OFF_FLAGS = 6,
    OFF_RELEASE_VERSION = 8,
    OFF_JOB_ID = 16,
    OFF_NUM_ITEMS = 24,
    OFF_DIM = 28,
    OFF_RATING_MIN = 32,
    OFF_RATING_MAX = 36,
    OFF_GLOBAL_MEAN = 40,
    OFF_SIG_ALG = 44,
    OFF_SIG_LEN = 46,
    OFF_RESERVED = 48
};

#define KNOWN_FLAGS (DPREC_RELEASE_HAS_BIASES | DPREC_RELEASE_ENC_MASK)

/* The format of the rows of a release with these flags (1: float32, 2: compact), or 0 for flags no release may carry:
 * an unknown bit, or both compact encodings. A release of format 3 has rows of either kind, then its columns. */
static uint16_t format_of(uint16_t flags) {
    uint16_t enc = flags & DPREC_RELEASE_ENC_MASK;
    if ((flags & ~KNOWN_FLAGS) != 0u || enc == DPREC_RELEASE_ENC_MASK) return 0;
    return enc == 0u ? (uint16_t)DPREC_RELEASE_FORMAT_VERSION : (uint16_t)DPREC_RELEASE_FORMAT_COMPACT;
}

/* The largest |q| of a compact encoding (the scale's multiplier), 0 for float32 rows. */
static int32_t q_max(uint16_t flags) {
    switch (flags & DPREC_RELEASE_ENC_MASK) {
    case DPREC_RELEASE_ENC_Q16: return 32767;
    case DPREC_RELEASE_ENC_Q8: return 127;
    default: return 0;
    }
}

/* Reader states. The SHA-256 context is live (initialised, not yet freed) exactly in the states below
 * ST_SIGNATURE; every transition out of them frees it once, so no path frees it twice. */
enum {
    ST_HEADER = 0,  /* collecting the 64-byte header in buf */
    ST_BODY = 1,    /* collecting row next_row in buf */
    ST_DIGEST = 2,  /* collecting the 32-byte digest in buf */
    ST_SIGNATURE,   /* skipping sig_len signature bytes; buf[0..32) = received, buf[32..64) = computed */
    ST_DONE,        /* every announced byte has arrived; buf as in ST_SIGNATURE */
    ST_FAILED       /* r->error holds the sticky error */
};

/* Bit test instead of isfinite(): works on the raw little-endian word, needs no <math.h> and cannot be
 * changed by -ffast-math. */
static int finite_bits(uint32_t u) {
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* |x| <= DPREC_RELEASE_VALUE_MAX (2^20), on the raw word (bytes.h; test_release.c checks that
 * DPREC_VALUE_MAX_BITS is the bit pattern of DPREC_RELEASE_VALUE_MAX: a float comparison is not an integer
 * constant expression, which clang's _Static_assert requires). */
static int bounded_bits(uint32_t u) {
    return dprec_bounded_bits(u);
}

static int bounded_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return bounded_bits(u);
}

/* ---- format 3's column table ------------------------------------------------------------------------------------ */

/* Whether this build knows a column type, and the rule of its descriptor: a known column's width and flags are
 * checked; an unknown one is skipped, or refused when critical (the caller). */
static int known_column(uint8_t type) {
    return type == DPREC_RELEASE_COL_UNCERTAINTY;
}

/* Parses the column table (the header's 16 reserved bytes of a format-3 release) into cols (up to max) and *n, and
 * the bytes a row's columns take into *bytes. DPREC_ERR_RELEASE_HEADER for a table the format does not allow (no
 * column, a gap, a width of 0, more than 64 bytes in all, a type twice, a known column with another width or an
 * unknown flag), DPREC_ERR_RELEASE_COLUMN for a critical column of a type this build does not know. */
static int columns_parse(const unsigned char *t, dprec_release_column *cols, uint32_t max, uint32_t *n,
                         uint32_t *bytes) {
    uint32_t count = 0, total = 0;
    int ended = 0, critical_unknown = 0;
    for (uint32_t i = 0; i < DPREC_RELEASE_MAX_COLUMNS; i++) {
        const unsigned char *c = t + 4u * i;
        uint8_t type = c[0], flags = c[1];
        uint16_t width = dprec_ld16(c + 2);
        if (type == 0u) {
            if (flags != 0u || width != 0u) return DPREC_ERR_RELEASE_HEADER;
            ended = 1;
            continue;
        }
        if (ended || width == 0u) return DPREC_ERR_RELEASE_HEADER; /* packed from the first slot, none empty */
        for (uint32_t k = 0; k < i; k++)
            if (t[4u * k] == type) return DPREC_ERR_RELEASE_HEADER;
        if (type == DPREC_RELEASE_COL_UNCERTAINTY &&
            (width != DPREC_RELEASE_UNCERTAINTY_WIDTH ||
             (flags & ~(DPREC_RELEASE_COL_CRITICAL | DPREC_RELEASE_UNC_PINNED0)) != 0u))
            return DPREC_ERR_RELEASE_HEADER;
        if (!known_column(type) && (flags & DPREC_RELEASE_COL_CRITICAL) != 0u) critical_unknown = 1;
        if (count < max) {
            cols[count].type = type;
            cols[count].flags = flags;
            cols[count].width = width;
            cols[count].offset = total;
        }
        total += width;
        count++;
    }
    if (count == 0u || total > DPREC_RELEASE_COLUMN_BYTES_MAX) return DPREC_ERR_RELEASE_HEADER;
    if (critical_unknown) return DPREC_ERR_RELEASE_COLUMN; /* after the table's own rules: a malformed table is that */
    if (n != NULL) *n = count;
    if (bytes != NULL) *bytes = total;
    return DPREC_OK;
}

/* Bytes per body row: the optional bias, then v_j: d floats, or a compact encoding's scale and d integers. Callers
 * pass a validated d. At most 4 (d + 1) for d >= 2 (and 10 bytes at d = 1): the reader's row buffer holds any. */
static uint32_t row_bytes(uint32_t dim, uint16_t flags) {
    uint32_t bias = (flags & DPREC_RELEASE_HAS_BIASES) ? 4u : 0u;
    switch (flags & DPREC_RELEASE_ENC_MASK) {
    case DPREC_RELEASE_ENC_Q16: return bias + 4u + 2u * dim;
    case DPREC_RELEASE_ENC_Q8: return bias + 4u + dim;
    default: return bias + 4u * dim;
    }
}

uint32_t dprec_release_row_size(uint32_t dim, uint16_t flags) {
    return row_bytes(dim, flags);
}

/* The scale of a compact row: finite, not negative (its sign bit clear), and s * Q <= 2^20 in float32, so that
 * every decoded value, |q| s with |q| <= Q, is within the public bound (rounding is monotone). */
static int scale_ok(uint32_t bits, int32_t qmax) {
    if ((bits & 0x80000000u) != 0u || !dprec_bounded_bits(bits)) return 0;
    float s;
    memcpy(&s, &bits, sizeof s);
    return s * (float)qmax <= DPREC_RELEASE_VALUE_MAX;
}

/* Checks the values of the row at p (rule 4 of docs/release-format.md): the bias and float32 values within the
 * bound, or a compact row's bias, scale and integers q in [-Q, Q]. */
static int row_values_ok(const unsigned char *p, uint32_t dim, uint16_t flags) {
    if (flags & DPREC_RELEASE_HAS_BIASES) {
        if (!bounded_bits(dprec_ld32(p))) return 0;
        p += 4;
    }
    int32_t qmax = q_max(flags);
    if (qmax == 0) {
        int ok = 1;
        for (uint32_t k = 0; k < dim; k++) ok &= bounded_bits(dprec_ld32(p + 4u * k));
        return ok;
    }
    if (!scale_ok(dprec_ld32(p), qmax)) return 0;
    p += 4;
    int ok = 1;
    if (qmax == 127) {
        for (uint32_t k = 0; k < dim; k++) ok &= p[k] != 0x80u; /* -128 */
    } else { /* -32768: its high byte is 0x80 and its low byte 0, in either byte order of the test */
        for (uint32_t k = 0; k < dim; k++) ok &= (p[2u * k] | (p[2u * k + 1u] ^ 0x80u)) != 0u;
    }
    return ok;
}

/* Decodes the row at p, whose values are known good, into *bias (0 without biases) and row[0..d). */
static void row_decode(const unsigned char *p, uint32_t dim, uint16_t flags, float *bias, float *row) {
    *bias = 0.0f;
    if (flags & DPREC_RELEASE_HAS_BIASES) {
        *bias = dprec_ldf32(p);
        p += 4;
    }
    int32_t qmax = q_max(flags);
    if (qmax == 0) {
        for (uint32_t k = 0; k < dim; k++) row[k] = dprec_ldf32(p + 4u * k);
        return;
    }
    float s = dprec_ldf32(p);
    p += 4;
    if (qmax == 127) {
        for (uint32_t k = 0; k < dim; k++) row[k] = (float)(int8_t)p[k] * s;
    } else if (dprec_host_is_little_endian()) { /* the integers as the host stores them: one copy, then a loop the
                                                 * compiler vectorizes */
        int16_t q[DPREC_MAX_DIM];
        memcpy(q, p, 2u * dim);
        for (uint32_t k = 0; k < dim; k++) row[k] = (float)q[k] * s;
    } else {
        for (uint32_t k = 0; k < dim; k++) row[k] = (float)(int16_t)dprec_ld16(p + 2u * k) * s;
    }
}

int dprec_release_decode_row(const unsigned char *p, uint32_t dim, uint16_t flags, float *bias, float *row) {
    if (!row_values_ok(p, dim, flags)) return DPREC_ERR_RELEASE_VALUE;
    row_decode(p, dim, flags, bias, row);
    return DPREC_OK;
}

uint64_t dprec_release_size_columns(uint32_t num_items, uint32_t dim, uint16_t flags, uint32_t column_bytes,
                                    uint16_t sig_len) {
    if (num_items < 1u || num_items > DPREC_MAX_ITEMS || dim < 1u || dim > DPREC_MAX_DIM || format_of(flags) == 0u ||
        sig_len > DPREC_RELEASE_MAX_SIG || column_bytes > DPREC_RELEASE_COLUMN_BYTES_MAX) {
        return 0;
    }
    /* at most 64 + 2^24 * (257 * 4 + 64) + 32 + 128 < 2^35: no overflow in 64 bits */
    return (uint64_t)DPREC_RELEASE_HEADER_SIZE + (uint64_t)num_items * (row_bytes(dim, flags) + column_bytes) +
           DPREC_RELEASE_DIGEST_SIZE + sig_len;
}

uint64_t dprec_release_size(uint32_t num_items, uint32_t dim, uint16_t flags, uint16_t sig_len) {
    return dprec_release_size_columns(num_items, dim, flags, 0u, sig_len);
}

uint32_t dprec_release_stride(const dprec_release_info *info) {
    return (uint32_t)((info->total_size - DPREC_RELEASE_HEADER_SIZE - DPREC_RELEASE_DIGEST_SIZE - info->sig_len) /
                      info->num_items);
}

/* Decodes into a local copy and only then publishes, so a failed parse never leaves a half-valid *info. */
int dprec_release_parse_header(const void *buf, size_t len, dprec_release_info *info) {
    const unsigned char *p = buf;
    dprec_release_info h;
    uint32_t rmin_bits, rmax_bits, mean_bits;
    size_t i;

    if (buf == NULL || info == NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (len < DPREC_RELEASE_HEADER_SIZE) {
        return DPREC_ERR_RELEASE_TRUNCATED;
    }
    if (memcmp(p + OFF_MAGIC, DPREC_RELEASE_MAGIC, 4) != 0) {
        return DPREC_ERR_RELEASE_MAGIC;
    }
    memset(&h, 0, sizeof h);
    h.format_version = dprec_ld16(p + OFF_FORMAT_VERSION);
    if (h.format_version != DPREC_RELEASE_FORMAT_VERSION && h.format_version != DPREC_RELEASE_FORMAT_COMPACT &&
        h.format_version != DPREC_RELEASE_FORMAT_COLUMNS) {
        return DPREC_ERR_RELEASE_VERSION;
    }
    h.flags = dprec_ld16(p + OFF_FLAGS);
    h.release_version = dprec_ld64(p + OFF_RELEASE_VERSION);
    h.job_id = dprec_ld64(p + OFF_JOB_ID);
    h.num_items = dprec_ld32(p + OFF_NUM_ITEMS);
    h.dim = dprec_ld32(p + OFF_DIM);
    rmin_bits = dprec_ld32(p + OFF_RATING_MIN);
    rmax_bits = dprec_ld32(p + OFF_RATING_MAX);
    mean_bits = dprec_ld32(p + OFF_GLOBAL_MEAN);
    h.rating_min = dprec_ldf32(p + OFF_RATING_MIN);
    h.rating_max = dprec_ldf32(p + OFF_RATING_MAX);
    h.global_mean = dprec_ldf32(p + OFF_GLOBAL_MEAN);
    h.sig_alg = dprec_ld16(p + OFF_SIG_ALG);
    h.sig_len = dprec_ld16(p + OFF_SIG_LEN);

    if (format_of(h.flags) == 0u ||
        (h.format_version != DPREC_RELEASE_FORMAT_COLUMNS && format_of(h.flags) != h.format_version)) {
        /* a flag we do not understand may change the body's layout; format 1 has float32 rows, format 2 exactly
         * one compact encoding, format 3 rows of either kind */
        return DPREC_ERR_RELEASE_HEADER;
    }
    if (h.num_items < 1u || h.num_items > DPREC_MAX_ITEMS || h.dim < 1u || h.dim > DPREC_MAX_DIM) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    if (!finite_bits(rmin_bits) || !finite_bits(rmax_bits) || !bounded_bits(mean_bits) ||
        !(h.rating_min < h.rating_max)) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    /* Without biases the prediction is u.v_j alone; a stray mean would silently shift every score.
     * (-0.0 compares equal to 0 and is accepted.) */
    if (!(h.flags & DPREC_RELEASE_HAS_BIASES) && h.global_mean != 0.0f) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    if (h.sig_alg != DPREC_SIG_NONE && h.sig_alg != DPREC_SIG_ECDSA_P256_SHA256) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    if ((h.sig_alg == DPREC_SIG_NONE) != (h.sig_len == 0u) || h.sig_len > DPREC_RELEASE_MAX_SIG) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    /* Reserved bytes must be zero so that a later version can give them meaning without old readers
     * misreading a new release as valid; format 3 gave them one, its column table. */
    uint32_t column_bytes = 0;
    if (h.format_version == DPREC_RELEASE_FORMAT_COLUMNS) {
        int rc = columns_parse(p + OFF_RESERVED, NULL, 0, NULL, &column_bytes);
        if (rc != DPREC_OK) return rc;
    } else {
        for (i = OFF_RESERVED; i < DPREC_RELEASE_HEADER_SIZE; i++) {
            if (p[i] != 0u) {
                return DPREC_ERR_RELEASE_HEADER;
            }
        }
    }
    h.total_size = dprec_release_size_columns(h.num_items, h.dim, h.flags, column_bytes, h.sig_len);
    *info = h;
    return DPREC_OK;
}

/* Errors come in stream order so that this function and the reader agree on every input (see the top of
 * this file): values of the complete rows present, then size, then digest. */
int dprec_release_check(const void *buf, size_t len, dprec_release_info *info) {
    const unsigned char *p = buf;
    dprec_release_info h;
    uint64_t rows_present, nvals, i, body_end;
    unsigned char digest[DPREC_RELEASE_DIGEST_SIZE];
    uint32_t rb;
    int rc;

    if (buf == NULL || info == NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    rc = dprec_release_parse_header(buf, len, &h);
    if (rc != DPREC_OK) {
        return rc;
    }
    rb = dprec_release_stride(&h); /* the row and its columns; a column's bytes are opaque or any code is valid */
    rows_present = (uint64_t)(len - DPREC_RELEASE_HEADER_SIZE) / rb;
    if (rows_present > h.num_items) {
        rows_present = h.num_items;
    }
    if (h.format_version == DPREC_RELEASE_FORMAT_VERSION) { /* float32 rows and nothing else: every word is a value */
        nvals = rows_present * (rb / 4u);
        for (i = 0; i < nvals; i++) {
            if (!bounded_bits(dprec_ld32(p + DPREC_RELEASE_HEADER_SIZE + (size_t)i * 4u))) {
                return DPREC_ERR_RELEASE_VALUE;
            }
        }
    } else {
        for (i = 0; i < rows_present; i++) {
            if (!row_values_ok(p + DPREC_RELEASE_HEADER_SIZE + (size_t)i * rb, h.dim, h.flags)) {
                return DPREC_ERR_RELEASE_VALUE;
            }
        }
    }
    if ((uint64_t)len > h.total_size) {
        return DPREC_ERR_RELEASE_TRAILING;
    }
    if ((uint64_t)len < h.total_size) {
        return DPREC_ERR_RELEASE_TRUNCATED;
    }
    /* len == total_size, so every size below fits in size_t */
    body_end = h.total_size - DPREC_RELEASE_DIGEST_SIZE - h.sig_len;
    rc = dprec_sha256(p, (size_t)body_end, digest);
    if (rc != 0) {
        return DPREC_ERR_CRYPTO;
    }
    if (memcmp(digest, p + (size_t)body_end, DPREC_RELEASE_DIGEST_SIZE) != 0) {
        return DPREC_ERR_RELEASE_DIGEST;
    }
    memcpy(h.digest, digest, sizeof h.digest);
    *info = h;
    return DPREC_OK;
}

/* Trusts that buf passed dprec_release_check with this info; re-checks only what guards memory bounds
 * arithmetic (d in range, j < m). */
int dprec_release_row(const void *buf, const dprec_release_info *info, uint32_t j, float *row,
                      float *bias) {
    const unsigned char *p;
    float b;

    if (buf == NULL || info == NULL || row == NULL || info->dim < 1u || info->dim > DPREC_MAX_DIM ||
        j >= info->num_items || format_of(info->flags) == 0u) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (info->total_size < (uint64_t)DPREC_RELEASE_HEADER_SIZE + DPREC_RELEASE_DIGEST_SIZE + info->sig_len +
                               (uint64_t)info->num_items * row_bytes(info->dim, info->flags))
        return DPREC_ERR_INVALID_ARGUMENT;
    p = (const unsigned char *)buf + DPREC_RELEASE_HEADER_SIZE + (size_t)j * dprec_release_stride(info);
    row_decode(p, info->dim, info->flags, &b, row);
    if (bias != NULL) {
        *bias = b;
    }
    return DPREC_OK;
}

/* ---- streaming reader --------------------------------------------------------------------------------- */

/* The context lives in the reader's `sha` union (see the _Static_asserts above). The union is only ever
 * accessed as this type, by sha256.c, so the bytes[] member is never read as bytes. */
static dprec_sha2_ctx *reader_sha(dprec_release_reader *r) {
    return (dprec_sha2_ctx *)(void *)&r->sha;
}

/* Records the first error and returns it (the SHA-256 context owns nothing to release). */
static int reader_fail(dprec_release_reader *r, int err) {
    r->state = ST_FAILED;
    r->error = err;
    return err;
}

/* A reader placed by an app built against headers whose reader is smaller than ours cannot hold our state: only
 * its struct_size is written, and every call refuses it. */
static int reader_usable(const dprec_release_reader *r) {
    return r->struct_size >= sizeof *r;
}

/* Re-initialising a reader in the middle of a stream (or abandoning one) is allowed: the SHA-256 context owns no
 * memory, so dropping a live one leaks nothing. */
int dprec_release_reader_init_sized(dprec_release_reader *r, size_t size, dprec_release_row_fn on_row, void *user) {
    if (r == NULL || size < sizeof r->struct_size) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (size < sizeof *r || size > UINT32_MAX) {
        uint32_t n = size < sizeof *r ? (uint32_t)size : 0u;
        memcpy(&r->struct_size, &n, sizeof n);
        return DPREC_ERR_STRUCT_SIZE;
    }
    memset(r, 0, sizeof *r);
    r->struct_size = (uint32_t)size;
    r->on_row = on_row;
    r->user = user;
    r->state = ST_HEADER;
    return DPREC_OK; /* the hash starts once the header is known good */
}

/* Validates the collected header and starts hashing it. */
static int reader_header_done(dprec_release_reader *r) {
    int rc = dprec_release_parse_header(r->buf, DPREC_RELEASE_HEADER_SIZE, &r->info);
    if (rc != DPREC_OK) {
        return rc;
    }
    memcpy(r->columns, r->buf + OFF_RESERVED, sizeof r->columns); /* zero in formats 1 and 2 */
    r->stride = dprec_release_stride(&r->info);
    dprec_sha2_init(reader_sha(r));
    dprec_sha2_update(reader_sha(r), r->buf, DPREC_RELEASE_HEADER_SIZE);
    r->state = ST_BODY;
    return DPREC_OK;
}

/* Hashes, decodes and delivers one complete row held at p (either r->buf or, when a whole row sits in the
 * caller's chunk, the chunk itself: that saves a copy for large chunks). */
static int reader_row_done(dprec_release_reader *r, const unsigned char *p) {
    uint32_t rb = r->stride;
    float bias = 0.0f;

    if (!row_values_ok(p, r->info.dim, r->info.flags)) {
        return DPREC_ERR_RELEASE_VALUE;
    }
    dprec_sha2_update(reader_sha(r), p, rb);
    row_decode(p, r->info.dim, r->info.flags, &bias, r->row);
    if (r->on_row != NULL) {
        r->row_columns = p + row_bytes(r->info.dim, r->info.flags); /* for dprec_release_reader_uncertainty */
        int rc = r->on_row(r->user, r->next_row, bias, r->row, r->info.dim);
        r->row_columns = NULL;
        if (rc != 0) {
            return rc;
        }
    }
    r->next_row++;
    if (r->next_row == r->info.num_items) {
        r->state = ST_DIGEST;
    }
    return DPREC_OK;
}

/* Finishes the hash once the stored digest has arrived; the comparison waits for finish(), which alone may declare
 * the stream good. */
static int reader_digest_done(dprec_release_reader *r) {
    dprec_sha2_final(reader_sha(r), r->buf + DPREC_RELEASE_DIGEST_SIZE);
    r->state = r->info.sig_len > 0u ? ST_SIGNATURE : ST_DONE;
    return DPREC_OK;
}

/* A loop over the chunk; each pass consumes what the current state still needs and no more, so any
 * chunking reaches the same states in the same order. */
int dprec_release_reader_feed(dprec_release_reader *r, const void *chunk, size_t len) {
    const unsigned char *p = chunk;

    if (r == NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (!reader_usable(r)) {
        return DPREC_ERR_STRUCT_SIZE;
    }
    if (r->state == ST_FAILED) {
        return r->error;
    }
    if (chunk == NULL && len > 0u) {
        return reader_fail(r, DPREC_ERR_INVALID_ARGUMENT);
    }
    while (len > 0u) {
        size_t need, take;
        int rc = DPREC_OK;

        switch (r->state) {
        case ST_HEADER:
        case ST_DIGEST: {
            uint32_t want = r->state == ST_HEADER ? DPREC_RELEASE_HEADER_SIZE : DPREC_RELEASE_DIGEST_SIZE;
            need = want - r->fill;
            take = len < need ? len : need;
            memcpy(r->buf + r->fill, p, take);
            r->fill += (uint32_t)take;
            if (r->fill == want) {
                r->fill = 0;
                rc = r->state == ST_HEADER ? reader_header_done(r) : reader_digest_done(r);
            }
            break;
        }
        case ST_BODY: {
            uint32_t rb = r->stride;
            if (r->fill == 0u && len >= rb) {
                take = rb;
                rc = reader_row_done(r, p);
            } else {
                need = rb - r->fill;
                take = len < need ? len : need;
                memcpy(r->buf + r->fill, p, take);
                r->fill += (uint32_t)take;
                if (r->fill == rb) {
                    r->fill = 0;
                    rc = reader_row_done(r, r->buf);
                }
            }
            break;
        }
        case ST_SIGNATURE: {
            uint64_t left = r->info.total_size - r->consumed;
            take = (uint64_t)len < left ? len : (size_t)left;
            if ((uint64_t)take == left) {
                r->state = ST_DONE;
            }
            break;
        }
        default: /* ST_DONE */
            return reader_fail(r, DPREC_ERR_RELEASE_TRAILING);
        }
        /* Count before failing: the bytes of a bad header or row were consumed. */
        r->consumed += take;
        p += take;
        len -= take;
        if (rc != DPREC_OK) {
            return reader_fail(r, rc);
        }
    }
    return DPREC_OK;
}

/* Repeatable: after success it returns DPREC_OK again, after a failure the same error. */
int dprec_release_reader_finish(dprec_release_reader *r) {
    if (r == NULL) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (!reader_usable(r)) {
        return DPREC_ERR_STRUCT_SIZE;
    }
    if (r->state == ST_FAILED) {
        return r->error;
    }
    if (r->state != ST_DONE) {
        return reader_fail(r, DPREC_ERR_RELEASE_TRUNCATED);
    }
    if (memcmp(r->buf, r->buf + DPREC_RELEASE_DIGEST_SIZE, DPREC_RELEASE_DIGEST_SIZE) != 0) {
        return reader_fail(r, DPREC_ERR_RELEASE_DIGEST);
    }
    memcpy(r->info.digest, r->buf, DPREC_RELEASE_DIGEST_SIZE);
    return DPREC_OK;
}

/* ---- writer ------------------------------------------------------------------------------------------- */

/* The nearest integer to x, halves away from zero, clamped to [-qmax, qmax]. */
static int32_t quantize(double x, int32_t qmax) {
    double r = x >= 0.0 ? x + 0.5 : x - 0.5;
    if (r >= (double)qmax) return qmax;
    if (r <= -(double)qmax) return -qmax;
    return (int32_t)r; /* truncation toward zero of x +- 0.5 */
}

/* One compact row at q: the scale s = max_k |v_k| / Q (lowered by an ulp until s * Q <= 2^20 in float32, the rule a
 * reader checks), then each q_k = round(v_k / s). Every v_k is within the bound (the caller checked), so the largest
 * decoding error is about s / 2 plus a float rounding. Returns the end of the row. */
static unsigned char *write_compact_row(unsigned char *q, const float *v, uint32_t dim, int32_t qmax) {
    float mx = 0.0f;
    for (uint32_t k = 0; k < dim; k++) {
        float a = v[k] < 0.0f ? -v[k] : v[k];
        if (a > mx) mx = a;
    }
    float s = mx / (float)qmax;
    while (s > 0.0f && !(s * (float)qmax <= DPREC_RELEASE_VALUE_MAX)) {
        uint32_t bits;
        memcpy(&bits, &s, sizeof bits);
        bits--; /* the next float toward zero (s > 0) */
        memcpy(&s, &bits, sizeof s);
    }
    dprec_stf32(q, s);
    q += 4;
    for (uint32_t k = 0; k < dim; k++) {
        int32_t n = s > 0.0f ? quantize((double)v[k] / (double)s, qmax) : 0;
        if (qmax == 127) {
            *q++ = (unsigned char)(uint8_t)(int8_t)n;
        } else {
            dprec_st16(q, (uint16_t)(int16_t)n);
            q += 2;
        }
    }
    return q;
}

/* Builds the header from *info and validates it with the readers' own parser before touching out, so the
 * writer can never produce a header they refuse. Values are checked as they are written; on error the
 * contents of out are unspecified. */
int dprec_release_write(void *out, size_t cap, dprec_release_info *info, const float *v,
                        const float *item_bias, size_t *written) {
    return dprec_release_write_columns(out, cap, info, v, item_bias, NULL, 0, written);
}

int dprec_release_write_columns(void *out, size_t cap, dprec_release_info *info, const float *v,
                                const float *item_bias, const dprec_release_column_data *cols, uint32_t ncols,
                                size_t *written) {
    unsigned char hdr[DPREC_RELEASE_HEADER_SIZE];
    unsigned char *o = out;
    unsigned char *q;
    dprec_release_info h;
    uint16_t flags;
    uint64_t body_end;
    uint32_t j, k;
    int rc;

    if (written != NULL) {
        *written = 0;
    }
    if (out == NULL || info == NULL || v == NULL || (cols == NULL && ncols > 0u)) {
        return DPREC_ERR_INVALID_ARGUMENT;
    }
    if (format_of(info->flags) == 0u || ncols > DPREC_RELEASE_MAX_COLUMNS) {
        return DPREC_ERR_RELEASE_HEADER;
    }
    for (k = 0; k < ncols; k++) {
        if (cols[k].data == NULL) {
            return DPREC_ERR_INVALID_ARGUMENT;
        }
    }
    /* The biases pointer, not the caller's flag, decides the layout: they cannot disagree. The encoding is the
     * caller's. */
    flags = (uint16_t)((item_bias != NULL ? DPREC_RELEASE_HAS_BIASES : 0u) | (info->flags & DPREC_RELEASE_ENC_MASK));
    memcpy(hdr + OFF_MAGIC, DPREC_RELEASE_MAGIC, 4);
    dprec_st16(hdr + OFF_FORMAT_VERSION, ncols > 0u ? (uint16_t)DPREC_RELEASE_FORMAT_COLUMNS : format_of(flags));
    dprec_st16(hdr + OFF_FLAGS, flags);
    dprec_st64(hdr + OFF_RELEASE_VERSION, info->release_version);
    dprec_st64(hdr + OFF_JOB_ID, info->job_id);
    dprec_st32(hdr + OFF_NUM_ITEMS, info->num_items);
    dprec_st32(hdr + OFF_DIM, info->dim);
    dprec_stf32(hdr + OFF_RATING_MIN, info->rating_min);
    dprec_stf32(hdr + OFF_RATING_MAX, info->rating_max);
    dprec_stf32(hdr + OFF_GLOBAL_MEAN, info->global_mean);
    dprec_st16(hdr + OFF_SIG_ALG, (uint16_t)DPREC_SIG_NONE);
    dprec_st16(hdr + OFF_SIG_LEN, 0u);
    memset(hdr + OFF_RESERVED, 0, DPREC_RELEASE_HEADER_SIZE - OFF_RESERVED);
    for (k = 0; k < ncols; k++) { /* the column table: the readers' parser below refuses what they would */
        hdr[OFF_RESERVED + 4u * k] = cols[k].type;
        hdr[OFF_RESERVED + 4u * k + 1u] = cols[k].flags;
        dprec_st16(hdr + OFF_RESERVED + 4u * k + 2u, cols[k].width);
    }
    rc = dprec_release_parse_header(hdr, sizeof hdr, &h);
    if (rc != DPREC_OK) {
        return rc;
    }
    if ((uint64_t)cap < h.total_size) {
        return DPREC_ERR_BUFFER_TOO_SMALL;
    }
    memcpy(o, hdr, sizeof hdr);
    q = o + DPREC_RELEASE_HEADER_SIZE;
    for (j = 0; j < h.num_items; j++) {
        const float *vj = v + (size_t)j * h.dim;
        if (item_bias != NULL) {
            if (!bounded_f32(item_bias[j])) {
                return DPREC_ERR_RELEASE_VALUE;
            }
            dprec_stf32(q, item_bias[j]);
            q += 4;
        }
        for (k = 0; k < h.dim; k++) {
            if (!bounded_f32(vj[k])) {
                return DPREC_ERR_RELEASE_VALUE;
            }
        }
        if (q_max(flags) == 0) {
            for (k = 0; k < h.dim; k++) {
                dprec_stf32(q, vj[k]);
                q += 4;
            }
        } else {
            q = write_compact_row(q, vj, h.dim, q_max(flags));
        }
        for (k = 0; k < ncols; k++) {
            memcpy(q, cols[k].data + (size_t)j * cols[k].width, cols[k].width);
            q += cols[k].width;
        }
    }
    /* cap >= total_size, so every size below fits in size_t */
    body_end = h.total_size - DPREC_RELEASE_DIGEST_SIZE;
    if (dprec_sha256(o, (size_t)body_end, h.digest) != 0) {
        return DPREC_ERR_CRYPTO;
    }
    memcpy(o + (size_t)body_end, h.digest, DPREC_RELEASE_DIGEST_SIZE);
    *info = h;
    if (written != NULL) {
        *written = (size_t)h.total_size;
    }
    return DPREC_OK;
}

/* ---- format 3's columns, read ------------------------------------------------------------------------------------ */

int dprec_release_columns(const void *header, size_t len, dprec_release_column *cols, uint32_t max, uint32_t *n) {
    dprec_release_info info;
    if (header == NULL || n == NULL || (cols == NULL && max > 0u)) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_release_parse_header(header, len, &info);
    if (rc != DPREC_OK) return rc;
    *n = 0;
    if (info.format_version != DPREC_RELEASE_FORMAT_COLUMNS) return DPREC_OK;
    return columns_parse((const unsigned char *)header + OFF_RESERVED, cols, max, n, NULL);
}

/* 2^(k / 16) for k = 0..15, as float32 (the nearest float to each). A code's standard deviation is one of these
 * scaled by a power of two, exactly, so every device decodes the same float. */
static const float POW2_SIXTEENTHS[16] = {
    0x1.000000p+0f, 0x1.0b5586p+0f, 0x1.172b84p+0f, 0x1.2387a6p+0f, 0x1.306fe0p+0f, 0x1.3dea64p+0f,
    0x1.4bfdaep+0f, 0x1.5ab07ep+0f, 0x1.6a09e6p+0f, 0x1.7a1148p+0f, 0x1.8ace54p+0f, 0x1.9c4918p+0f,
    0x1.ae89fap+0f, 0x1.c199bep+0f, 0x1.d5818ep+0f, 0x1.ea4afap+0f,
};

float dprec_uncertainty_sd(uint8_t code) {
    if (code == 0u) return 0.0f;
    if (code == 255u) return INFINITY;
    int e = (int)code - 128; /* -127 .. 126 */
    int q = e >= 0 ? e / 16 : -((-e + 15) / 16); /* floor(e / 16) */
    return ldexpf(POW2_SIXTEENTHS[e - 16 * q], q);
}

uint8_t dprec_uncertainty_code(double sd) {
    if (!(sd > 0.0)) return sd == sd ? 0u : 255u; /* 0 or below: 0; NaN: no information */
    if (!(sd < 239.8934571661184)) return 255u;  /* 2^(126.5 / 16): past the largest finite step */
    double k = floor(16.0 * log2(sd) + 0.5) + 128.0;
    if (k < 1.0) k = 1.0; /* a positive sd never codes as 0, which means "no noise" */
    if (k > 254.0) k = 254.0;
    return (uint8_t)k;
}

float dprec_uncertainty_gain(uint8_t code) {
    return (float)code / 255.0f;
}

uint8_t dprec_uncertainty_gain_code(double gain) {
    if (!(gain > 0.0)) return 0u; /* NaN too */
    if (!(gain < 1.0)) return 255u;
    return (uint8_t)floor(255.0 * gain + 0.5);
}

/* gain spread^2 / (gain^2 spread^2 + noise^2), at most 1 (dprec_item_uncertainty), with the limits spelled out: a value
 * with no noise is kept whole, one with infinite noise, no gain or a spread of 0 keeps nothing, an infinite spread
 * keeps 1 / gain, capped (the device never moves further from its own level than the release does). Computed in
 * double from the decoded floats: the same on every target. */
static float keep_of(float noise, float gain, float spread) {
    if (noise == 0.0f) return 1.0f;
    if (isinf(noise) || gain == 0.0f || spread == 0.0f) return 0.0f;
    if (isinf(spread)) return 1.0f;
    double s2 = (double)spread * spread, k = (double)gain * s2 / ((double)gain * gain * s2 + (double)noise * noise);
    return k < 1.0 ? (float)k : 1.0f;
}

void dprec_uncertainty_decode(const unsigned char code[DPREC_RELEASE_UNCERTAINTY_WIDTH], uint8_t col_flags,
                              dprec_item_uncertainty *out) {
    out->bias_noise_sd = dprec_uncertainty_sd(code[0]);
    out->bias_gain = dprec_uncertainty_gain(code[1]);
    out->bias_spread_sd = dprec_uncertainty_sd(code[2]);
    out->v_noise_sd = dprec_uncertainty_sd(code[3]);
    out->v_gain = dprec_uncertainty_gain(code[4]);
    out->v_spread_sd = dprec_uncertainty_sd(code[5]);
    out->bias_keep = keep_of(out->bias_noise_sd, out->bias_gain, out->bias_spread_sd);
    out->v_keep = keep_of(out->v_noise_sd, out->v_gain, out->v_spread_sd);
    out->pinned = (col_flags & DPREC_RELEASE_UNC_PINNED0) != 0u ? 1u : 0u;
}

static void uncertainty_identity(dprec_item_uncertainty *out) {
    memset(out, 0, sizeof *out);
    out->bias_keep = 1.0f;
    out->v_keep = 1.0f;
}

/* The uncertainty column of a column table (16 bytes): its flags and offset, or 0 when there is none. */
static int uncertainty_column(const unsigned char *table, uint8_t *flags, uint32_t *offset) {
    uint32_t at = 0;
    for (uint32_t i = 0; i < DPREC_RELEASE_MAX_COLUMNS && table[4u * i] != 0u; i++) {
        if (table[4u * i] == DPREC_RELEASE_COL_UNCERTAINTY) {
            *flags = table[4u * i + 1u];
            *offset = at;
            return 1;
        }
        at += dprec_ld16(table + 4u * i + 2u);
    }
    return 0;
}

int dprec_release_item_uncertainty(const void *buf, const dprec_release_info *info, uint32_t j,
                                   dprec_item_uncertainty *out) {
    if (buf == NULL || info == NULL || out == NULL || j >= info->num_items || format_of(info->flags) == 0u ||
        info->dim < 1u || info->dim > DPREC_MAX_DIM)
        return DPREC_ERR_INVALID_ARGUMENT;
    uncertainty_identity(out);
    const unsigned char *p = buf;
    uint8_t flags;
    uint32_t offset;
    if (info->format_version != DPREC_RELEASE_FORMAT_COLUMNS || dprec_ld16(p + OFF_FORMAT_VERSION) != info->format_version ||
        !uncertainty_column(p + OFF_RESERVED, &flags, &offset))
        return DPREC_ERR_NOT_FOUND;
    uint32_t core = row_bytes(info->dim, info->flags), stride = dprec_release_stride(info);
    if (offset + DPREC_RELEASE_UNCERTAINTY_WIDTH > stride - core || stride < core) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_uncertainty_decode(p + DPREC_RELEASE_HEADER_SIZE + (size_t)j * stride + core + offset, flags, out);
    return DPREC_OK;
}

int dprec_release_reader_uncertainty(const dprec_release_reader *r, dprec_item_uncertainty *out) {
    if (r == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    uncertainty_identity(out);
    if (!reader_usable(r)) return DPREC_ERR_STRUCT_SIZE;
    if (r->row_columns == NULL) return DPREC_ERR_STATE;
    uint8_t flags;
    uint32_t offset;
    if (!uncertainty_column(r->columns, &flags, &offset)) return DPREC_ERR_NOT_FOUND;
    dprec_uncertainty_decode(r->row_columns + offset, flags, out);
    return DPREC_OK;
}
