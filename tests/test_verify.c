/* Tests of releases verified once (sdk/verify.c, docs/sdk.md "Verified once"; issue 19, point 2): a forged
 * release — valid digest, invalid signature, one item's bias set to 100 — is refused by every entry point;
 * the trusted release survives restarts; the stream and buffer verifications agree for any chunking; the rules
 * for unsigned releases, missing or wrong keys; a verification that cannot be saved changes nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "mbedtls_compat.h"
#include "test_util.h"

#define M 60u
#define D 5u
#define K 5u
#define TARGET 42u

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    fake_signer key, other_key;
    unsigned char *good, *forged, *unsigned_rel;
    size_t good_len, forged_len, unsigned_len;
} fixture;

static void reopen(fixture *f) {
    dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
}

/* The forger's copy of a signed release: item TARGET's bias set to 100 and the digest recomputed (anyone can),
 * the aggregator's signature left as it was (no one else can make one). */
static unsigned char *forge(const unsigned char *rel, size_t len) {
    unsigned char *b = malloc(len);
    memcpy(b, rel, len);
    dprec_release_info info;
    assert_int_equal(dprec_release_parse_header(b, len, &info), DPREC_OK);
    float hundred = 100.0f;
    memcpy(b + 64 + (size_t)TARGET * 4u * (D + 1u), &hundred, 4);
    size_t body = len - info.sig_len - 32u;
    assert_int_equal(dprec_sha256(b, body, b + body), 0);
    dprec_release_info check;
    assert_int_equal(dprec_release_check(b, len, &check), DPREC_OK); /* a valid release, digest and all */
    return b;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = M;
    f->cfg.dim = D;
    f->cfg.rating_capacity = 20;
    f->cfg.max_k = K;
    reopen(f);
    static const uint32_t items[] = {1, 3, 8, 20, 33, 50};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        assert_int_equal(dprec_store_put(f->c, items[i], (float)(1 + i % 5), 100), DPREC_OK);
    fake_signer_init(&f->key, 42);
    fake_signer_init(&f->other_key, 43);
    float *v, *bias;
    f->unsigned_rel = test_make_release(M, D, 1, 9, &f->unsigned_len, &v, &bias);
    for (uint32_t j = 0; j < M; j++) bias[j] = 0.05f * (float)(j % 7) - 0.1f; /* nothing near 100 */
    f->good = fake_signed_release(&f->key, 0, 1, M, D, v, bias, 3.5f, &f->good_len);
    f->forged = forge(f->good, f->good_len);
    f->forged_len = f->good_len;
    free(v);
    free(bias);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    free(f->good);
    free(f->forged);
    free(f->unsigned_rel);
    fake_signer_free(&f->key);
    fake_signer_free(&f->other_key);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

static void with_key(dprec_verify_config *vc, const fake_signer *key) {
    dprec_verify_config_init(vc);
    vc->release_key = key->pub;
    vc->release_key_len = key->pub_len;
}

static int verify_stream(dprec_client *c, const unsigned char *rel, size_t len, size_t chunk,
                         const dprec_verify_config *vc, dprec_release_info *info) {
    int rc = dprec_verify_begin(c);
    for (size_t off = 0; rc == DPREC_OK && off < len; off += chunk)
        rc = dprec_verify_feed(c, rel + off, len - off < chunk ? len - off : chunk);
    int end = dprec_verify_end(c, vc, info);
    return rc != DPREC_OK ? rc : end;
}

static int fit_stream(dprec_client *c, const unsigned char *rel, size_t len) {
    int rc = dprec_fit_begin(c);
    if (rc == DPREC_OK) rc = dprec_fit_feed(c, rel, len);
    int end = dprec_fit_end(c);
    return rc != DPREC_OK ? rc : end;
}

static void test_a_forged_release_is_refused_by_every_entry_point(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    with_key(&vc, &f->key);
    dprec_release_info info;
    dprec_recommendation out[K];
    uint32_t n = 99;
    float score = 0;

    /* nothing trusted: the forged release is refused at verification, buffer or stream, and by every use */
    assert_int_equal(dprec_release_verify(f->c, f->forged, f->forged_len, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(verify_stream(f->c, f->forged, f->forged_len, 7, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(dprec_release_trusted(f->c, &info, NULL), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_fit(f->c, f->forged, f->forged_len), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_recommend(f->c, f->forged, f->forged_len, K, out, &n), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(n, 0);
    assert_int_equal(fit_stream(f->c, f->forged, f->forged_len), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_predict(f->c, f->forged, f->forged_len, TARGET, &score), DPREC_ERR_STATE); /* no fit */

    /* the genuine release verifies and is used; the forged one stays refused everywhere */
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_OK);
    assert_int_equal(dprec_recommend(f->c, f->good, f->good_len, K, out, &n), DPREC_OK);
    assert_int_equal(n, K);
    for (uint32_t i = 0; i < n; i++) assert_int_not_equal(out[i].item, TARGET);
    assert_int_equal(dprec_recommend(f->c, f->forged, f->forged_len, K, out, &n), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_fit(f->c, f->forged, f->forged_len), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(fit_stream(f->c, f->forged, f->forged_len), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_predict(f->c, f->forged, f->forged_len, TARGET, &score), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_topk_begin(f->c, K), DPREC_OK); /* the fitted release is the genuine one */
    assert_int_equal(dprec_topk_feed(f->c, f->forged, f->forged_len), DPREC_OK);
    assert_int_equal(dprec_topk_end(f->c, out, &n), DPREC_ERR_RELEASE_MISMATCH);
    /* and a refused verification leaves the genuine release trusted */
    assert_int_equal(dprec_release_verify(f->c, f->forged, f->forged_len, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(dprec_release_trusted(f->c, &info, NULL), DPREC_OK);
    dprec_release_info good;
    assert_int_equal(dprec_release_check(f->good, f->good_len, &good), DPREC_OK);
    assert_memory_equal(info.digest, good.digest, sizeof good.digest);
    assert_int_equal(dprec_predict(f->c, f->good, f->good_len, TARGET, &score), DPREC_OK);
    assert_true(score < 5.0f);
}

static void test_the_trusted_release_survives_a_restart(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    with_key(&vc, &f->key);
    dprec_release_info info, again;
    dprec_recommendation a[K], b[K];
    uint32_t na = 0, nb = 0;
    int insecure = -1;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_OK);
    assert_int_equal(dprec_recommend(f->c, f->good, f->good_len, K, a, &na), DPREC_OK);
    reopen(f);
    assert_int_equal(dprec_release_trusted(f->c, &again, &insecure), DPREC_OK);
    assert_int_equal(insecure, 0);
    assert_memory_equal(again.digest, info.digest, sizeof info.digest);
    assert_true(again.num_items == M && again.dim == D && again.sig_len == info.sig_len);
    assert_int_equal(dprec_recommend(f->c, f->good, f->good_len, K, b, &nb), DPREC_OK); /* no verify needed */
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof a[0] * na);
    /* a rating saved since keeps it; a new verification replaces it, insecure ones are marked so */
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_OK);
    reopen(f);
    assert_int_equal(dprec_release_trusted(f->c, &again, NULL), DPREC_OK);
    assert_int_equal(test_trust(f->c, f->unsigned_rel, f->unsigned_len), DPREC_OK);
    reopen(f);
    assert_int_equal(dprec_release_trusted(f->c, &again, &insecure), DPREC_OK);
    assert_int_equal(insecure, 1);
    assert_int_equal(dprec_recommend(f->c, f->good, f->good_len, K, b, &nb), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_recommend(f->c, f->unsigned_rel, f->unsigned_len, K, b, &nb), DPREC_OK);
}

static void test_stream_and_buffer_verification_agree_for_any_chunking(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    with_key(&vc, &f->key);
    dprec_release_info ref, got;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &ref), DPREC_OK);
    const size_t chunks[] = {1, 2, 3, 31, 64, 97, 4096};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        memset(&got, 0, sizeof got);
        assert_int_equal(verify_stream(f->c, f->good, f->good_len, chunks[i], &vc, &got), DPREC_OK);
        assert_memory_equal(got.digest, ref.digest, sizeof ref.digest);
        assert_int_equal(verify_stream(f->c, f->forged, f->forged_len, chunks[i], &vc, &got),
                         DPREC_ERR_RELEASE_SIGNATURE);
        /* a signature byte flipped: same verdict both ways */
        f->good[f->good_len - 5] ^= 1u;
        assert_int_equal(verify_stream(f->c, f->good, f->good_len, chunks[i], &vc, &got), DPREC_ERR_RELEASE_SIGNATURE);
        assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &got), DPREC_ERR_RELEASE_SIGNATURE);
        f->good[f->good_len - 5] ^= 1u;
    }
    /* a stream cut short, or a state misuse */
    assert_int_equal(verify_stream(f->c, f->good, f->good_len - 1, 64, &vc, &got), DPREC_ERR_RELEASE_TRUNCATED);
    assert_int_equal(dprec_verify_feed(f->c, f->good, 10), DPREC_ERR_STATE);
    assert_int_equal(dprec_verify_end(f->c, &vc, &got), DPREC_ERR_STATE);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_verify_begin(f->c), DPREC_ERR_STATE);
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &got), DPREC_ERR_STATE);
}

