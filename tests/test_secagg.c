/* Tests of the secure-aggregation primitives (common/secagg.c): Shamir over GF(2^31 - 1), the AES-CTR mask PRG,
 * X25519 + HKDF key agreement. The rounds, with the aggregator, are in tests/test_agg_secagg.c.
 *
 * Statistical checks (uniformity) use Pearson's chi-square on 16 equiprobable bins with >= 1,000 expected per
 * bin, rejected above 70 (15 degrees of freedom: p < 1e-8 by the Wilson-Hilferty approximation); four run, so
 * the file fails falsely with probability below 1e-7. Seeds are fixed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "noise.h"
#include "secagg.h"

#define CHI2_15 70.0

static void seed_rng(dprec_rng *r, const char *seed) {
    assert_int_equal(dprec_rng_init(r, NULL, (const unsigned char *)seed, strlen(seed), "test"), DPREC_OK);
}

static double chi2_16(const long *bins, long total) {
    double e = (double)total / 16.0, c = 0.0;
    for (int i = 0; i < 16; i++) c += ((double)bins[i] - e) * ((double)bins[i] - e) / e;
    return c;
}

static void test_shamir_any_t_shares_recover_the_secret(void **state) {
    (void)state;
    dprec_rng r;
    seed_rng(&r, "shamir");
    unsigned char secret[32], back[32];
    uint32_t xs[12];
    dprec_shamir_share sh[12], pick[12];
    for (uint32_t i = 0; i < 12; i++) xs[i] = i + 1;
    for (int rep = 0; rep < 50; rep++) {
        assert_int_equal(dprec_rng_bytes(&r, secret, 32), DPREC_OK);
        if (rep == 0) memset(secret, 0xff, 32); /* every chunk at its largest value */
        if (rep == 1) memset(secret, 0, 32);
        uint32_t t = 1 + (uint32_t)rep % 12;
        assert_int_equal(dprec_shamir_split(&r, secret, t, xs, 12, sh), DPREC_OK);
        /* a rotating choice of t of the 12 holders */
        for (uint32_t i = 0; i < t; i++) pick[i] = sh[(i * 5 + (uint32_t)rep) % 12];
        int distinct = 1;
        for (uint32_t i = 0; i < t; i++)
            for (uint32_t m = 0; m < i; m++) distinct &= pick[i].x != pick[m].x;
        if (!distinct)
            for (uint32_t i = 0; i < t; i++) pick[i] = sh[(i + (uint32_t)rep) % 12];
        assert_int_equal(dprec_shamir_combine(pick, t, t, back), DPREC_OK);
        assert_memory_equal(back, secret, 32);
        if (t >= 2) { /* t - 1 shares interpolate some other polynomial: not the secret (but for chance 2^-24) */
            int rc = dprec_shamir_combine(pick, t - 1, t - 1, back);
            assert_true(rc == DPREC_ERR_CRYPTO || memcmp(back, secret, 32) != 0);
        }
    }
    assert_int_equal(dprec_shamir_combine(sh, 2, 3, back), DPREC_ERR_INVALID_ARGUMENT); /* too few */
    pick[0] = sh[0];
    pick[1] = sh[0];
    assert_int_equal(dprec_shamir_combine(pick, 2, 2, back), DPREC_ERR_INVALID_ARGUMENT); /* the same point twice */
    xs[1] = xs[0];
    assert_int_equal(dprec_shamir_split(&r, secret, 2, xs, 3, sh), DPREC_ERR_INVALID_ARGUMENT);
    dprec_rng_free(&r);
}

static void test_shamir_fewer_than_t_shares_are_independent_of_the_secret(void **state) {
    (void)state;
    /* t = 3 of 3: any 2 shares are uniform on GF(p)^2 whatever the secret. Histogram of (top 2 bits of y_1, top 2
     * bits of y_2) of chunk 0, for the secret 0 and for the secret ff..ff */
    dprec_rng r;
    seed_rng(&r, "shamir secrecy");
    uint32_t xs[3] = {4, 9, 11};
    dprec_shamir_share sh[3];
    for (int which = 0; which < 2; which++) {
        unsigned char secret[32];
        memset(secret, which ? 0xff : 0, 32);
        long bins[16] = {0}, n = 32000;
        for (long i = 0; i < n; i++) {
            assert_int_equal(dprec_shamir_split(&r, secret, 3, xs, 3, sh), DPREC_OK);
            /* y < p = 2^31 - 1: the top two bits of 31 split [0, p) into four parts of equal size up to 1/2^29 */
            bins[((sh[0].y[0] >> 29) << 2) | (sh[1].y[0] >> 29)]++;
        }
        double c = chi2_16(bins, n);
        if (c > CHI2_15) fail_msg("secret %d: chi-square %f", which, c);
    }
    dprec_rng_free(&r);
}

