/* Shared test helpers: a fixed-seed generator for test data (never privacy noise) and release builders. */
#ifndef DPREC_TEST_UTIL_H
#define DPREC_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dprec/dprec.h"

typedef struct test_rng {
    uint64_t s;
} test_rng;

static inline uint32_t test_next(test_rng *r) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 32);
}
static inline double test_uniform(test_rng *r) { /* [0, 1) */
    return (double)test_next(r) / 4294967296.0;
}

/* A release of the given m x d matrix v and item biases b (NULL: none, and mu must be 0), global mean mu, in the
 * encoding (0: float32; DPREC_RELEASE_ENC_Q16 or _Q8: compact). Returns a malloc'd buffer (NULL if the writer
 * refused) and its size in *len. */
static inline unsigned char *test_write_release_enc(uint32_t m, uint32_t d, const float *v, const float *b, float mu,
                                                    uint16_t encoding, size_t *len) {
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = 7;
    info.job_id = 42;
    info.num_items = m;
    info.dim = d;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = mu;
    info.flags = (uint16_t)((b ? DPREC_RELEASE_HAS_BIASES : 0) | encoding);
    size_t cap = (size_t)dprec_release_size(m, d, info.flags, 0);
    unsigned char *buf = malloc(cap);
    size_t written = 0;
    if (dprec_release_write(buf, cap, &info, v, b, &written) != DPREC_OK || written != cap) {
        free(buf);
        buf = NULL;
    }
    *len = written;
    return buf;
}

/* The same with the items' uncertainty column (release format 3; unc: m * DPREC_RELEASE_UNCERTAINTY_WIDTH bytes,
 * flags DPREC_RELEASE_UNC_PINNED0). */
static inline unsigned char *test_write_release_unc(uint32_t m, uint32_t d, const float *v, const float *b, float mu,
                                                    uint16_t encoding, const unsigned char *unc, size_t *len) {
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = 7;
    info.job_id = 42;
    info.num_items = m;
    info.dim = d;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = mu;
    info.flags = (uint16_t)((b ? DPREC_RELEASE_HAS_BIASES : 0) | encoding);
    dprec_release_column_data col = {DPREC_RELEASE_COL_UNCERTAINTY, DPREC_RELEASE_UNC_PINNED0,
                                     DPREC_RELEASE_UNCERTAINTY_WIDTH, unc};
    size_t cap = (size_t)dprec_release_size_columns(m, d, info.flags, DPREC_RELEASE_UNCERTAINTY_WIDTH, 0);
    unsigned char *buf = malloc(cap);
    size_t written = 0;
    if (dprec_release_write_columns(buf, cap, &info, v, b, &col, 1, &written) != DPREC_OK || written != cap) {
        free(buf);
        buf = NULL;
    }
    *len = written;
    return buf;
}

/* The same in float32 (release format 1). */
static inline unsigned char *test_write_release(uint32_t m, uint32_t d, const float *v, const float *b, float mu,
                                                size_t *len) {
    return test_write_release_enc(m, d, v, b, mu, 0, len);
}

/* Makes an unsigned test release the client's trusted release: dprec_release_verify with
 * DPREC_VERIFY_INSECURE_UNSIGNED (test data only: such a release is trusted on its digest alone). */
static inline int test_trust(dprec_client *c, const void *rel, size_t len) {
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED;
    return dprec_release_verify(c, rel, len, &vc, NULL);
}

/* A random release (m x d, entries in [-1, 1), item biases in [-0.5, 0.5) and mu = 3.5 when biases).
 * Returns a malloc'd buffer; *len gets its size; v/bias (if non-NULL) get malloc'd copies of the matrix. */
static inline unsigned char *test_make_release(uint32_t m, uint32_t d, int biases, uint64_t seed, size_t *len,
                                               float **v_out, float **bias_out) {
    test_rng r = {seed};
    float *v = malloc(sizeof(float) * m * d);
    float *b = biases ? malloc(sizeof(float) * m) : NULL;
    for (size_t i = 0; i < (size_t)m * d; i++) v[i] = (float)(2.0 * test_uniform(&r) - 1.0);
    if (b)
        for (uint32_t j = 0; j < m; j++) b[j] = (float)(test_uniform(&r) - 0.5);
    unsigned char *buf = test_write_release(m, d, v, b, biases ? 3.5f : 0.0f, len);
    if (v_out) *v_out = v;
    else free(v);
    if (bias_out) *bias_out = b;
    else free(b);
    return buf;
}

#endif
