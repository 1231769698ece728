/* dprec internal — little-endian load/store, independent of the host's byte order and alignment, and the
 * float classification the SDK's input checks use. */
#ifndef DPREC_BYTES_H
#define DPREC_BYTES_H

#include <stdint.h>
#include <string.h>
#include "config_check.h"

static inline uint16_t dprec_ld16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t dprec_ld32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t dprec_ld64(const unsigned char *p) {
    return (uint64_t)dprec_ld32(p) | ((uint64_t)dprec_ld32(p + 4) << 32);
}
static inline float dprec_ldf32(const unsigned char *p) {
    uint32_t u = dprec_ld32(p);
    float f;
    memcpy(&f, &u, sizeof f); /* IEEE-754 binary32 on every target we support (checked in common/config_check.h) */
    return f;
}
/* Finite (not NaN, not infinite) and NaN tests on the bits: unlike x == x or isfinite(), no compiler option
 * can delete them (config_check.h refuses fast-math builds as well). */
static inline int dprec_finite_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7f800000u) != 0x7f800000u;
}
static inline int dprec_finite_f64(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7ff0000000000000u) != 0x7ff0000000000000u;
}
static inline int dprec_nan_f64(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
}
/* |x| <= 2^20 (DPREC_RELEASE_VALUE_MAX) on the raw binary32 word of a release value: the magnitude bits of a
 * float order like the value, and NaN and the infinities lie above every finite bound, so this refuses them
 * too. */
#define DPREC_VALUE_MAX_BITS 0x49800000u /* 2^20 as a float */
static inline int dprec_bounded_bits(uint32_t u) {
    return (u & 0x7fffffffu) <= DPREC_VALUE_MAX_BITS;
}
/* Whether this host stores integers and floats in the byte order of the formats (little-endian): then a run of them
 * is one memcpy. The test folds away at compile time. */
static inline int dprec_host_is_little_endian(void) {
    const uint32_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}
static inline void dprec_st16(unsigned char *p, uint16_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}
static inline void dprec_st32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
static inline void dprec_st64(unsigned char *p, uint64_t v) {
    dprec_st32(p, (uint32_t)v);
    dprec_st32(p + 4, (uint32_t)(v >> 32));
}
static inline void dprec_stf32(unsigned char *p, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    dprec_st32(p, u);
}

#endif /* DPREC_BYTES_H */
