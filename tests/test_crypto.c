/* Tests of the allocation-free AES-256-GCM: NIST GCM test vectors (McGrew & Viega, "The Galois/Counter
 * Mode of Operation", test cases 13-16, AES-256), and agreement with mbedTLS's own GCM on random inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "crypto.h"
#include "dprec/status.h"
#include "test_util.h"

static size_t unhex(const char *hex, unsigned char *out) {
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (unsigned char)v;
    }
    return n;
}

typedef struct vector {
    const char *key, *iv, *pt, *aad, *ct, *tag;
} vector;

static const vector vectors[] = {
    /* Test case 13 */
    {"0000000000000000000000000000000000000000000000000000000000000000", "000000000000000000000000", "", "", "",
     "530f8afbc74536b9a963b4f1c4cb738b"},
    /* Test case 14 */
    {"0000000000000000000000000000000000000000000000000000000000000000", "000000000000000000000000",
     "00000000000000000000000000000000", "", "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919"},
    /* Test case 15 */
    {"feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888",
     "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de6"
     "57ba637b391aafd255",
     "",
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a"
     "0abcc9f662898015ad",
     "b094dac5d93471bdec1a502270e3cc6c"},
    /* Test case 16 */
    {"feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888",
     "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de6"
     "57ba637b39",
     "feedfacedeadbeeffeedfacedeadbeefabaddad2",
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a"
     "0abcc9f662",
     "76fc6ece0f4e1768cddf8853bb2d551b"},
};

static void test_gcm_matches_the_nist_test_vectors(void **state) {
    (void)state;
    for (size_t v = 0; v < sizeof vectors / sizeof vectors[0]; v++) {
        unsigned char key[32], iv[12], pt[64], aad[32], ct[64], tag[16], buf[64], got[16];
        unhex(vectors[v].key, key);
        unhex(vectors[v].iv, iv);
        size_t n = unhex(vectors[v].pt, pt);
        size_t na = unhex(vectors[v].aad, aad);
        unhex(vectors[v].ct, ct);
        unhex(vectors[v].tag, tag);
        dprec_gcm g;
        assert_int_equal(dprec_gcm_setkey(&g, key), DPREC_OK);
        memcpy(buf, pt, n);
        assert_int_equal(dprec_gcm_encrypt(&g, iv, aad, na, buf, n, got), DPREC_OK);
        assert_memory_equal(buf, ct, n);
        assert_memory_equal(got, tag, 16);
        assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, na, buf, n, tag), DPREC_OK);
        assert_memory_equal(buf, pt, n);
        dprec_gcm_free(&g);
    }
}

static void test_gcm_agrees_with_mbedtls_on_random_inputs(void **state) {
    (void)state;
    test_rng r = {2024};
    unsigned char key[32], iv[12], aad[70], pt[300], a[300], b[300], ta[16], tb[16];
    for (int round = 0; round < 300; round++) {
        for (size_t i = 0; i < 32; i++) key[i] = (unsigned char)test_next(&r);
        for (size_t i = 0; i < 12; i++) iv[i] = (unsigned char)test_next(&r);
        size_t n = test_next(&r) % sizeof pt, na = test_next(&r) % sizeof aad;
        for (size_t i = 0; i < n; i++) pt[i] = (unsigned char)test_next(&r);
        for (size_t i = 0; i < na; i++) aad[i] = (unsigned char)test_next(&r);
        dprec_gcm g;
        assert_int_equal(dprec_gcm_setkey(&g, key), DPREC_OK);
        memcpy(a, pt, n);
        assert_int_equal(dprec_gcm_encrypt(&g, iv, aad, na, a, n, ta), DPREC_OK);
        mbedtls_gcm_context ref;
        mbedtls_gcm_init(&ref);
        assert_int_equal(mbedtls_gcm_setkey(&ref, MBEDTLS_CIPHER_ID_AES, key, 256), 0);
        assert_int_equal(mbedtls_gcm_crypt_and_tag(&ref, MBEDTLS_GCM_ENCRYPT, n, iv, 12, aad, na, pt, b, 16, tb), 0);
        mbedtls_gcm_free(&ref);
        assert_memory_equal(a, b, n);
        assert_memory_equal(ta, tb, 16);
        dprec_gcm_free(&g);
    }
}

static void test_gcm_refuses_any_tampering_and_leaves_the_buffer_unchanged(void **state) {
    (void)state;
    unsigned char key[32] = {1}, iv[12] = {2}, aad[8] = {3}, buf[40], copy[40], tag[16];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)i;
    dprec_gcm g;
    assert_int_equal(dprec_gcm_setkey(&g, key), DPREC_OK);
    assert_int_equal(dprec_gcm_encrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_OK);
    memcpy(copy, buf, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++) { /* ciphertext */
        buf[i] ^= 1;
        assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_ERR_STORE_KEY);
        buf[i] ^= 1;
        assert_memory_equal(buf, copy, sizeof buf);
    }
    for (size_t i = 0; i < sizeof aad; i++) { /* associated data */
        aad[i] ^= 0x80;
        assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_ERR_STORE_KEY);
        aad[i] ^= 0x80;
    }
    for (size_t i = 0; i < 16; i++) { /* tag */
        tag[i] ^= 4;
        assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_ERR_STORE_KEY);
        tag[i] ^= 4;
    }
    iv[0] ^= 1;
    assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_ERR_STORE_KEY);
    iv[0] ^= 1;
    assert_int_equal(dprec_gcm_decrypt(&g, iv, aad, sizeof aad, buf, sizeof buf, tag), DPREC_OK);
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], i);
    dprec_gcm_free(&g);
    dprec_gcm unkeyed;
    memset(&unkeyed, 0, sizeof unkeyed);
    assert_int_equal(dprec_gcm_encrypt(&unkeyed, iv, NULL, 0, buf, 1, tag), DPREC_ERR_STATE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcm_matches_the_nist_test_vectors),
        cmocka_unit_test(test_gcm_agrees_with_mbedtls_on_random_inputs),
        cmocka_unit_test(test_gcm_refuses_any_tampering_and_leaves_the_buffer_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