static void test_unsigned_releases_missing_and_wrong_keys(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    dprec_release_info info;
    int insecure = -1;
    with_key(&vc, &f->key);
    assert_int_equal(dprec_release_verify(f->c, f->unsigned_rel, f->unsigned_len, &vc, &info),
                     DPREC_ERR_RELEASE_SIGNATURE); /* unsigned: refused unless told */
    with_key(&vc, &f->other_key);
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED; /* a signature that can be checked must still verify */
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    dprec_verify_config_init(&vc);
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, NULL, &info), DPREC_ERR_INVALID_ARGUMENT);
    vc.flags = 0x80;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_INVALID_ARGUMENT);
    static const unsigned char junk[20] = {0x30, 0x12, 1, 2, 3};
    vc.flags = 0;
    vc.release_key = junk;
    vc.release_key_len = sizeof junk;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_CONFIG);
    assert_int_equal(dprec_release_trusted(f->c, &info, NULL), DPREC_ERR_NOT_FOUND); /* nothing got through */
    /* told: no key and the flag trusts either on its digest alone, marked insecure */
    dprec_verify_config_init(&vc);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_OK);
    assert_int_equal(dprec_release_trusted(f->c, &info, &insecure), DPREC_OK);
    assert_int_equal(insecure, 1);
    /* another catalogue's release */
    size_t len = 0;
    unsigned char *wrong = test_make_release(M + 1, D, 1, 3, &len, NULL, NULL);
    assert_int_equal(dprec_release_verify(f->c, wrong, len, &vc, &info), DPREC_ERR_RELEASE_MISMATCH);
    free(wrong);
}

