/* Tests of the allocator seam: alignment, exhaustion, the hooks' hard cap, and release. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "alloc.h"
#include "counting_alloc.h"

static void test_arena_hands_out_aligned_zeroed_blocks_until_exhausted(void **state) {
    (void)state;
    unsigned char *raw = malloc(1024 + 16);
    for (size_t off = 0; off < 16; off++) {
        for (size_t i = 0; i < 1040; i++) raw[i] = 0xEE;
        dprec_heap h;
        dprec_heap_init_arena(&h, raw + off, 1024);
        size_t total = 0;
        for (;;) {
            unsigned char *p = dprec_heap_alloc(&h, 100);
            if (p == NULL) break;
            assert_int_equal((uintptr_t)p % DPREC_HEAP_ALIGN, 0);
            for (size_t i = 0; i < 100; i++) assert_int_equal(p[i], 0);
            assert_true(p >= raw + off && p + 100 <= raw + off + 1024);
            total += 112;
        }
        assert_true(total >= 1024 - 15 - 111);
        assert_true(h.used <= 1024);
        dprec_heap_release(&h); /* arena: a no-op */
    }
    free(raw);
    dprec_heap h;
    dprec_heap_init_arena(&h, NULL, 100);
    assert_null(dprec_heap_alloc(&h, 1));
    assert_null(dprec_heap_alloc(&h, SIZE_MAX));
}

static void test_hooks_never_exceed_the_cap_and_release_returns_everything(void **state) {
    (void)state;
    counting_alloc ca = {0};
    dprec_allocator hooks = counting_alloc_hooks(&ca, 1000);
    dprec_heap h;
    dprec_heap_init_hooks(&h, &hooks);
    assert_non_null(dprec_heap_alloc(&h, 500));
    assert_non_null(dprec_heap_alloc(&h, 400));
    assert_null(dprec_heap_alloc(&h, 100)); /* 512 + 400 + 112 > 1000 */
    assert_non_null(dprec_heap_alloc(&h, 80));
    assert_true(ca.peak <= 1000);
    assert_int_equal(ca.allocs, 3);
    dprec_heap_release(&h);
    assert_int_equal(ca.frees, 3);
    assert_int_equal(ca.bytes, 0);
    ca = (counting_alloc){0};
    ca.fail_at = 1;
    dprec_heap_init_hooks(&h, &hooks);
    assert_null(dprec_heap_alloc(&h, 8));
    dprec_heap_release(&h);
    assert_int_equal(ca.bytes, 0);
}

static void test_heap_round_detects_overflow(void **state) {
    (void)state;
    assert_int_equal(dprec_heap_round(1), 16);
    assert_int_equal(dprec_heap_round(16), 16);
    assert_int_equal(dprec_heap_round(SIZE_MAX), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_hands_out_aligned_zeroed_blocks_until_exhausted),
        cmocka_unit_test(test_hooks_never_exceed_the_cap_and_release_returns_everything),
        cmocka_unit_test(test_heap_round_detects_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
