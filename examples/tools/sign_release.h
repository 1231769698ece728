/* Host tools' release signer (dprec-mkrelease, the benchmarks): signs an unsigned release in place as the
 * aggregator does (aggregator/rounds/agg_sign.c): sig_alg and sig_len in the header, the digest recomputed over
 * header || body, the DER ECDSA signature of the digest appended. The digest covers the signature's length,
 * which is known only after signing, so signing repeats until the length announced is the length made. The
 * signature is randomized (a fresh k from rng each time, mbedtls_ecdsa_sign), not RFC 6979's deterministic
 * one that mbedtls_pk_sign gives when mbedTLS is built with MBEDTLS_ECDSA_DETERMINISTIC (Debian's is): for some
 * keys and releases the deterministic signature's length alternates between two values forever.
 * buf has room for DPREC_RELEASE_MAX_SIG bytes after *len. Returns 0, or a negative mbedTLS code, or -1. */
#ifndef DPREC_TOOLS_SIGN_RELEASE_H
#define DPREC_TOOLS_SIGN_RELEASE_H

#include <string.h>

#include <mbedtls/asn1write.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>

#include "dprec/release.h"

#ifndef MBEDTLS_PRIVATE /* mbedTLS 3 hides struct members behind it; 2.28 has none */
#define MBEDTLS_PRIVATE(member) member
#endif

/* DER SEQUENCE { INTEGER r, INTEGER s } (RFC 5480) of a fresh randomized ECDSA signature of digest. */
static inline int tool_sign_digest(mbedtls_pk_context *key, const unsigned char digest[32],
                            int (*rng)(void *, unsigned char *, size_t), void *rng_ctx, unsigned char *out,
                            size_t *out_len) {
    mbedtls_ecp_keypair *kp = mbedtls_pk_ec(*key);
    mbedtls_mpi r, s;
    unsigned char tmp[MBEDTLS_ECDSA_MAX_LEN];
    unsigned char *p = tmp + sizeof tmp;
    size_t len = 0;
    mbedtls_mpi_init(&r);
    mbedtls_mpi_init(&s);
    int rc = mbedtls_ecdsa_sign(&kp->MBEDTLS_PRIVATE(grp), &r, &s, &kp->MBEDTLS_PRIVATE(d), digest, 32, rng, rng_ctx);
    if (rc == 0) {
        int n = mbedtls_asn1_write_mpi(&p, tmp, &s);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_mpi(&p, tmp, &r);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_len(&p, tmp, len);
        if (n >= 0) len += (size_t)n, n = mbedtls_asn1_write_tag(&p, tmp, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE);
        if (n >= 0) len += (size_t)n;
        rc = n < 0 ? n : 0;
    }
    mbedtls_mpi_free(&r);
    mbedtls_mpi_free(&s);
    if (rc == 0) {
        memcpy(out, p, len);
        *out_len = len;
    }
    return rc;
}

static inline int tool_sign_release(mbedtls_pk_context *key, int (*rng)(void *, unsigned char *, size_t), void *rng_ctx,
                             unsigned char *buf, size_t *len) {
    size_t body = *len - DPREC_RELEASE_DIGEST_SIZE, sig_len = 72, got = 0;
    unsigned char digest[32], sig[MBEDTLS_ECDSA_MAX_LEN];
    for (int attempt = 0; attempt < 256; attempt++) {
        buf[44] = 1; /* sig_alg: ECDSA P-256 over SHA-256 */
        buf[45] = 0;
        buf[46] = (unsigned char)sig_len;
        buf[47] = 0;
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
        int rc = mbedtls_sha256(buf, body, digest, 0);
#else
        int rc = mbedtls_sha256_ret(buf, body, digest, 0);
#endif
        if (rc == 0) rc = tool_sign_digest(key, digest, rng, rng_ctx, sig, &got);
        if (rc != 0) return rc;
        if (got == sig_len) { /* the length the header announced, under the digest it signed */
            memcpy(buf + body, digest, 32);
            memcpy(buf + body + 32, sig, sig_len);
            *len = body + 32 + sig_len;
            return 0;
        }
        sig_len = got;
    }
    return -1;
}

#endif
