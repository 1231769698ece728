/* Tests of status codes: every code has a distinct name and a message, and unknown codes are handled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/status.h"

static void test_every_status_has_a_distinct_name_and_a_message(void **state) {
    (void)state;
    int seen = 0;
    for (int code = -1000; code <= 0; code++) {
        const char *name = dprec_status_name(code);
        if (strcmp(name, "DPREC_UNKNOWN") == 0) {
            assert_string_equal(dprec_strerror(code), "unknown status");
            continue;
        }
        seen++;
        assert_true(strncmp(name, code == 0 ? "DPREC_OK" : "DPREC_ERR_", code == 0 ? 8 : 10) == 0);
        assert_true(strlen(dprec_strerror(code)) > 3);
        for (int other = code + 1; other <= 0; other++) assert_string_not_equal(name, dprec_status_name(other));
    }
    assert_true(seen >= 30);
    assert_string_equal(dprec_status_name(DPREC_ERR_STORE_FULL), "DPREC_ERR_STORE_FULL");
    assert_string_equal(dprec_status_name(12345), "DPREC_UNKNOWN");
}

static void test_error_codes_are_grouped_by_module(void **state) {
    (void)state;
    assert_true(DPREC_ERR_IO <= -100 && DPREC_ERR_IO > -200);
    assert_true(DPREC_ERR_STORE_FULL <= -200 && DPREC_ERR_STORE_FULL > -300);
    assert_true(DPREC_ERR_RELEASE_DIGEST <= -300 && DPREC_ERR_RELEASE_DIGEST > -400);
    assert_true(DPREC_ERR_SINGULAR <= -400 && DPREC_ERR_SINGULAR > -500);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_status_has_a_distinct_name_and_a_message),
        cmocka_unit_test(test_error_codes_are_grouped_by_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
