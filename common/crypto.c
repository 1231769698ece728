/* dprec — CSPRNG and AES-256-GCM without heap allocation (see crypto.h). */
#include "crypto.h"

#include <string.h>

#include "bytes.h"
#include "dprec/status.h"

void dprec_wipe(void *p, size_t n) {
    volatile unsigned char *v = (volatile unsigned char *)p;
    while (n--) *v++ = 0;
}

/* ---- CSPRNG ---------------------------------------------------------------------------------------- */

static int rng_entropy_port(void *ctx, unsigned char *out, size_t len) {
    dprec_rng *r = (dprec_rng *)ctx;
    return r->port->entropy(r->port->ctx, out, len) == DPREC_OK ? 0 : MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
}

/* Test mode: block i of the "entropy" is SHA-256(seed || i), so a seed fixes every draw. */
static int rng_entropy_seed(void *ctx, unsigned char *out, size_t len) {
    dprec_rng *r = (dprec_rng *)ctx;
    unsigned char block[32 + 64 + 8];
    while (len > 0) {
        unsigned char digest[32];
        memcpy(block, r->seed_copy, r->seed_len);
        dprec_st64(block + r->seed_len, r->seed_counter++);
        if (dprec_sha256(block, r->seed_len + 8, digest) != 0) return MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
        size_t n = len < sizeof digest ? len : sizeof digest;
        memcpy(out, digest, n);
        out += n;
        len -= n;
    }
    return 0;
}

int dprec_rng_init(dprec_rng *r, const dprec_port *port, const unsigned char *test_seed, size_t test_seed_len,
                   const char *personalization) {
    memset(r, 0, sizeof *r);
    mbedtls_ctr_drbg_init(&r->drbg);
    r->port = port;
    int (*source)(void *, unsigned char *, size_t) = rng_entropy_port;
    if (test_seed != NULL) {
        if (test_seed_len == 0 || test_seed_len > sizeof r->seed_copy) return DPREC_ERR_INVALID_ARGUMENT;
        memcpy(r->seed_copy, test_seed, test_seed_len);
        r->seed_len = test_seed_len;
        r->seed = r->seed_copy;
        source = rng_entropy_seed;
    } else if (port == NULL || port->entropy == NULL) {
        return DPREC_ERR_PORT_MISSING;
    }
    size_t plen = personalization ? strlen(personalization) : 0;
    int rc = mbedtls_ctr_drbg_seed(&r->drbg, source, r, (const unsigned char *)personalization, plen);
    if (rc != 0) {
        r->last_cause = rc;
        return rc == MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED ? DPREC_ERR_ENTROPY : DPREC_ERR_CRYPTO;
    }
    return DPREC_OK;
}

int dprec_rng_bytes(dprec_rng *r, void *out, size_t len) {
    unsigned char *p = (unsigned char *)out;
    while (len > 0) { /* CTR_DRBG caps one request at MBEDTLS_CTR_DRBG_MAX_REQUEST bytes */
        size_t n = len < MBEDTLS_CTR_DRBG_MAX_REQUEST ? len : MBEDTLS_CTR_DRBG_MAX_REQUEST;
        int rc = mbedtls_ctr_drbg_random(&r->drbg, p, n);
        if (rc != 0) {
            r->last_cause = rc;
            return rc == MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED ? DPREC_ERR_ENTROPY : DPREC_ERR_CRYPTO;
        }
        p += n;
        len -= n;
    }
    return DPREC_OK;
}

void dprec_rng_free(dprec_rng *r) {
    mbedtls_ctr_drbg_free(&r->drbg);
    dprec_wipe(r, sizeof *r);
}

/* ---- AES-256-GCM ----------------------------------------------------------------------------------- */

/* X := X * H in GF(2^128) with GCM's bit order (NIST SP 800-38D, Algorithm 1), without branches on
 * secret bits: each step selects with all-ones/all-zeros masks. */
static void ghash_mul(uint64_t *x_hi, uint64_t *x_lo, uint64_t h_hi, uint64_t h_lo) {
    uint64_t z_hi = 0, z_lo = 0, v_hi = h_hi, v_lo = h_lo;
    uint64_t xh = *x_hi, xl = *x_lo;
    for (int i = 0; i < 128; i++) {
        uint64_t bit = i < 64 ? (xh >> (63 - i)) & 1u : (xl >> (127 - i)) & 1u;
        uint64_t m = (uint64_t)0 - bit;
        z_hi ^= v_hi & m;
        z_lo ^= v_lo & m;
        uint64_t lsb = (uint64_t)0 - (v_lo & 1u);
        v_lo = (v_lo >> 1) | (v_hi << 63);
        v_hi = (v_hi >> 1) ^ (0xE100000000000000ull & lsb); /* R = 11100001 || 0^120 */
    }
    *x_hi = z_hi;
    *x_lo = z_lo;
}

static uint64_t ld64be(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static void st64be(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)v;
        v >>= 8;
    }
}

