/* dprec — releases of item profiles V (formats 1, 2 and 3), read from a buffer or as a stream of chunks.
 *
 * Layout (all integers and floats little-endian; docs/release-format.md is the full description):
 *   header   64 bytes   magic "DPRV", format version, flags, release version, job id, m, d, rating scale,
 *                       global mean, signature algorithm and length, reserved zeros (format 3: the column table)
 *   body     m rows     row j = [item bias b_j if DPREC_RELEASE_HAS_BIASES] then v_j: d float32 (format 1), or
 *                       (format 2, a compact release) a float32 scale s_j and d int16 or int8 q_jk, v_jk = q_jk s_j;
 *                       format 3: either of those, then the item's bytes of each column of the header's table
 *   digest   32 bytes   SHA-256 of header || body
 *   signature sig_len bytes over the digest (ECDSA P-256, added by the aggregator; 0 bytes = unsigned)
 *
 * A device never needs all of V in memory: dprec_release_reader consumes any chunking of the bytes and
 * hands over one row at a time, and only its final call says whether the digest matched. */
#ifndef DPREC_RELEASE_H
#define DPREC_RELEASE_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/status.h"
#include "dprec/version.h"

DPREC_BEGIN_DECLS

#define DPREC_RELEASE_MAGIC "DPRV"
#define DPREC_RELEASE_FORMAT_VERSION 1u  /* float32 rows */
#define DPREC_RELEASE_FORMAT_COMPACT 2u  /* quantized rows: one of the DPREC_RELEASE_ENC_* flags */
#define DPREC_RELEASE_FORMAT_COLUMNS 3u  /* rows of format 1 or 2, each followed by per-item columns */
#define DPREC_RELEASE_HEADER_SIZE 64u
#define DPREC_RELEASE_DIGEST_SIZE 32u
#define DPREC_RELEASE_MAX_SIG 128u   /* the largest signature a v1 release may carry */
#define DPREC_MAX_DIM 256u           /* the largest latent dimension d */
#define DPREC_MAX_ITEMS 16777216u    /* the largest catalogue (2^24 items) */
/* The public bound on every value of a release (V, the item biases and the global mean): |x| <= 2^20. A
 * device refuses a release past it (DPREC_ERR_RELEASE_VALUE) before using any of it, so that no signed but
 * crafted release can make the local step overflow for some users and not others; the aggregator clamps its
 * models to it before signing (post-processing). */
#define DPREC_RELEASE_VALUE_MAX 1048576.0f

/* header flags */
#define DPREC_RELEASE_HAS_BIASES 0x0001u /* each row starts with the item bias b_j */
/* Compact encodings (format 2; exactly one of them, and never in format 1). A row's v_j is a float32 scale s_j >= 0
 * then d integers q_jk in [-Q, Q]; v_jk is the float32 product q_jk * s_j, and s_j * Q <= 2^20. The item bias and
 * the global mean stay float32. Written by dprec_release_write when info->flags asks for one; a reader of format 1
 * only refuses such a release (DPREC_ERR_RELEASE_VERSION). */
#define DPREC_RELEASE_ENC_Q16 0x0002u  /* int16, Q = 32767: 2 d + 4 bytes for v_j instead of 4 d */
#define DPREC_RELEASE_ENC_Q8 0x0004u   /* int8, Q = 127: d + 4 bytes */
#define DPREC_RELEASE_ENC_MASK 0x0006u

/* Format 3: per-item columns. The header's 16 reserved bytes are a table of up to 4 columns, 4 bytes each: [type u8]
 * [flags u8][width u16], packed from the first slot (an unused slot is 4 zero bytes, and so is every slot after it).
 * Each row ends with the item's `width` bytes of each column, in table order (at most 64 bytes in all). A reader skips
 * a column whose type it does not know, unless its flags say DPREC_RELEASE_COL_CRITICAL: then it refuses the release
 * (DPREC_ERR_RELEASE_COLUMN). Every byte is covered by the digest and so by the signature. */
