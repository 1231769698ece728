/* dprec internal — one spelling for the mbedTLS calls we use, across mbedTLS 2.28 (Debian 12) and 3.x.
 *
 * 2.x names the returning SHA-256 functions *_ret (the plain names are deprecated void functions);
 * 3.x drops the suffix and returns int. GCM, AES and CTR_DRBG keep the same names in both. */
#ifndef DPREC_MBEDTLS_COMPAT_H
#define DPREC_MBEDTLS_COMPAT_H

#include <mbedtls/version.h>

#if MBEDTLS_VERSION_NUMBER >= 0x03000000
#include <mbedtls/build_info.h>
#endif
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/gcm.h>
#include <mbedtls/sha256.h>

#include "sha256.h"

#if MBEDTLS_VERSION_NUMBER >= 0x03000000
#define dprec_sha256_starts(ctx) mbedtls_sha256_starts((ctx), 0)
#define dprec_sha256_update(ctx, buf, len) mbedtls_sha256_update((ctx), (buf), (len))
#define dprec_sha256_finish(ctx, out) mbedtls_sha256_finish((ctx), (out))
#elif MBEDTLS_VERSION_NUMBER >= 0x02070000
#define dprec_sha256_starts(ctx) mbedtls_sha256_starts_ret((ctx), 0)
#define dprec_sha256_update(ctx, buf, len) mbedtls_sha256_update_ret((ctx), (buf), (len))
#define dprec_sha256_finish(ctx, out) mbedtls_sha256_finish_ret((ctx), (out))
#else
#error "dprec needs mbedTLS 2.7 or newer (2.28 LTS or 3.x recommended)"
#endif
/* One buffer's SHA-256: sha256.h's, which uses the CPU's SHA extensions where there are some. 0. */
#define dprec_sha256(buf, len, out) dprec_sha2((buf), (len), (out))

#if !defined(MBEDTLS_SHA256_C) || !defined(MBEDTLS_GCM_C) || !defined(MBEDTLS_AES_C) || \
    !defined(MBEDTLS_CTR_DRBG_C)
#error "dprec needs an mbedTLS built with SHA256, AES, GCM and CTR_DRBG"
#endif

#endif /* DPREC_MBEDTLS_COMPAT_H */