static void test_a_verification_that_cannot_be_saved_changes_nothing(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    with_key(&vc, &f->key);
    dprec_release_info info;
    int insecure = -1;
    assert_int_equal(test_trust(f->c, f->unsigned_rel, f->unsigned_len), DPREC_OK);
    fake_port_arm(&f->fake, 0, 1, 0, 0); /* the next write fails */
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_release_trusted(f->c, &info, &insecure), DPREC_OK);
    assert_int_equal(insecure, 1); /* still the unsigned one */
    dprec_recommendation out[K];
    uint32_t n = 0;
    assert_int_equal(dprec_recommend(f->c, f->good, f->good_len, K, out, &n), DPREC_ERR_RELEASE_UNVERIFIED);
    reopen(f);
    assert_int_equal(dprec_release_trusted(f->c, &info, &insecure), DPREC_OK);
    assert_int_equal(insecure, 1);
}

/* A host running many clients shares one signature check per release through the memo (as dprec-fleet does). */
static int seen_calls, remember_calls;
static unsigned char memo_tag[32];
static int memo_seen(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    seen_calls++;
    return remember_calls > 0 && memcmp(tag, memo_tag, 32) == 0;
}
static void memo_remember(void *ctx, const unsigned char tag[32]) {
    (void)ctx;
    remember_calls++;
    memcpy(memo_tag, tag, 32);
}

static void test_the_signature_memo_is_consulted_and_filled(void **state) {
    fixture *f = *state;
    dprec_verify_config vc;
    with_key(&vc, &f->key);
    vc.verified_seen = memo_seen;
    vc.verified_remember = memo_remember;
    dprec_release_info info;
    seen_calls = remember_calls = 0;
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_OK);
    assert_true(seen_calls == 1 && remember_calls == 1);
    assert_int_equal(dprec_release_verify(f->c, f->good, f->good_len, &vc, &info), DPREC_OK);
    assert_true(seen_calls == 2 && remember_calls == 1); /* remembered: not checked again */
    assert_int_equal(dprec_release_verify(f->c, f->forged, f->forged_len, &vc, &info), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(remember_calls, 1); /* another digest: another tag, checked, refused, not remembered */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_forged_release_is_refused_by_every_entry_point, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_trusted_release_survives_a_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_and_buffer_verification_agree_for_any_chunking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsigned_releases_missing_and_wrong_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_verification_that_cannot_be_saved_changes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_signature_memo_is_consulted_and_filled, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
