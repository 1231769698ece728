/* dprec — releases of item profiles V (format v1), read from a buffer or as a stream of chunks.
 *
 * Layout (all integers and floats little-endian; docs/release-format.md is the full description):
 *   header   64 bytes   magic "DPRV", format version, flags, release version, job id, m, d, rating scale,
 *                       global mean, signature algorithm and length, reserved zeros
 *   body     m rows     row j = [item bias b_j if DPREC_RELEASE_HAS_BIASES] then v_j (d float32)
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

DPREC_BEGIN_DECLS

#define DPREC_RELEASE_MAGIC "DPRV"
#define DPREC_RELEASE_FORMAT_VERSION 1u
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

/* signature algorithms */
#define DPREC_SIG_NONE 0u
#define DPREC_SIG_ECDSA_P256_SHA256 1u /* DER-encoded ECDSA signature over the digest */

typedef struct dprec_release_info {
    uint16_t format_version;
    uint16_t flags;
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

/* Reads row j of a release already validated by dprec_release_check: v_j into row[0..d) and the item
 * bias into *bias (0 when the release has none; bias may be NULL). */
DPREC_API int dprec_release_row(const void *buf, const dprec_release_info *info, uint32_t j,
                                float *row, float *bias);

/* Called by the reader for each complete row: item j, its bias (0 if none) and v_j (d floats, valid only
 * during the call). A non-zero return stops the stream and is returned by the feed call. */
typedef int (*dprec_release_row_fn)(void *user, uint32_t item, float bias, const float *row, uint32_t dim);

/* Streaming reader. Place it anywhere (no allocation); its size is fixed. */
typedef struct dprec_release_reader {
    dprec_release_info info;
    uint64_t consumed;         /* bytes fed so far */
    uint32_t next_row;
    uint32_t fill;             /* bytes held in buf */
    int state;                 /* internal */
    int error;                 /* the first error, sticky */
    dprec_release_row_fn on_row;
    void *user;
    union { unsigned char bytes[128]; uint64_t align; } sha; /* SHA-256 context storage (internal) */
    unsigned char buf[4 * (DPREC_MAX_DIM + 1) + DPREC_RELEASE_HEADER_SIZE]; /* a partial row or header */
    float row[DPREC_MAX_DIM];
} dprec_release_reader;

/* Starts a stream. on_row may be NULL (validate only). */
DPREC_API void dprec_release_reader_init(dprec_release_reader *r, dprec_release_row_fn on_row, void *user);

/* Feeds the next len bytes (any chunk size, including 0). Rows are delivered as soon as they are complete;
 * a header error is reported on the call that completes the header. Once an error is returned, every later
 * call returns it again. */
DPREC_API int dprec_release_reader_feed(dprec_release_reader *r, const void *chunk, size_t len);

/* Ends the stream: DPREC_OK only if exactly the announced bytes arrived and the digest matched; then
 * r->info is complete. Rows delivered before a failing finish must be discarded by the caller. */
DPREC_API int dprec_release_reader_finish(dprec_release_reader *r);

/* Writer for tools, tests and the aggregator. The size in bytes of a release with these parameters,
 * including a signature of sig_len bytes; 0 if they are out of range. */
DPREC_API uint64_t dprec_release_size(uint32_t num_items, uint32_t dim, uint16_t flags, uint16_t sig_len);

/* Writes an unsigned release into out (cap bytes). v is m*d floats row-major; item_bias is m floats or
 * NULL (then no biases are stored and global_mean must be 0). Header fields come from *info (format_version,
 * total_size, sig_* and digest are set by the writer, which also fills info->digest). *written gets the size. */
DPREC_API int dprec_release_write(void *out, size_t cap, dprec_release_info *info, const float *v,
                                  const float *item_bias, size_t *written);

DPREC_END_DECLS

#endif /* DPREC_RELEASE_H */