#define DPREC_RELEASE_MAX_COLUMNS 4u
#define DPREC_RELEASE_COLUMN_BYTES_MAX 64u   /* the most column bytes a row may carry */
#define DPREC_RELEASE_COL_CRITICAL 0x01u     /* column flag: a reader that does not know the type must refuse */
/* Column type 1, the items' uncertainty (docs/release-format.md, "Format 3"): 6 bytes an item, [b: noise][b: gain]
 * [b: spread][v: noise][v: gain][v: spread]. A released value is, to first order, x = gain t + noise, t the item's true
 * value: noise and spread are standard deviations coded on a log scale (dprec_uncertainty_sd), the noise's and the
 * spread of the true values the release shows (empirical Bayes); gain is code / 255 (dprec_uncertainty_gain). Not
 * critical: a reader that ignores it predicts from the release's values as they are. Its flag DPREC_RELEASE_UNC_PINNED0 says that coordinate 0 of every v_j is a
 * pinned column of ones (the users' own bias), which the shrinkage leaves alone. */
#define DPREC_RELEASE_COL_UNCERTAINTY 1u
#define DPREC_RELEASE_UNCERTAINTY_WIDTH 6u
#define DPREC_RELEASE_UNC_PINNED0 0x02u

/* signature algorithms */
#define DPREC_SIG_NONE 0u
#define DPREC_SIG_ECDSA_P256_SHA256 1u /* DER-encoded ECDSA signature over the digest */

typedef struct dprec_release_info {
    uint16_t format_version;  /* 1, 2 for a compact release, 3 for a release with columns */
    uint16_t flags;           /* DPREC_RELEASE_HAS_BIASES, and a compact release's DPREC_RELEASE_ENC_* */
    uint64_t release_version; /* increases with each release of a job */
    uint64_t job_id;          /* the aggregator's job (0 for a release made offline) */
    uint32_t num_items;       /* m */
    uint32_t dim;             /* d */
    float rating_min, rating_max;
    float global_mean;        /* mu; 0 when the release has no biases */
    uint16_t sig_alg;
    uint16_t sig_len;
    uint64_t total_size;      /* header + body + digest + signature, in bytes */
    unsigned char digest[DPREC_RELEASE_DIGEST_SIZE]; /* filled once the digest has been checked */
} dprec_release_info;

/* Parses and validates a 64-byte header (magic, version, sizes, scale, reserved bytes). Fills *info
 * except digest. Returns DPREC_ERR_RELEASE_MAGIC/VERSION/HEADER, or DPREC_ERR_RELEASE_TRUNCATED if len < 64. */
DPREC_API int dprec_release_parse_header(const void *buf, size_t len, dprec_release_info *info);

/* Validates a whole release held in memory: header, exact size, every value within the public bound, digest.
 * On success fills *info (digest included). The signature is carried, not checked here: dprec_release_verify
 * (dprec.h) and dprec_client_sync verify it (ECDSA P-256 over the digest) against the key the app pinned. */
DPREC_API int dprec_release_check(const void *buf, size_t len, dprec_release_info *info);

/* Reads row j of a release already validated by dprec_release_check: v_j into row[0..d) (decoded, for a compact
 * release) and the item bias into *bias (0 when the release has none; bias may be NULL). */
DPREC_API int dprec_release_row(const void *buf, const dprec_release_info *info, uint32_t j,
                                float *row, float *bias);

/* Called by the reader for each complete row: item j, its bias (0 if none) and v_j (d floats, decoded for a compact
 * release, valid only during the call). A non-zero return stops the stream and is returned by the feed call. */
typedef int (*dprec_release_row_fn)(void *user, uint32_t item, float bias, const float *row, uint32_t dim);

/* Streaming reader. Place it anywhere (no allocation). Its size may change between minor versions: init records
 * the app's sizeof, and a reader smaller than this library's is refused (DPREC_ERR_STRUCT_SIZE). Apart from info
 * (complete after a successful finish), its fields are private. */
