/* SHA-256 (common/sha256.c): the FIPS 180-4 examples and NIST's long message, and the same digests as mbedTLS's for
 * every length from 0 to 300 bytes and for random messages fed in random pieces, by the portable compression and, on a
 * CPU with the SHA extensions, by them (each path forced in turn: a wrong path must not hide behind the other). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <mbedtls/sha256.h>

#include "mbedtls_compat.h"
#include "sha256.h"

static void hex(const unsigned char *d, char out[65]) {
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void expect_digest(const void *msg, size_t len, const char *want) {
    unsigned char d[32];
    char h[65];
    assert_int_equal(dprec_sha2(msg, len, d), 0);
    hex(d, h);
    assert_string_equal(h, want);
}

/* FIPS 180-4's examples (NIST, "SHA256.pdf", Cryptographic Standards and Guidelines: Examples with Intermediate Values)
 * and the one-million-'a' message of FIPS 180-2 appendix B.3 */
static void known_answers(void) {
    expect_digest("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect_digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static unsigned char a[1000000];
    memset(a, 'a', sizeof a);
    expect_digest(a, sizeof a, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* the same message in pieces of 997 bytes (not a multiple of the block) */
    dprec_sha2_ctx c;
    unsigned char d[32];
    char h[65];
    dprec_sha2_init(&c);
    for (size_t off = 0; off < sizeof a; off += 997) dprec_sha2_update(&c, a + off, sizeof a - off < 997 ? sizeof a - off : 997);
    dprec_sha2_final(&c, d);
    hex(d, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static uint64_t rng_state = 0x5a256ULL;
static uint64_t next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void mbed_digest(const unsigned char *m, size_t len, unsigned char out[32]) {
    mbedtls_sha256_context c;
    mbedtls_sha256_init(&c);
    assert_int_equal(dprec_sha256_starts(&c), 0);
    assert_int_equal(dprec_sha256_update(&c, m, len), 0);
    assert_int_equal(dprec_sha256_finish(&c, out), 0);
    mbedtls_sha256_free(&c);
}

static void same_as_mbedtls(void) {
    static unsigned char m[70000];
    for (size_t i = 0; i < sizeof m; i++) m[i] = (unsigned char)next();
    unsigned char want[32], got[32];
    for (size_t len = 0; len <= 300; len++) { /* every padding case: 0-55, 56-63, and more blocks */
        mbed_digest(m, len, want);
        assert_int_equal(dprec_sha2(m, len, got), 0);
        assert_memory_equal(got, want, 32);
    }
    for (int trial = 0; trial < 200; trial++) { /* random lengths fed in random pieces */
        size_t len = (size_t)(next() % sizeof m);
        mbed_digest(m, len, want);
        dprec_sha2_ctx c;
        dprec_sha2_init(&c);
        for (size_t off = 0; off < len;) {
            size_t piece = (size_t)(next() % 200);
            if (piece > len - off) piece = len - off;
            dprec_sha2_update(&c, m + off, piece);
            off += piece;
        }
        dprec_sha2_final(&c, got);
        assert_memory_equal(got, want, 32);
    }
}

static void test_sha256_portable_compression(void **state) {
    (void)state;
    dprec_sha2_force_portable(1);
    assert_int_equal(dprec_sha2_accelerated(), 0);
    known_answers();
    same_as_mbedtls();
    dprec_sha2_force_portable(0);
}

static void test_sha256_the_cpus_own_compression(void **state) {
    (void)state;
    dprec_sha2_force_portable(0);
    /* on a CPU without the SHA extensions (or not x86) this is the portable path again: said, and still checked */
    print_message("SHA extensions: %s\n", dprec_sha2_accelerated() ? "used" : "not on this CPU: the portable path");
    known_answers();
    same_as_mbedtls();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_portable_compression),
        cmocka_unit_test(test_sha256_the_cpus_own_compression),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
