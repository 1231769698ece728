/* Device identities and enrollment tokens (common/identity.h): signatures that verify only for their key and their
 * statement, tokens that parse only when well formed and pass only for their app, before their expiry, under the
 * app's enrollment key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <mbedtls/ecdsa.h>

#include "crypto.h"
#include "dprec/status.h"
#include "fake_agg.h"
#include "identity.h"

static void rng_for_test(dprec_rng *r, unsigned char tag) {
    unsigned char seed[32];
    memset(seed, tag, sizeof seed);
    assert_int_equal(dprec_rng_init(r, NULL, seed, sizeof seed, "identity test"), DPREC_OK);
}

static void test_identity_signature_verifies_only_for_its_key_and_statement(void **state) {
    (void)state;
    dprec_rng r;
    rng_for_test(&r, 1);
    unsigned char sk[DPREC_IDENTITY_SK_SIZE], pk[DPREC_IDENTITY_PK_SIZE], pk2[DPREC_IDENTITY_PK_SIZE], sk2[32];
    assert_int_equal(dprec_identity_generate(&r, sk, pk), DPREC_OK);
    assert_int_equal(dprec_identity_generate(&r, sk2, pk2), DPREC_OK);
    assert_int_equal(pk[0], 0x04);
    unsigned char again[DPREC_IDENTITY_PK_SIZE];
    assert_int_equal(dprec_identity_public(&r, sk, again), DPREC_OK);
    assert_memory_equal(again, pk, sizeof pk);

    unsigned char d[32], d_other[32], d_label[32], sig[DPREC_IDENTITY_SIG_SIZE];
    assert_int_equal(dprec_identity_digest("dprec test v1", "statement", 9, d), DPREC_OK);
    assert_int_equal(dprec_identity_digest("dprec test v1", "statemenT", 9, d_other), DPREC_OK);
    assert_int_equal(dprec_identity_digest("dprec test v2", "statement", 9, d_label), DPREC_OK);
    assert_memory_not_equal(d, d_label, 32); /* the label separates kinds of statement */
    assert_int_equal(dprec_identity_sign(&r, sk, d, sig), DPREC_OK);
    assert_int_equal(dprec_identity_verify(pk, d, sig), DPREC_OK);
    assert_int_equal(dprec_identity_verify(pk, d_other, sig), DPREC_ERR_CRYPTO);
    assert_int_equal(dprec_identity_verify(pk, d_label, sig), DPREC_ERR_CRYPTO);
    assert_int_equal(dprec_identity_verify(pk2, d, sig), DPREC_ERR_CRYPTO);
    for (size_t i = 0; i < sizeof sig; i += 7) { /* any flipped bit of r or s */
        sig[i] ^= 0x10;
        assert_int_equal(dprec_identity_verify(pk, d, sig), DPREC_ERR_CRYPTO);
        sig[i] ^= 0x10;
    }
    unsigned char bad[DPREC_IDENTITY_PK_SIZE];
    memcpy(bad, pk, sizeof bad);
    bad[64] ^= 1; /* off the curve */
    assert_int_equal(dprec_identity_verify(bad, d, sig), DPREC_ERR_CRYPTO);
    bad[64] ^= 1;
    bad[0] = 0x02; /* compressed encodings are not identities */
    assert_int_equal(dprec_identity_verify(bad, d, sig), DPREC_ERR_CRYPTO);
    unsigned char zero[32] = {0};
    assert_int_equal(dprec_identity_public(&r, zero, again), DPREC_ERR_CRYPTO); /* not a scalar */
    dprec_rng_free(&r);
}

/* A token of `app`, for identity pk, expiring at `expires`, signed by key (as the app's backend signs). */
static size_t make_token(fake_signer *key, const char *app, const unsigned char *pk, uint64_t expires,
                         unsigned char *out) {
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE], digest[32];
    memset(nonce, 0x5a, sizeof nonce);
    size_t body = 0;
    assert_int_equal(dprec_enroll_body(app, pk, expires, nonce, out, DPREC_ENROLL_BODY_MAX, &body), DPREC_OK);
    assert_int_equal(dprec_sha256(out, body, digest), 0);
    unsigned char sig[MBEDTLS_ECDSA_MAX_LEN];
    size_t n = fake_signer_sign_digest(key, digest, sig);
    assert_true(n >= DPREC_ENROLL_SIG_MIN && n <= DPREC_ENROLL_SIG_MAX);
    out[body] = (unsigned char)n;
    memcpy(out + body + 1, sig, n);
    return body + 1 + n;
}