typedef struct dprec_release_reader {
    uint32_t struct_size;      /* set by init: sizeof(dprec_release_reader) as the app was compiled */
    dprec_release_info info;
    uint64_t consumed;         /* bytes fed so far */
    uint32_t next_row;
    uint32_t fill;             /* bytes held in buf */
    int state;                 /* internal */
    int error;                 /* the first error, sticky */
    dprec_release_row_fn on_row;
    void *user;
    union { unsigned char bytes[128]; uint64_t align; } sha; /* SHA-256 context storage (internal) */
    unsigned char buf[4 * (DPREC_MAX_DIM + 1) + DPREC_RELEASE_HEADER_SIZE]; /* a partial row (of any encoding, with its
                                                                             * columns) or header */
    float row[DPREC_MAX_DIM];
    /* since format 3 (internal): the header's column table, the bytes of a row with its columns, and where the row
     * being delivered keeps its columns (valid during on_row only) */
    unsigned char columns[16];
    uint32_t stride;
    const unsigned char *row_columns;
} dprec_release_reader;

/* Starts a stream over the size bytes at *r. on_row may be NULL (validate only). DPREC_ERR_STRUCT_SIZE if size is
 * below this library's reader (then feed and finish return it too). Call it through dprec_release_reader_init,
 * which passes the app's sizeof. */
DPREC_API int dprec_release_reader_init_sized(dprec_release_reader *r, size_t size, dprec_release_row_fn on_row,
                                              void *user);
static inline void dprec_release_reader_init(dprec_release_reader *r, dprec_release_row_fn on_row, void *user) {
    (void)dprec_release_reader_init_sized(r, sizeof *r, on_row, user);
}

/* Feeds the next len bytes (any chunk size, including 0). Rows are delivered as soon as they are complete;
 * a header error is reported on the call that completes the header. Once an error is returned, every later
 * call returns it again. */
DPREC_API int dprec_release_reader_feed(dprec_release_reader *r, const void *chunk, size_t len);

/* Ends the stream: DPREC_OK only if exactly the announced bytes arrived and the digest matched; then
 * r->info is complete. Rows delivered before a failing finish must be discarded by the caller. */
DPREC_API int dprec_release_reader_finish(dprec_release_reader *r);

/* Writer for tools, tests and the aggregator. The size in bytes of a release with these parameters (flags: biases
 * and the encoding), including a signature of sig_len bytes; 0 if they are out of range. */
DPREC_API uint64_t dprec_release_size(uint32_t num_items, uint32_t dim, uint16_t flags, uint16_t sig_len);

/* ---- format 3: per-item columns ------------------------------------------------------------------------------ */

/* One column of a release: its type, flags and width in bytes per item, and where its bytes start in a row, counted
 * from the end of the row's bias and v_j. */
typedef struct dprec_release_column {
    uint8_t type;
    uint8_t flags;
    uint16_t width;
    uint32_t offset;
} dprec_release_column;

/* The columns of a release whose 64-byte header dprec_release_parse_header accepted: up to max of them into cols (may
 * be NULL when max is 0), their number into *n (0 for formats 1 and 2). */
DPREC_API int dprec_release_columns(const void *header, size_t len, dprec_release_column *cols, uint32_t max,
                                    uint32_t *n);

/* An item's uncertainty, decoded from the release's uncertainty column (docs/release-format.md, "Format 3"), and the
 * shrinkage it implies (docs/privacy.md, "Release uncertainty"): with x = gain t + noise and true values spread as
 * N(0, spread^2), the linear least-squares estimate of t from x is keep x,
 *     keep = gain spread^2 / (gain^2 spread^2 + noise^2),   at most 1,
 * 1 when the value carries no noise (a release without the column is read so), 0 when it carries nothing of the item
 * (gain 0) or the release's items show no spread. A noise of INFINITY ("no information") keeps 0. */
typedef struct dprec_item_uncertainty {
    float bias_noise_sd, bias_gain, bias_spread_sd; /* of the item bias b_j, in rating units */
    float v_noise_sd, v_gain, v_spread_sd;          /* of each unpinned coordinate of v_j */
    float bias_keep, v_keep;                        /* in [0, 1] */
    uint32_t pinned;                                /* leading coordinates of v_j that are never shrunk (0 or 1) */
} dprec_item_uncertainty;

