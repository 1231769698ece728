/* Tests of sdk/topk.c: the streaming top-K must equal a brute-force full sort by (score desc, item asc),
 * whatever the push order, with ties, infinities and NaN (never kept). Random cases come from a fixed-seed
 * LCG, so every run sees the same data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dprec/dprec.h"
#include "topk.h"

/* ---- test data ---------------------------------------------------------------------------------------- */

static uint64_t lcg_next(uint64_t *s)
{
    *s = *s * 6364136223846793005u + 1442695040888963407u;
    return *s;
}

/* Uniform in [0, bound) (bound > 0; the tiny modulo bias is irrelevant here). */
static uint32_t lcg_below(uint64_t *s, uint32_t bound)
{
    return (uint32_t)((lcg_next(s) >> 32) % bound);
}

/* A small score alphabet, so that ties are common; -0.0 and 0.0 are equal scores. */
static const float k_scores[] = {2.5f, -1.0f, 0.0f, 5.0f, -0.0f, 1.0f, 3.25f, -7.5f, 4.0f, 1e-3f,
                                 INFINITY, -INFINITY};
#define N_SCORES (sizeof k_scores / sizeof k_scores[0])

/* Distinct item ids spread over all of uint32_t: i -> i * odd (mod 2^32) is a bijection. */
static uint32_t item_id(uint32_t i, uint32_t offset)
{
    return i * 2654435761u + offset;
}

/* Result order: score descending, then item ascending; NaN last (only used for push orders). */
static int cmp_best_first(const void *pa, const void *pb)
{
    const dprec_recommendation *a = pa;
    const dprec_recommendation *b = pb;
    int na = isnan(a->score);
    int nb = isnan(b->score);
    if (na || nb) {
        return na - nb;
    }
    if (a->score != b->score) {
        return a->score > b->score ? -1 : 1;
    }
    return a->item < b->item ? -1 : a->item > b->item;
}

/* Push order "ascending": NaN, then scores ascending, ties by ascending item. Within a tie, each later push
 * is worse than the kept ones; in the reversed ("descending") order each later push is better. */
static int cmp_score_asc_item_asc(const void *pa, const void *pb)
{
    const dprec_recommendation *a = pa;
    const dprec_recommendation *b = pb;
    int na = isnan(a->score);
    int nb = isnan(b->score);
    if (na || nb) {
        return nb - na; /* NaN first */
    }
    if (a->score != b->score) {
        return a->score < b->score ? -1 : 1;
    }
    return a->item < b->item ? -1 : a->item > b->item;
}

static int cmp_item_asc(const void *pa, const void *pb)
{
    const dprec_recommendation *a = pa;
    const dprec_recommendation *b = pb;
    return a->item < b->item ? -1 : a->item > b->item;
}

typedef enum push_order {
    ORDER_ASCENDING,  /* worst first: every push beats the root */
    ORDER_DESCENDING, /* best first: after k pushes nothing more is admitted */
    ORDER_RANDOM,
    ORDER_ITEM_ID,
    N_ORDERS
} push_order;

static const char *const k_order_names[N_ORDERS] = {"ascending", "descending", "random", "item id"};

/* Pushes entries[0 .. n) into a top-k over exactly k slots (so ASan sees any write past them) and checks
 * the result against a full sort of the non-NaN entries. */
static void check_against_full_sort(const dprec_recommendation *entries, uint32_t n, uint32_t k,
                                    const char *what)
{
    dprec_recommendation *slots = malloc((k > 0 ? k : 1) * sizeof *slots);
    dprec_recommendation *sorted = malloc((n > 0 ? n : 1) * sizeof *sorted);
    assert_non_null(slots);
    assert_non_null(sorted);

    dprec_topk t;
    dprec_topk_reset(&t, k > 0 ? slots : NULL, k);
    uint32_t finite = 0;
    for (uint32_t i = 0; i < n; i++) {
        dprec_topk_push(&t, entries[i].item, entries[i].score);
        assert_true(t.n <= k);
        if (!isnan(entries[i].score)) {
            sorted[finite++] = entries[i];
        }
    }
    uint32_t got = dprec_topk_finish(&t);

    qsort(sorted, finite, sizeof *sorted, cmp_best_first);
    uint32_t want = finite < k ? finite : k;
    if (got != want) {
        fail_msg("%s: kept %u entries, want %u", what, got, want);
    }
    for (uint32_t i = 0; i < want; i++) {
        assert_true(slots[i].score == slots[i].score); /* not NaN */
        if (slots[i].item != sorted[i].item || memcmp(&slots[i].score, &sorted[i].score, sizeof(float)) != 0) {
            fail_msg("%s: rank %u is (item %u, %g), want (item %u, %g)", what, i, slots[i].item,
                     (double)slots[i].score, sorted[i].item, (double)sorted[i].score);
        }
    }
    free(slots);
    free(sorted);
}