/* Absorbs data into the GHASH state, zero-padding the last partial block. */
static void ghash_update(const dprec_gcm *g, uint64_t *y_hi, uint64_t *y_lo, const unsigned char *data, size_t len) {
    while (len > 0) {
        unsigned char block[16] = {0};
        size_t n = len < 16 ? len : 16;
        memcpy(block, data, n);
        *y_hi ^= ld64be(block);
        *y_lo ^= ld64be(block + 8);
        ghash_mul(y_hi, y_lo, g->h_hi, g->h_lo);
        data += n;
        len -= n;
    }
}

int dprec_gcm_setkey(dprec_gcm *g, const unsigned char key[32]) {
    memset(g, 0, sizeof *g);
    mbedtls_aes_init(&g->aes);
    if (mbedtls_aes_setkey_enc(&g->aes, key, 256) != 0) return DPREC_ERR_CRYPTO;
    unsigned char zero[16] = {0}, h[16];
    if (mbedtls_aes_crypt_ecb(&g->aes, MBEDTLS_AES_ENCRYPT, zero, h) != 0) return DPREC_ERR_CRYPTO;
    g->h_hi = ld64be(h);
    g->h_lo = ld64be(h + 8);
    dprec_wipe(h, sizeof h);
    g->ready = 1;
    return DPREC_OK;
}

/* CTR mode from counter block J0 + 1 (96-bit IV: J0 = IV || 0^31 || 1), 32-bit big-endian increment. */
static int gcm_ctr(dprec_gcm *g, const unsigned char iv[12], unsigned char *buf, size_t len) {
    unsigned char ctr[16], ks[16];
    memcpy(ctr, iv, 12);
    uint32_t c = 2;
    while (len > 0) {
        ctr[12] = (unsigned char)(c >> 24);
        ctr[13] = (unsigned char)(c >> 16);
        ctr[14] = (unsigned char)(c >> 8);
        ctr[15] = (unsigned char)c;
        if (mbedtls_aes_crypt_ecb(&g->aes, MBEDTLS_AES_ENCRYPT, ctr, ks) != 0) return DPREC_ERR_CRYPTO;
        size_t n = len < 16 ? len : 16;
        for (size_t i = 0; i < n; i++) buf[i] ^= ks[i];
        buf += n;
        len -= n;
        c++;
    }
    dprec_wipe(ks, sizeof ks);
    return DPREC_OK;
}

/* tag = E_K(J0) xor GHASH_H(A || pad || C || pad || [len(A)]_64 || [len(C)]_64). */
static int gcm_tag(dprec_gcm *g, const unsigned char iv[12], const unsigned char *aad, size_t aad_len,
                   const unsigned char *ct, size_t len, unsigned char tag[16]) {
    uint64_t y_hi = 0, y_lo = 0;
    ghash_update(g, &y_hi, &y_lo, aad, aad_len);
    ghash_update(g, &y_hi, &y_lo, ct, len);
    y_hi ^= (uint64_t)aad_len * 8u;
    y_lo ^= (uint64_t)len * 8u;
    ghash_mul(&y_hi, &y_lo, g->h_hi, g->h_lo);
    unsigned char j0[16], ek[16], s[16];
    memcpy(j0, iv, 12);
    j0[12] = 0;
    j0[13] = 0;
    j0[14] = 0;
    j0[15] = 1;
    if (mbedtls_aes_crypt_ecb(&g->aes, MBEDTLS_AES_ENCRYPT, j0, ek) != 0) return DPREC_ERR_CRYPTO;
    st64be(s, y_hi);
    st64be(s + 8, y_lo);
    for (int i = 0; i < 16; i++) tag[i] = (unsigned char)(s[i] ^ ek[i]);
    return DPREC_OK;
}

/* SP 800-38D caps one message at 2^32 - 2 blocks; only reachable where size_t is wider than 32 bits. */
static int gcm_len_ok(size_t len) {
#if SIZE_MAX > 0xFFFFFFFFu
    return (uint64_t)len <= ((1ull << 32) - 2) * 16u;
#else
    (void)len;
    return 1;
#endif
}

int dprec_gcm_encrypt(dprec_gcm *g, const unsigned char iv[12], const unsigned char *aad, size_t aad_len,
                      unsigned char *buf, size_t len, unsigned char tag[16]) {
    if (!g->ready) return DPREC_ERR_STATE;
    if (!gcm_len_ok(len)) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = gcm_ctr(g, iv, buf, len);
    if (rc != DPREC_OK) return rc;
    return gcm_tag(g, iv, aad, aad_len, buf, len, tag);
}

int dprec_gcm_decrypt(dprec_gcm *g, const unsigned char iv[12], const unsigned char *aad, size_t aad_len,
                      unsigned char *buf, size_t len, const unsigned char tag[16]) {
    if (!g->ready) return DPREC_ERR_STATE;
    if (!gcm_len_ok(len)) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char expect[16];
    int rc = gcm_tag(g, iv, aad, aad_len, buf, len, expect);
    if (rc != DPREC_OK) return rc;
    unsigned char diff = 0;
    for (int i = 0; i < 16; i++) diff |= (unsigned char)(expect[i] ^ tag[i]);
    if (diff != 0) return DPREC_ERR_STORE_KEY;
    return gcm_ctr(g, iv, buf, len);
}

void dprec_gcm_free(dprec_gcm *g) {
    mbedtls_aes_free(&g->aes);
    dprec_wipe(g, sizeof *g);
}