static void test_enrollment_token_passes_only_for_its_app_key_and_time(void **state) {
    (void)state;
    dprec_rng r;
    rng_for_test(&r, 2);
    unsigned char sk[32], pk[DPREC_IDENTITY_PK_SIZE];
    assert_int_equal(dprec_identity_generate(&r, sk, pk), DPREC_OK);
    fake_signer backend, other;
    fake_signer_init(&backend, 11);
    fake_signer_init(&other, 12);
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX];
    size_t n = make_token(&backend, "org.example.app", pk, 2000000000u, tok);

    dprec_enroll_token t;
    assert_int_equal(dprec_enroll_parse(tok, n, &t), DPREC_OK);
    assert_string_equal(t.app_id, "org.example.app");
    assert_memory_equal(t.identity, pk, sizeof pk);
    assert_true(t.expires == 2000000000u);
    int cause = 0;
    assert_int_equal(dprec_enroll_check(&t, backend.pub, backend.pub_len, "org.example.app", 1900000000, &cause),
                     DPREC_OK);
    /* another app, expired (at and after the expiry), another key */
    assert_int_equal(dprec_enroll_check(&t, backend.pub, backend.pub_len, "org.example.other", 1900000000, NULL),
                     DPREC_ERR_ENROLLMENT);
    assert_int_equal(dprec_enroll_check(&t, backend.pub, backend.pub_len, "org.example.app", 2000000000, NULL),
                     DPREC_ERR_ENROLLMENT);
    assert_int_equal(dprec_enroll_check(&t, other.pub, other.pub_len, "org.example.app", 1900000000, &cause),
                     DPREC_ERR_ENROLLMENT);
    assert_int_not_equal(cause, 0); /* mbedTLS's reason is kept */
    /* a key that is not an EC P-256 public key is the operator's mistake, not the device's */
    unsigned char junk[16] = {0x30, 0x03, 0x02, 0x01, 0x01};
    assert_int_equal(dprec_enroll_check(&t, junk, sizeof junk, "org.example.app", 1900000000, NULL), DPREC_ERR_CONFIG);

    /* any byte of the signed part changed: the digest moves and the signature fails */
    for (size_t i = 5; i < n - t.sig_len - 1; i += 9) {
        unsigned char copy[DPREC_ENROLL_TOKEN_MAX];
        memcpy(copy, tok, n);
        copy[i] ^= 0x01;
        dprec_enroll_token u;
        int prc = dprec_enroll_parse(copy, n, &u);
        if (prc == DPREC_OK)
            assert_int_equal(dprec_enroll_check(&u, backend.pub, backend.pub_len, u.app_id, 1900000000, NULL),
                             DPREC_ERR_ENROLLMENT);
        else
            assert_int_equal(prc, DPREC_ERR_ENROLLMENT);
    }
    fake_signer_free(&other);
    fake_signer_free(&backend);
    dprec_rng_free(&r);
}

static void test_enrollment_token_malformed_is_refused(void **state) {
    (void)state;
    dprec_rng r;
    rng_for_test(&r, 3);
    unsigned char sk[32], pk[DPREC_IDENTITY_PK_SIZE];
    assert_int_equal(dprec_identity_generate(&r, sk, pk), DPREC_OK);
    fake_signer backend;
    fake_signer_init(&backend, 21);
    unsigned char tok[DPREC_ENROLL_TOKEN_MAX + 8];
    size_t n = make_token(&backend, "a", pk, 2000000000u, tok);
    dprec_enroll_token t;
    for (size_t len = 0; len < n; len++) /* every truncation */
        assert_int_equal(dprec_enroll_parse(tok, len, &t), DPREC_ERR_ENROLLMENT);
    tok[n] = 0;
    assert_int_equal(dprec_enroll_parse(tok, n + 1, &t), DPREC_ERR_ENROLLMENT); /* a trailing byte */
    unsigned char copy[sizeof tok];
    memcpy(copy, tok, n);
    copy[0] = 'X'; /* magic */
    assert_int_equal(dprec_enroll_parse(copy, n, &t), DPREC_ERR_ENROLLMENT);
    memcpy(copy, tok, n);
    copy[4] = 0; /* an empty app id */
    assert_int_equal(dprec_enroll_parse(copy, n, &t), DPREC_ERR_ENROLLMENT);
    memcpy(copy, tok, n);
    copy[5] = ' '; /* an app id with a space */
    assert_int_equal(dprec_enroll_parse(copy, n, &t), DPREC_ERR_ENROLLMENT);
    memcpy(copy, tok, n);
    copy[6] = 0x02; /* the identity's point prefix */
    assert_int_equal(dprec_enroll_parse(copy, n, &t), DPREC_ERR_ENROLLMENT);
    memcpy(copy, tok, n);
    assert_int_equal(dprec_enroll_parse(tok, n, &t), DPREC_OK);
    size_t at = n - t.sig_len - 1;
    copy[at] = (unsigned char)(t.sig_len + 1); /* sig_len past the end */
    assert_int_equal(dprec_enroll_parse(copy, n, &t), DPREC_ERR_ENROLLMENT);
    copy[at] = 3; /* below the shortest DER signature */
    assert_int_equal(dprec_enroll_parse(copy, at + 4, &t), DPREC_ERR_ENROLLMENT);
    /* the encoder refuses what the parser would */
    size_t len = 0;
    unsigned char nonce[DPREC_ENROLL_NONCE_SIZE] = {0};
    char long_id[DPREC_ENROLL_APP_ID_MAX + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_int_equal(dprec_enroll_body(long_id, pk, 1, nonce, copy, sizeof copy, &len), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_enroll_body("", pk, 1, nonce, copy, sizeof copy, &len), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_enroll_body("app", pk, 1, nonce, copy, 10, &len), DPREC_ERR_BUFFER_TOO_SMALL);
    fake_signer_free(&backend);
    dprec_rng_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_signature_verifies_only_for_its_key_and_statement),
        cmocka_unit_test(test_enrollment_token_passes_only_for_its_app_key_and_time),
        cmocka_unit_test(test_enrollment_token_malformed_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
