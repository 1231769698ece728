/* Tests of the client's diagnostics (sdk/diag.c; dprec.h "diagnostics") and of streams that cannot wedge: the
 * detail and the cause start over at every call (never the previous call's), each cause of DPREC_ERR_STATE has its
 * own text (a stream left open, a predict before a fit, the store held by another client, a verify during a
 * stream), a feed that fails ends its stream so that writes go on, and the getters' ABI. The sync side of the
 * detail (HTTP status, the server's code and message, the transport's text) is in test_sync.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "fake_port.h"
#include "test_util.h"

#define M 30u
#define D 4u

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    unsigned char *rel;
    size_t rel_len;
} fixture;

static dprec_client *open_client(fixture *f, void **mem) {
    size_t need = dprec_client_required_size(&f->cfg);
    assert_true(need > 0);
    *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &f->cfg, &f->port, *mem, need), DPREC_OK);
    return c;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = M;
    f->cfg.dim = D;
    f->cfg.rating_capacity = 20;
    f->c = open_client(f, &f->mem);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
    f->rel = test_make_release(M, D, 1, 5, &f->rel_len, NULL, NULL);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    free(f->rel);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

/* The detail's one-line text. */
static const char *detail(const dprec_client *c) {
    static char buf[600];
    (void)dprec_client_last_error_detail(c, buf, sizeof buf);
    return buf;
}

static void assert_detail_has(const dprec_client *c, const char *part) {
    const char *d = detail(c);
    if (strstr(d, part) == NULL) fail_msg("detail \"%s\" does not say \"%s\"", d, part);
}

/* ---- DPREC_ERR_STATE: one text per cause ------------------------------------------------------------------ */

static void test_a_write_during_an_open_stream_says_which_stream_and_how_to_end_it(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 1, 4.0f, 100), DPREC_ERR_STATE);
    assert_detail_has(f->c, "a fit stream is open");
    assert_detail_has(f->c, "dprec_fit_end");
    assert_int_equal(dprec_fit_end(f->c), DPREC_ERR_RELEASE_TRUNCATED);

    assert_int_equal(test_trust(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_topk_begin(f->c, 3), DPREC_OK);
    assert_int_equal(dprec_store_remove(f->c, 1), DPREC_ERR_STATE);
    assert_detail_has(f->c, "a top-K stream is open");
    assert_detail_has(f->c, "dprec_topk_end");
}

static void test_a_verify_during_a_stream_says_the_stream_is_open(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED;
    assert_int_equal(dprec_release_verify(f->c, f->rel, f->rel_len, &vc, NULL), DPREC_ERR_STATE);
    assert_detail_has(f->c, "a fit stream is open");
    assert_int_equal(dprec_verify_begin(f->c), DPREC_ERR_STATE);
    assert_detail_has(f->c, "a fit stream is open");
}

static void test_a_predict_before_a_fit_says_there_is_no_user_vector(void **state) {
    fixture *f = *state;
    assert_int_equal(test_trust(f->c, f->rel, f->rel_len), DPREC_OK);
    float s = 0.0f;
    assert_int_equal(dprec_predict(f->c, f->rel, f->rel_len, 2, &s), DPREC_ERR_STATE);
    assert_detail_has(f->c, "no user vector yet");
    assert_detail_has(f->c, "dprec_fit");
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_ERR_STATE);
    assert_detail_has(f->c, "no user vector yet");
}

static void test_a_write_to_a_store_held_by_another_client_says_so(void **state) {
    fixture *f = *state;
    void *mem2;
    dprec_client *second = open_client(f, &mem2);
    assert_int_equal(dprec_store_load(second), DPREC_ERR_STORE_LOCKED);
    assert_int_equal(dprec_store_put(second, 1, 4.0f, 100), DPREC_ERR_STATE);
    assert_detail_has(second, "held by another client");
    /* never loaded at all: another text */
    void *mem3;
    dprec_client *third = open_client(f, &mem3);
    assert_int_equal(dprec_store_put(third, 1, 4.0f, 100), DPREC_ERR_STATE);
    assert_detail_has(third, "call dprec_store_load first");
    dprec_client_free(third);
    free(mem3);
    /* once the first client is freed, a load succeeds and the writes go on, with no detail left */
    dprec_client_free(f->c);
    f->c = NULL;
    assert_int_equal(dprec_store_load(second), DPREC_OK);
    assert_int_equal(dprec_store_put(second, 1, 4.0f, 100), DPREC_OK);
    assert_string_equal(detail(second), "");
    dprec_client_free(second);
    free(mem2);
}