static void test_secagg_keys_agree_on_both_sides_and_only_there(void **state) {
    (void)state;
    dprec_rng r;
    seed_rng(&r, "x25519");
    unsigned char a[32], b[32], pa[32], pb[32], k1[32], k2[32], k3[32];
    assert_int_equal(dprec_rng_bytes(&r, a, 32), DPREC_OK);
    assert_int_equal(dprec_rng_bytes(&r, b, 32), DPREC_OK);
    a[0] &= 248, a[31] &= 127, a[31] |= 64;
    b[0] &= 248, b[31] &= 127, b[31] |= 64;
    assert_int_equal(dprec_secagg_public(&r, a, pa), DPREC_OK);
    assert_int_equal(dprec_secagg_public(&r, b, pb), DPREC_OK);
    assert_int_equal(dprec_secagg_derive(&r, a, pb, 7, DPREC_SECAGG_MASK_LABEL, 10, 20, k1), DPREC_OK);
    assert_int_equal(dprec_secagg_derive(&r, b, pa, 7, DPREC_SECAGG_MASK_LABEL, 20, 10, k2), DPREC_OK);
    assert_memory_equal(k1, k2, 32);
    assert_int_equal(dprec_secagg_derive(&r, a, pb, 8, DPREC_SECAGG_MASK_LABEL, 10, 20, k3), DPREC_OK);
    assert_memory_not_equal(k1, k3, 32); /* another round */
    assert_int_equal(dprec_secagg_derive(&r, a, pb, 7, DPREC_SECAGG_ENC_LABEL, 10, 20, k3), DPREC_OK);
    assert_memory_not_equal(k1, k3, 32); /* another purpose */
    /* RFC 7748 Sec. 6.1 test vector: Alice's public key from her private key */
    static const unsigned char alice_sk[32] = {0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1,
                                               0x72, 0x51, 0xb2, 0x66, 0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0,
                                               0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5, 0x1d, 0xb9, 0x2c, 0x2a};
    static const unsigned char alice_pk[32] = {0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d,
                                               0xdc, 0xb4, 0x3e, 0xf7, 0x5a, 0x0d, 0xbf, 0x3a, 0x0d, 0x26, 0x38,
                                               0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e, 0xaa, 0x9b, 0x4e, 0x6a};
    unsigned char sk[32];
    memcpy(sk, alice_sk, 32);
    sk[0] &= 248, sk[31] &= 127, sk[31] |= 64; /* RFC 7748 clamps inside X25519; mbedTLS wants it clamped */
    assert_int_equal(dprec_secagg_public(&r, sk, pa), DPREC_OK);
    assert_memory_equal(pa, alice_pk, 32);
    /* a low-order peer key (0) gives the all-zero secret: refused */
    memset(pb, 0, 32);
    assert_int_equal(dprec_secagg_derive(&r, a, pb, 7, DPREC_SECAGG_MASK_LABEL, 10, 20, k3), DPREC_ERR_CRYPTO);
    dprec_rng_free(&r);
}

static void test_secagg_prg_masks_cancel_and_are_uniform(void **state) {
    (void)state;
    enum { N = 32768 };
    static uint64_t v[N];
    unsigned char seed[32];
    for (int i = 0; i < 32; i++) seed[i] = (unsigned char)(3 * i + 1);
    for (uint32_t bits = 20; bits <= 62; bits += 42) {
        uint64_t mask = ((uint64_t)1 << bits) - 1;
        for (uint32_t j = 0; j < N; j++) v[j] = (j * 2654435761u) & mask;
        assert_int_equal(dprec_secagg_prg_add(seed, bits, 1, v, N), DPREC_OK);
        long hi[16] = {0};
        for (uint32_t j = 0; j < N; j++) {
            assert_true(v[j] <= mask);
            hi[(v[j] >> (bits - 4)) & 15]++;
        }
        double c = chi2_16(hi, N);
        if (c > CHI2_15) fail_msg("bits %u: chi-square %f", bits, c);
        assert_int_equal(dprec_secagg_prg_add(seed, bits, -1, v, N), DPREC_OK);
        for (uint32_t j = 0; j < N; j++) assert_true(v[j] == ((j * 2654435761u) & mask));
    }
    assert_int_equal(dprec_secagg_prg_add(seed, 0, 1, v, 4), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_secagg_prg_add(seed, 20, 2, v, 4), DPREC_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shamir_any_t_shares_recover_the_secret),
        cmocka_unit_test(test_shamir_fewer_than_t_shares_are_independent_of_the_secret),
        cmocka_unit_test(test_secagg_keys_agree_on_both_sides_and_only_there),
        cmocka_unit_test(test_secagg_prg_masks_cancel_and_are_uniform),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