/* ---- tests -------------------------------------------------------------------------------------------- */

/* Every combination of n in {0, 1, 5, 100, 10000}, k in {0, 1, 3, 10, 100, n, n + 5} and four push orders,
 * twice with different data: 280 cases. Each case draws its scores from the first 1, 3 or 12 entries of
 * k_scores (1: every score ties) and makes 0%, 5% or 30% of them NaN. */
static void test_topk_equals_full_sort_on_random_cases(void **state)
{
    (void)state;
    const uint32_t ns[] = {0, 1, 5, 100, 10000};
    const uint32_t alphabet[] = {1, 3, (uint32_t)N_SCORES};
    const uint32_t nan_percent[] = {0, 5, 30};
    uint64_t s = 12345;
    unsigned cases = 0;

    for (unsigned rep = 0; rep < 2; rep++) {
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            uint32_t n = ns[ni];
            const uint32_t ks[] = {0, 1, 3, 10, 100, n, n + 5};
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                for (int order = 0; order < N_ORDERS; order++) {
                    uint32_t k = ks[ki];
                    uint32_t alpha = alphabet[lcg_below(&s, 3)];
                    uint32_t nanp = nan_percent[lcg_below(&s, 3)];
                    uint32_t offset = (uint32_t)lcg_next(&s);
                    dprec_recommendation *e = malloc((n > 0 ? n : 1) * sizeof *e);
                    assert_non_null(e);
                    for (uint32_t i = 0; i < n; i++) {
                        e[i].item = item_id(i, offset);
                        e[i].score = lcg_below(&s, 100) < nanp ? NAN : k_scores[lcg_below(&s, alpha)];
                    }
                    switch ((push_order)order) {
                    case ORDER_ASCENDING:
                        qsort(e, n, sizeof *e, cmp_score_asc_item_asc);
                        break;
                    case ORDER_DESCENDING:
                        qsort(e, n, sizeof *e, cmp_score_asc_item_asc);
                        for (uint32_t i = 0; i < n / 2; i++) {
                            dprec_recommendation tmp = e[i];
                            e[i] = e[n - 1 - i];
                            e[n - 1 - i] = tmp;
                        }
                        break;
                    case ORDER_RANDOM:
                        for (uint32_t i = n; i > 1; i--) { /* Fisher-Yates */
                            uint32_t j = lcg_below(&s, i);
                            dprec_recommendation tmp = e[i - 1];
                            e[i - 1] = e[j];
                            e[j] = tmp;
                        }
                        break;
                    case ORDER_ITEM_ID:
                    case N_ORDERS:
                        qsort(e, n, sizeof *e, cmp_item_asc);
                        break;
                    }
                    char what[160];
                    snprintf(what, sizeof what, "n=%u k=%u order=%s alphabet=%u nan=%u%%", n, k,
                             k_order_names[order], alpha, nanp);
                    check_against_full_sort(e, n, k, what);
                    free(e);
                    cases++;
                }
            }
        }
    }
    assert_true(cases >= 200);
    print_message("%u cases\n", cases);
}

static void test_topk_with_k_zero_keeps_nothing(void **state)
{
    (void)state;
    dprec_topk t;
    dprec_topk_reset(&t, NULL, 0);
    for (uint32_t i = 0; i < 100; i++) {
        dprec_topk_push(&t, i, (float)i);
    }
    assert_int_equal(t.n, 0);
    assert_int_equal(dprec_topk_finish(&t), 0);
}

static void test_topk_never_admits_nan_even_when_not_full(void **state)
{
    (void)state;
    dprec_recommendation slots[4];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 4);
    dprec_topk_push(&t, 1, NAN);
    dprec_topk_push(&t, 2, -NAN);
    assert_int_equal(t.n, 0);
    dprec_topk_push(&t, 3, -INFINITY);
    dprec_topk_push(&t, 4, NAN);
    assert_int_equal(dprec_topk_finish(&t), 1);
    assert_int_equal(slots[0].item, 3);
    assert_true(slots[0].score == -INFINITY);
}