static void test_a_store_after_a_failed_rename_says_to_load_again(void **state) {
    fixture *f = *state;
    f->fake.rename_applies = 1;
    fake_port_arm(&f->fake, 0, 0, 0, 1);
    assert_int_equal(dprec_store_put(f->c, 1, 4.0f, 100), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_ERR_STATE);
    assert_detail_has(f->c, "rename");
    assert_detail_has(f->c, "dprec_store_load");
}

/* ---- never stale ---------------------------------------------------------------------------------------- */

static void test_the_cause_and_the_detail_start_over_at_every_call(void **state) {
    fixture *f = *state;
    f->fake.no_space = 1; /* the write fails with ENOSPC, which the port keeps as the cause */
    fake_port_arm(&f->fake, 0, 1, 0, 0);
    assert_int_equal(dprec_store_put(f->c, 1, 4.0f, 100), DPREC_ERR_NO_SPACE);
    assert_int_equal(dprec_client_last_cause(f->c), ENOSPC);
    char want[32];
    snprintf(want, sizeof want, "cause %d", ENOSPC);
    assert_detail_has(f->c, want);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    /* a call that succeeds: nothing of the failure is left */
    assert_int_equal(dprec_store_put(f->c, 1, 4.0f, 100), DPREC_OK);
    assert_int_equal(dprec_client_last_cause(f->c), 0);
    assert_string_equal(detail(f->c), "");
    /* a call that fails for another reason: only that reason */
    fake_port_arm(&f->fake, 0, 1, 0, 0);
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_ERR_NO_SPACE);
    assert_int_equal(dprec_store_put(f->c, 99, 4.0f, 100), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_client_last_cause(f->c), 0);
    /* a const query is a call too */
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_ERR_STATE);
    dprec_rating r;
    assert_int_equal(dprec_store_get(f->c, 1, &r), DPREC_OK);
    assert_string_equal(detail(f->c), "");
}

/* ---- streams that cannot wedge ---------------------------------------------------------------------------- */

static void test_a_fit_feed_that_fails_ends_its_stream_and_writes_go_on(void **state) {
    fixture *f = *state;
    assert_int_equal(test_trust(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    static const unsigned char junk[64] = {'n', 'o', 'p', 'e'};
    assert_int_equal(dprec_fit_feed(f->c, junk, sizeof junk), DPREC_ERR_RELEASE_MAGIC);
    assert_detail_has(f->c, "the fit stream is ended");
    assert_int_equal(dprec_store_put(f->c, 3, 2.0f, 100), DPREC_OK); /* before: DPREC_ERR_STATE until fit_end */
    /* the stream is over: feeding or ending it says so */
    assert_int_equal(dprec_fit_feed(f->c, junk, sizeof junk), DPREC_ERR_STATE);
    assert_detail_has(f->c, "a feed that failed ended it");
    assert_int_equal(dprec_fit_end(f->c), DPREC_ERR_STATE);
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_ERR_STATE); /* nothing fitted from it */
    /* and a new stream works */
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_fit_feed(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_fit_end(f->c), DPREC_OK);
}

static void test_a_verify_feed_that_fails_ends_its_stream_and_writes_go_on(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_verify_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_verify_feed(f->c, f->rel, 100), DPREC_OK);
    unsigned char *bad = malloc(f->rel_len);
    memcpy(bad, f->rel, f->rel_len);
    memcpy(bad + 100, "\xff\xff\xff\x7f\xff\xff\xff\x7f", 8); /* NaNs in the body: refused as they arrive */
    int rc = dprec_verify_feed(f->c, bad + 100, f->rel_len - 100);
    assert_int_equal(rc, DPREC_ERR_RELEASE_VALUE);
    assert_detail_has(f->c, "the verify stream is ended");
    assert_int_equal(dprec_store_put(f->c, 3, 2.0f, 100), DPREC_OK);
    assert_int_equal(dprec_store_remove(f->c, 3), DPREC_OK);
    dprec_release_info info;
    assert_int_equal(dprec_release_trusted(f->c, &info, NULL), DPREC_ERR_NOT_FOUND); /* nothing trusted */
    free(bad);
}

