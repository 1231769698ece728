/* Benchmarks' release signer: signs an unsigned release in place as the aggregator does (agg_sign.c): sig_alg
 * and sig_len in the header, the digest recomputed over header || body, the DER signature appended; the digest
 * covers the signature's length, so signing repeats until the length announced is the length made. buf must
 * have DPREC_RELEASE_MAX_SIG bytes free after *len. Returns 0, or -1. */
#ifndef DPREC_BENCH_SIGN_H
#define DPREC_BENCH_SIGN_H

#include <string.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/pk.h>

#include "dprec/release.h"
#include "mbedtls_compat.h"

static int bench_sign_release(mbedtls_pk_context *key, mbedtls_ctr_drbg_context *drbg, unsigned char *buf, size_t *len) {
    size_t body = *len - DPREC_RELEASE_DIGEST_SIZE, sig_len = 72, got = 0;
    unsigned char digest[32], sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
    for (int attempt = 0; attempt < 64; attempt++) {
        buf[44] = 1; /* sig_alg: ECDSA P-256 */
        buf[45] = 0;
        buf[46] = (unsigned char)sig_len;
        buf[47] = 0;
        if (dprec_sha256(buf, body, digest) != 0) return -1;
#if MBEDTLS_VERSION_NUMBER >= 0x03000000
        if (mbedtls_pk_sign(key, MBEDTLS_MD_SHA256, digest, 32, sig, sizeof sig, &got, mbedtls_ctr_drbg_random, drbg) != 0)
            return -1;
#else
        if (mbedtls_pk_sign(key, MBEDTLS_MD_SHA256, digest, 32, sig, &got, mbedtls_ctr_drbg_random, drbg) != 0) return -1;
#endif
        if (got == sig_len) break;
        sig_len = got;
    }
    if (got != sig_len) return -1;
    memcpy(buf + body, digest, 32);
    memcpy(buf + body + 32, sig, sig_len);
    *len = body + 32 + sig_len;
    return 0;
}

#endif