static void test_topk_of_only_nan_scores_is_empty(void **state)
{
    (void)state;
    dprec_recommendation slots[3];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 3);
    for (uint32_t i = 0; i < 50; i++) {
        dprec_topk_push(&t, i, NAN);
    }
    assert_int_equal(dprec_topk_finish(&t), 0);
}

static void test_topk_breaks_score_ties_by_lower_item_id(void **state)
{
    (void)state;
    dprec_recommendation slots[3];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 3);
    const uint32_t items[] = {50, 7, UINT32_MAX, 0, 9, 8};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        dprec_topk_push(&t, items[i], 1.0f);
    }
    dprec_topk_push(&t, 1000, 0.5f); /* worse score: never kept */
    assert_int_equal(dprec_topk_finish(&t), 3);
    assert_int_equal(slots[0].item, 0);
    assert_int_equal(slots[1].item, 7);
    assert_int_equal(slots[2].item, 8);
}

static void test_topk_treats_negative_and_positive_zero_as_equal_scores(void **state)
{
    (void)state;
    dprec_recommendation slots[2];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 2);
    dprec_topk_push(&t, 5, 0.0f);
    dprec_topk_push(&t, 3, -0.0f);
    dprec_topk_push(&t, 4, 0.0f);
    assert_int_equal(dprec_topk_finish(&t), 2);
    assert_int_equal(slots[0].item, 3);
    assert_int_equal(slots[1].item, 4);
}

static void test_topk_orders_infinities_at_the_ends(void **state)
{
    (void)state;
    dprec_recommendation slots[5];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 5);
    dprec_topk_push(&t, 1, -INFINITY);
    dprec_topk_push(&t, 2, 3.0f);
    dprec_topk_push(&t, 3, INFINITY);
    dprec_topk_push(&t, 4, -FLT_MAX);
    dprec_topk_push(&t, 5, FLT_MAX);
    assert_int_equal(dprec_topk_finish(&t), 5);
    const uint32_t want[5] = {3, 5, 2, 4, 1};
    for (uint32_t i = 0; i < 5; i++) {
        assert_int_equal(slots[i].item, want[i]);
    }
}

static void test_topk_never_writes_outside_its_k_slots(void **state)
{
    (void)state;
    dprec_recommendation buf[3 + 8 + 3];
    const dprec_recommendation guard = {0xdeadbeefu, 12345.0f};
    for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) {
        buf[i] = guard;
    }
    dprec_topk t;
    dprec_topk_reset(&t, buf + 3, 8);
    uint64_t s = 99;
    for (uint32_t i = 0; i < 1000; i++) {
        dprec_topk_push(&t, i, (float)lcg_below(&s, 10));
    }
    assert_int_equal(dprec_topk_finish(&t), 8);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(buf[i].item, guard.item);
        assert_int_equal(buf[3 + 8 + i].item, guard.item);
    }
}

static void test_topk_can_be_reused_after_reset(void **state)
{
    (void)state;
    dprec_recommendation slots[2];
    dprec_topk t;
    dprec_topk_reset(&t, slots, 2);
    dprec_topk_push(&t, 1, 1.0f);
    dprec_topk_push(&t, 2, 2.0f);
    dprec_topk_push(&t, 3, 3.0f);
    assert_int_equal(dprec_topk_finish(&t), 2);
    assert_int_equal(slots[0].item, 3);
    assert_int_equal(slots[1].item, 2);

    dprec_topk_reset(&t, slots, 2);
    dprec_topk_push(&t, 9, -1.0f);
    assert_int_equal(dprec_topk_finish(&t), 1);
    assert_int_equal(slots[0].item, 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_equals_full_sort_on_random_cases),
        cmocka_unit_test(test_topk_with_k_zero_keeps_nothing),
        cmocka_unit_test(test_topk_never_admits_nan_even_when_not_full),
        cmocka_unit_test(test_topk_of_only_nan_scores_is_empty),
        cmocka_unit_test(test_topk_breaks_score_ties_by_lower_item_id),
        cmocka_unit_test(test_topk_treats_negative_and_positive_zero_as_equal_scores),
        cmocka_unit_test(test_topk_orders_infinities_at_the_ends),
        cmocka_unit_test(test_topk_never_writes_outside_its_k_slots),
        cmocka_unit_test(test_topk_can_be_reused_after_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