static void test_a_topk_feed_that_fails_ends_its_stream_and_writes_go_on(void **state) {
    fixture *f = *state;
    assert_int_equal(test_trust(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, f->rel, f->rel_len), DPREC_OK);
    assert_int_equal(dprec_topk_begin(f->c, 3), DPREC_OK);
    static const unsigned char junk[80] = {'j', 'u', 'n', 'k'};
    assert_int_equal(dprec_topk_feed(f->c, junk, sizeof junk), DPREC_ERR_RELEASE_MAGIC);
    assert_detail_has(f->c, "the top-K stream is ended");
    assert_int_equal(dprec_store_put(f->c, 3, 2.0f, 100), DPREC_OK);
    dprec_recommendation out[3];
    uint32_t n = 9;
    assert_int_equal(dprec_topk_end(f->c, out, &n), DPREC_ERR_STATE);
}

static void test_a_release_of_another_d_says_both_ds(void **state) {
    fixture *f = *state;
    size_t len = 0;
    unsigned char *other = test_make_release(M, D + 3, 1, 9, &len, NULL, NULL);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED;
    assert_int_equal(dprec_release_verify(f->c, other, len, &vc, NULL), DPREC_ERR_RELEASE_MISMATCH);
    assert_detail_has(f->c, "the release has m = 30, d = 7; the client is configured for m = 30, d = 4");
    free(other);
}

/* ---- the getters ---------------------------------------------------------------------------------------------- */

static void test_the_error_info_is_read_by_its_struct_size_and_the_text_is_cut_safely(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 1, 4.0f, 100), DPREC_ERR_STATE);
    dprec_error_info info;
    DPREC_STRUCT_INIT(&info);
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_OK);
    assert_int_equal(info.http_status, 0);
    assert_string_equal(info.request, "");
    assert_string_equal(info.server_code, "");
    assert_non_null(strstr(info.message, "a fit stream is open"));
    /* the getters change nothing */
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_OK);
    assert_non_null(strstr(info.message, "a fit stream is open"));
    /* a struct of newer headers: the tail zeroed; of unknown, smaller ones: refused */
    struct {
        dprec_error_info info;
        uint64_t newer;
    } big;
    memset(&big, 0x5a, sizeof big);
    big.info.struct_size = sizeof big;
    assert_int_equal(dprec_client_last_error_info(f->c, &big.info), DPREC_OK);
    assert_int_equal(big.newer, 0);
    info.struct_size = 8;
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_ERR_STRUCT_SIZE);
    assert_int_equal(dprec_client_last_error_info(NULL, &info), DPREC_ERR_INVALID_ARGUMENT);
    /* the text: its whole length returned, cut and terminated to the buffer */
    char full[600], small[10];
    size_t n = dprec_client_last_error_detail(f->c, full, sizeof full);
    assert_int_equal(n, strlen(full));
    memset(small, 'x', sizeof small);
    assert_int_equal(dprec_client_last_error_detail(f->c, small, sizeof small), n);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, full, sizeof small - 1);
    assert_int_equal(dprec_client_last_error_detail(f->c, NULL, 0), n);
    assert_int_equal(dprec_client_last_error_detail(NULL, small, sizeof small), 0);
    assert_string_equal(small, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_write_during_an_open_stream_says_which_stream_and_how_to_end_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_verify_during_a_stream_says_the_stream_is_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_predict_before_a_fit_says_there_is_no_user_vector, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_write_to_a_store_held_by_another_client_says_so, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_store_after_a_failed_rename_says_to_load_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_cause_and_the_detail_start_over_at_every_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_fit_feed_that_fails_ends_its_stream_and_writes_go_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_verify_feed_that_fails_ends_its_stream_and_writes_go_on, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_topk_feed_that_fails_ends_its_stream_and_writes_go_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_release_of_another_d_says_both_ds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_error_info_is_read_by_its_struct_size_and_the_text_is_cut_safely,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