/* The standard deviation a code of the uncertainty column stands for: 0 for 0, INFINITY for 255, else
 * 2^((code - 128) / 16) (about 0.0041 to 235, steps of 4.4%). */
DPREC_API float dprec_uncertainty_sd(uint8_t code);
/* The code of a standard deviation: 0 for sd <= 0 (and only then), 255 for a NaN, an infinity or anything at or
 * past 2^(126.5 / 16), otherwise the nearest step (at least 1). */
DPREC_API uint8_t dprec_uncertainty_code(double sd);
/* The gain a code stands for, code / 255 (0 to 1), and the code of a gain (the nearest step; 0 below 0, 255 above 1). */
DPREC_API float dprec_uncertainty_gain(uint8_t code);
DPREC_API uint8_t dprec_uncertainty_gain_code(double gain);
/* Decodes the 6 bytes of an item's uncertainty column (with the column's flags) into *out. */
DPREC_API void dprec_uncertainty_decode(const unsigned char code[DPREC_RELEASE_UNCERTAINTY_WIDTH], uint8_t col_flags,
                                        dprec_item_uncertainty *out);

/* Item j's uncertainty in a release already validated by dprec_release_check (or a trusted one). DPREC_ERR_NOT_FOUND
 * when the release has no uncertainty column: *out is then the identity (no noise, keep 1). */
DPREC_API int dprec_release_item_uncertainty(const void *buf, const dprec_release_info *info, uint32_t j,
                                             dprec_item_uncertainty *out);

/* The uncertainty of the row a streaming reader is delivering, called from its on_row callback (elsewhere:
 * DPREC_ERR_STATE). DPREC_ERR_NOT_FOUND, with *out the identity, when the release has no uncertainty column. */
DPREC_API int dprec_release_reader_uncertainty(const dprec_release_reader *r, dprec_item_uncertainty *out);

/* A column to write: type, flags, width (bytes per item) and its m * width bytes, item-major. */
typedef struct dprec_release_column_data {
    uint8_t type;
    uint8_t flags;
    uint16_t width;
    const unsigned char *data;
} dprec_release_column_data;

/* The size of a release with columns of column_bytes bytes per item in all (format 3 when column_bytes > 0). */
DPREC_API uint64_t dprec_release_size_columns(uint32_t num_items, uint32_t dim, uint16_t flags, uint32_t column_bytes,
                                              uint16_t sig_len);

/* Writes an unsigned release into out (cap bytes). v is m*d floats row-major; item_bias is m floats or
 * NULL (then no biases are stored and global_mean must be 0). Header fields come from *info (format_version,
 * total_size, sig_* and digest are set by the writer, which also fills info->digest). info->flags may ask for a
 * compact encoding (DPREC_RELEASE_ENC_Q16 or _Q8: format 2, each row scaled by its largest |v_jk| / Q and rounded
 * to the nearest q); DPREC_RELEASE_HAS_BIASES there is ignored (item_bias decides). *written gets the size. */
DPREC_API int dprec_release_write(void *out, size_t cap, dprec_release_info *info, const float *v,
                                  const float *item_bias, size_t *written);

/* dprec_release_write with ncols columns (at most DPREC_RELEASE_MAX_COLUMNS; cols may be NULL when ncols is 0): with
 * any, the release is format 3, its rows in the encoding info->flags asks (float32 or compact) followed by the columns'
 * bytes. A column table the readers would refuse is refused (DPREC_ERR_RELEASE_HEADER), so is a critical column of a
 * type this build does not know (DPREC_ERR_RELEASE_COLUMN). */
DPREC_API int dprec_release_write_columns(void *out, size_t cap, dprec_release_info *info, const float *v,
                                          const float *item_bias, const dprec_release_column_data *cols,
                                          uint32_t ncols, size_t *written);

DPREC_END_DECLS

#endif /* DPREC_RELEASE_H */
