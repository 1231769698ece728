/* dprec internal — SHA-256 (FIPS 180-4), with the x86 SHA extensions where the CPU has them.
 *
 * Why not mbedTLS's: the releases a device checks are hashed whole (common/release.c: 427 KB a round at the
 * MovieLens-10M shape, d = 10), and mbedTLS 2.28 hashes in portable C only; on a CPU with the SHA extensions
 * (Intel since Goldmont and Ice Lake, AMD since Zen) the same digest costs a fraction of that (docs/benchmarks.md
 * "SHA-256"). Elsewhere (ARM devices, older x86) the portable compression here runs, the same digest. Which one runs is
 * decided once, by CPUID; nothing allocates. The one-shot dprec_sha256() of common/mbedtls_compat.h calls
 * dprec_sha2(). */
#ifndef DPREC_SHA256_H
#define DPREC_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct dprec_sha2_ctx {
    uint32_t h[8];
    uint64_t bytes;          /* hashed so far */
    unsigned char buf[64];   /* a partial block */
    uint32_t used;           /* its bytes */
} dprec_sha2_ctx;

void dprec_sha2_init(dprec_sha2_ctx *c);
void dprec_sha2_update(dprec_sha2_ctx *c, const void *data, size_t len);
/* The digest; c is then spent (init it again to reuse it). */
void dprec_sha2_final(dprec_sha2_ctx *c, unsigned char out[32]);
/* One buffer's digest. 0 (an int, as the mbedTLS call it stands in for). */
int dprec_sha2(const void *data, size_t len, unsigned char out[32]);

/* 1 when the SHA extensions compress (the CPU has them and they are not turned off), else 0. */
int dprec_sha2_accelerated(void);
/* Tests: 1 turns the SHA extensions off (the portable compression runs), 0 lets CPUID decide again. */
void dprec_sha2_force_portable(int on);

#endif /* DPREC_SHA256_H */
