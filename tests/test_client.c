/* Tests of the client: configuration, memory (arena, hooks, peak under the documented bound, no allocation
 * after init), the CSPRNG's test mode, and the local step end to end (least squares, top-K, predict,
 * streaming) against brute-force references. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "counting_alloc.h"
#include "dprec/dprec.h"
#include "fake_port.h"
#include "test_util.h"

static void cfg_for(dprec_config *cfg, uint32_t m, uint32_t d, uint32_t cap, uint32_t k) {
    dprec_config_default(cfg);
    cfg->num_items = m;
    cfg->dim = d;
    cfg->rating_capacity = cap;
    cfg->max_k = k;
}

static void test_client_rejects_inconsistent_configs(void **state) {
    (void)state;
    dprec_config base, c;
    cfg_for(&base, 100, 8, 10, 5);
    assert_true(dprec_client_required_size(&base) > 0);
    assert_int_equal(dprec_client_required_size(NULL), 0);
#define BAD(field, value)                                    \
    do {                                                     \
        c = base;                                            \
        c.field = value;                                     \
        assert_int_equal(dprec_client_required_size(&c), 0); \
    } while (0)
    BAD(num_items, 0);
    BAD(num_items, DPREC_MAX_ITEMS + 1);
    BAD(dim, 0);
    BAD(dim, DPREC_MAX_DIM + 1);
    BAD(rating_capacity, 0);
    BAD(max_k, 0);
    BAD(rating_min, 5.0f);
    BAD(rating_max, NAN);
    BAD(lambda, 0.0f);
    BAD(lambda, -1.0f);
    BAD(lambda, INFINITY);
    BAD(store_name, "");
    BAD(store_name, "a/b");
    BAD(store_name, "../x");
    BAD(store_name, "this-name-is-far-too-long-for-the-port-name-limit-xx");
#undef BAD
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    unsigned char mem[64];
    dprec_client *cl = (dprec_client *)1;
    c = base;
    c.dim = 0;
    assert_int_equal(dprec_client_init(&cl, &c, &port, mem, sizeof mem), DPREC_ERR_CONFIG);
    assert_null(cl);
    assert_int_equal(dprec_client_init(&cl, &base, &port, mem, sizeof mem), DPREC_ERR_NO_MEMORY);
    assert_int_equal(dprec_client_init(&cl, &base, NULL, mem, sizeof mem), DPREC_ERR_INVALID_ARGUMENT);
    dprec_port partial = port;
    partial.rename = NULL;
    assert_int_equal(dprec_client_init(&cl, &base, &partial, mem, sizeof mem), DPREC_ERR_PORT_MISSING);
    dprec_client_free(NULL); /* a no-op */
}

static void test_client_works_in_an_unaligned_arena_of_exactly_the_required_size(void **state) {
    (void)state;
    dprec_config cfg;
    cfg_for(&cfg, 50, 8, 10, 5);
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg);
    assert_true(need <= DPREC_CLIENT_MEMORY_BOUND(8, 10, 5));
    unsigned char *raw = malloc(need + 16);
    for (size_t off = 0; off < 16; off++) {
        dprec_client *c = NULL;
        assert_int_equal(dprec_client_init(&c, &cfg, &port, raw + off, need), DPREC_OK);
        assert_int_equal(dprec_store_load(c), DPREC_OK);
        assert_int_equal(dprec_store_put(c, 3, 4.0f, 1), DPREC_OK);
        assert_true(dprec_client_memory_used(c) <= need);
        dprec_client_free(c);
        assert_int_equal(dprec_client_init(&c, &cfg, &port, raw + off, need - 1 - (off % 2) * 20), DPREC_ERR_NO_MEMORY);
    }
    free(raw);
    fake_port_free(&fake);
}

/* The CSPRNG is seeded from the port's entropy and nothing else (the SDK has no test seed): two clients whose
 * ports give the same entropy draw the same bytes, another port's entropy gives other bytes, and a port that
 * cannot supply entropy fails the client's creation. */
static void test_client_randomness_comes_from_the_ports_entropy_only(void **state) {
    (void)state;
    dprec_config cfg;
    cfg_for(&cfg, 10, 2, 2, 1);
    fake_port fa, fb;
    dprec_port pa, pb;
    fake_port_init(&fa, &pa);
    fake_port_init(&fb, &pb);
    size_t need = dprec_client_required_size(&cfg);
    void *m1 = malloc(need), *m2 = malloc(need);
    dprec_client *a = NULL, *b = NULL;
    assert_int_equal(dprec_client_init(&a, &cfg, &pa, m1, need), DPREC_OK);
    assert_int_equal(dprec_client_init(&b, &cfg, &pb, m2, need), DPREC_OK);
    unsigned char x[100], y[100];
    assert_int_equal(dprec_client_random(a, x, sizeof x), DPREC_OK);
    assert_int_equal(dprec_client_random(b, y, sizeof y), DPREC_OK);
    assert_memory_equal(x, y, sizeof x);
    dprec_client_free(b);
    fb.entropy_counter = 12345; /* another entropy stream */
    assert_int_equal(dprec_client_init(&b, &cfg, &pb, m2, need), DPREC_OK);
    assert_int_equal(dprec_client_random(b, y, sizeof y), DPREC_OK);
    assert_memory_not_equal(x, y, sizeof x);
    dprec_client_free(b);
    fb.no_entropy = 1;
    assert_int_equal(dprec_client_init(&b, &cfg, &pb, m2, need), DPREC_ERR_ENTROPY);
    fb.no_entropy = 0;
    assert_int_equal(dprec_client_init(&b, &cfg, &pb, m2, need), DPREC_OK);
    /* A large request crosses CTR_DRBG's per-call limit. */
    unsigned char *big = malloc(5000);
    assert_int_equal(dprec_client_random(b, big, 5000), DPREC_OK);
    free(big);
    dprec_client_free(b);
    dprec_client_free(a);
    free(m1);
    free(m2);
    fake_port_free(&fa);
    fake_port_free(&fb);
}

static void test_two_clients_in_one_process_are_independent(void **state) {
    (void)state;
    dprec_config cfg;
    cfg_for(&cfg, 20, 3, 5, 2);
    fake_port fa, fb;
    dprec_port pa, pb;
    fake_port_init(&fa, &pa);
    fake_port_init(&fb, &pb);
    size_t need = dprec_client_required_size(&cfg);
    void *m1 = malloc(need), *m2 = malloc(need);
    dprec_client *a = NULL, *b = NULL;
    assert_int_equal(dprec_client_init(&a, &cfg, &pa, m1, need), DPREC_OK);
    assert_int_equal(dprec_client_init(&b, &cfg, &pb, m2, need), DPREC_OK);
    assert_int_equal(dprec_store_load(a), DPREC_OK);
    assert_int_equal(dprec_store_load(b), DPREC_OK);
    assert_int_equal(dprec_store_put(a, 1, 5.0f, 1), DPREC_OK);
    assert_int_equal(dprec_store_count(a), 1);
    assert_int_equal(dprec_store_count(b), 0);
    assert_null(fake_port_file(&fb, "dprec-ratings.1"));
    dprec_client_free(a);
    dprec_client_free(b);
    free(m1);
    free(m2);
    fake_port_free(&fa);
    fake_port_free(&fb);
}

/* ---- memory ---------------------------------------------------------------------------------------- */

static void rate_and_recommend(dprec_client *c, const unsigned char *rel, size_t len, uint32_t m, uint32_t cap,
                               uint32_t k) {
    test_rng r = {5};
    for (uint32_t i = 0; i < cap; i++) {
        int rc = dprec_store_put(c, test_next(&r) % m, (float)(1 + test_next(&r) % 5), 100 + i);
        assert_true(rc == DPREC_OK || rc == DPREC_ERR_STORE_FULL);
    }
    dprec_recommendation *out = malloc(sizeof *out * k);
    uint32_t n = 0;
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_recommend(c, rel, len, k, out, &n), DPREC_OK);
    assert_true(n > 0);
    float score;
    assert_int_equal(dprec_predict(c, rel, len, out[0].item, &score), DPREC_OK);
    assert_int_equal(dprec_fit_begin(c), DPREC_OK);
    for (size_t off = 0; off < len; off += 100)
        assert_int_equal(dprec_fit_feed(c, rel + off, len - off < 100 ? len - off : 100), DPREC_OK);
    assert_int_equal(dprec_fit_end(c), DPREC_OK);
    assert_int_equal(dprec_store_remove(c, out[0].item) == DPREC_ERR_NOT_RATED, 1);
    free(out);
}

static void test_client_peak_memory_of_a_rate_recommend_cycle_is_under_the_documented_bound(void **state) {
    (void)state;
    const uint32_t ds[] = {1, 4, 16, 32, 64, 256};
    const uint32_t caps[] = {1, 50, 1000};
    const uint32_t ks[] = {1, 10, 100};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        for (size_t ci = 0; ci < 3; ci++) {
            uint32_t d = ds[di], cap = caps[ci], k = ks[ci], m = 300;
            dprec_config cfg;
            cfg_for(&cfg, m, d, cap, k);
            fake_port fake;
            dprec_port port;
            fake_port_init(&fake, &port);
            size_t len;
            unsigned char *rel = test_make_release(m, d, 1, 11 + d, &len, NULL, NULL);
            counting_alloc ca = {0};
            dprec_allocator hooks = counting_alloc_hooks(&ca, DPREC_CLIENT_MEMORY_BOUND(d, cap, k));
            dprec_client *c = NULL;
            assert_int_equal(dprec_client_init_with_allocator(&c, &cfg, &port, &hooks), DPREC_OK);
            size_t allocs_after_init = ca.allocs;
            assert_int_equal(dprec_store_load(c), DPREC_OK);
            rate_and_recommend(c, rel, len, m, cap, k);
            assert_int_equal(dprec_store_load(c), DPREC_OK);
            /* Zero allocations after init, on every path above. */
            assert_int_equal(ca.allocs, allocs_after_init);
            assert_true(ca.peak <= DPREC_CLIENT_MEMORY_BOUND(d, cap, k));
            assert_true(ca.peak <= dprec_client_required_size(&cfg));
            assert_int_equal(dprec_client_memory_used(c), ca.peak);
            dprec_client_free(c);
            assert_int_equal(ca.allocs, ca.frees);
            assert_int_equal(ca.bytes, 0);
            free(rel);
            fake_port_free(&fake);
        }
    }
}

static void test_client_with_private_fw_state_stays_under_the_bound_plus_fw_bytes(void **state) {
    (void)state;
    const uint32_t ds[] = {1, 10, 256};
    const uint32_t xis[] = {1, 80, 65535};
    for (size_t di = 0; di < 3; di++)
        for (size_t xi = 0; xi < 3; xi++) {
            dprec_config cfg;
            cfg_for(&cfg, 300, ds[di], 50, 10);
            size_t base = dprec_client_required_size(&cfg);
            cfg.fw_max_ratings = xis[xi];
            size_t need = dprec_client_required_size(&cfg);
            assert_true(need > base);
            assert_true(need <= DPREC_CLIENT_MEMORY_BOUND(ds[di], 50, 10) + DPREC_CLIENT_FW_BYTES(ds[di], xis[xi]));
        }
    dprec_config cfg;
    cfg_for(&cfg, 300, 4, 50, 10);
    cfg.fw_max_ratings = 65536;
    assert_int_equal(dprec_client_required_size(&cfg), 0);
    assert_true(DPREC_CLIENT_FW_BYTES(4, 0) == 0);
}

/* Secure aggregation's room (cfg.secagg_max_len = n): the client's memory stays under the bound with the masked
 * report's size as R, plus DPREC_CLIENT_SECAGG_BYTES(n), for n from 1 to the 2^24 cap (gauss-gd on ml-100k at d = 10:
 * 18,502 numbers; at d = 64: 109,330); n = 0 costs nothing and n past the cap is refused. */
static void test_client_with_secure_aggregation_stays_under_the_bound_plus_secagg_bytes(void **state) {
    (void)state;
    const uint32_t ds[] = {1, 10, 64};
    const uint32_t ns[] = {1, 120, 18502, 109330, 1u << 20};
    for (size_t di = 0; di < 3; di++)
        for (size_t ni = 0; ni < 5; ni++) {
            dprec_config cfg;
            cfg_for(&cfg, 300, ds[di], 50, 10);
            uint32_t dim = 1;
            while (dim < ns[ni]) dim <<= 1;
            uint32_t rbytes = 56u + 16u + 8u * dim + 4u + 4u * 16u + 64u; /* with the masked-with statement, k = 16 */
            cfg.max_report_bytes = rbytes;
            size_t base = dprec_client_required_size(&cfg);
            cfg.secagg_max_len = ns[ni];
            size_t need = dprec_client_required_size(&cfg);
            assert_true(need > base);
            assert_true(need <= DPREC_CLIENT_MEMORY_BOUND_EX(ds[di], 50, 10, 8u, 1u, rbytes) +
                                     DPREC_CLIENT_SECAGG_BYTES(ns[ni]));
        }
    dprec_config cfg;
    cfg_for(&cfg, 300, 4, 50, 10);
    cfg.secagg_max_len = (1u << 24) + 1u;
    assert_int_equal(dprec_client_required_size(&cfg), 0);
    assert_true(DPREC_CLIENT_SECAGG_BYTES(0) == 0);
}

static void test_client_init_fails_cleanly_when_the_nth_allocation_fails(void **state) {
    (void)state;
    dprec_config cfg;
    cfg_for(&cfg, 100, 8, 10, 5);
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    for (size_t n = 1;; n++) {
        counting_alloc ca = {0};
        ca.fail_at = n;
        dprec_allocator hooks = counting_alloc_hooks(&ca, SIZE_MAX);
        dprec_client *c = NULL;
        int rc = dprec_client_init_with_allocator(&c, &cfg, &port, &hooks);
        if (rc == DPREC_OK) {
            dprec_client_free(c);
            assert_int_equal(ca.bytes, 0);
            assert_true(n > 5);
            break;
        }
        assert_int_equal(rc, DPREC_ERR_NO_MEMORY);
        assert_null(c);
        assert_int_equal(ca.bytes, 0); /* nothing leaked */
    }
    /* A cap below the need fails the same way. */
    counting_alloc ca = {0};
    dprec_allocator hooks = counting_alloc_hooks(&ca, dprec_client_required_size(&cfg) / 2);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init_with_allocator(&c, &cfg, &port, &hooks), DPREC_ERR_NO_MEMORY);
    assert_int_equal(ca.bytes, 0);
    fake_port_free(&fake);
}

/* ---- least squares, top-K, predict ------------------------------------------------------------------- */

/* Naive dense ridge solve, Gaussian elimination with partial pivoting (the reference). */
static void naive_user_vector(const float *v, const float *bias, float mu, const dprec_rating *r, uint32_t n,
                              uint32_t d, double lambda, double *x) {
    double *a = calloc((size_t)d * (d + 1), sizeof(double));
    for (uint32_t i = 0; i < d; i++) a[i * (d + 1) + i] = lambda;
    for (uint32_t t = 0; t < n; t++) {
        const float *vj = v + (size_t)r[t].item * d;
        double target = r[t].value - mu - (bias ? bias[r[t].item] : 0.0f);
        for (uint32_t i = 0; i < d; i++) {
            for (uint32_t j = 0; j < d; j++) a[i * (d + 1) + j] += (double)vj[i] * vj[j];
            a[i * (d + 1) + d] += target * vj[i];
        }
    }
    for (uint32_t col = 0; col < d; col++) {
        uint32_t piv = col;
        for (uint32_t i = col + 1; i < d; i++)
            if (fabs(a[i * (d + 1) + col]) > fabs(a[piv * (d + 1) + col])) piv = i;
        for (uint32_t j = 0; j <= d; j++) {
            double t = a[col * (d + 1) + j];
            a[col * (d + 1) + j] = a[piv * (d + 1) + j];
            a[piv * (d + 1) + j] = t;
        }
        for (uint32_t i = col + 1; i < d; i++) {
            double f = a[i * (d + 1) + col] / a[col * (d + 1) + col];
            for (uint32_t j = col; j <= d; j++) a[i * (d + 1) + j] -= f * a[col * (d + 1) + j];
        }
    }
    for (uint32_t i = d; i-- > 0;) {
        double s = a[i * (d + 1) + d];
        for (uint32_t j = i + 1; j < d; j++) s -= a[i * (d + 1) + j] * x[j];
        x[i] = s / a[i * (d + 1) + i];
    }
    free(a);
}

typedef struct scored {
    uint32_t item;
    double score;
} scored;

static int by_score_desc(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return a->item < b->item ? -1 : (a->item > b->item);
}

static void check_against_brute_force(uint32_t m, uint32_t d, uint32_t n_ratings, uint32_t k, int biases,
                                      uint64_t seed) {
    dprec_config cfg;
    cfg_for(&cfg, m, d, n_ratings > 0 ? n_ratings : 1, k);
    cfg.lambda = 0.5f;
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg), len;
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    float *v, *bias;
    unsigned char *rel = test_make_release(m, d, biases, seed, &len, &v, &bias);
    test_rng r = {seed * 31};
    for (uint32_t i = 0; i < n_ratings; i++) {
        int rc = dprec_store_put(c, test_next(&r) % m, (float)(1.0 + 4.0 * test_uniform(&r)), 1);
        assert_true(rc == DPREC_OK || rc == DPREC_ERR_STORE_FULL);
    }
    uint32_t n = dprec_store_count(c);
    dprec_rating *ratings = malloc(sizeof *ratings * (n + 1));
    for (uint32_t i = 0; i < n; i++) assert_int_equal(dprec_store_at(c, i, &ratings[i]), DPREC_OK);

    dprec_recommendation *out = malloc(sizeof *out * k);
    uint32_t got = 0;
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_recommend(c, rel, len, k, out, &got), DPREC_OK);

    double *x = calloc(d, sizeof(double));
    float mu = biases ? 3.5f : 0.0f;
    naive_user_vector(v, bias, mu, ratings, n, d, 0.5, x);
    float *u = malloc(sizeof(float) * d);
    assert_int_equal(dprec_user_vector(c, u, d), DPREC_OK);
    for (uint32_t i = 0; i < d; i++) assert_true(fabs(u[i] - x[i]) <= 1e-5 * (1.0 + fabs(x[i])));

    scored *all = malloc(sizeof *all * m);
    uint32_t unrated = 0;
    for (uint32_t j = 0; j < m; j++) {
        dprec_rating tmp;
        if (dprec_store_get(c, j, &tmp) == DPREC_OK) continue;
        /* Score with the SDK's own fitted float vector so that the order comparison is exact. */
        double s = mu + (bias ? bias[j] : 0.0f);
        double dot = 0;
        for (uint32_t i = 0; i < d; i++) dot += (double)u[i] * v[(size_t)j * d + i];
        all[unrated].item = j;
        all[unrated].score = (double)(float)(s + dot);
        unrated++;
    }
    qsort(all, unrated, sizeof *all, by_score_desc);
    uint32_t expect_n = unrated < k ? unrated : k;
    assert_int_equal(got, expect_n);
    for (uint32_t i = 0; i < got; i++) {
        assert_int_equal(out[i].item, all[i].item);
        double clamped = all[i].score < 1.0 ? 1.0 : all[i].score > 5.0 ? 5.0 : all[i].score;
        assert_true(fabs(out[i].score - clamped) < 1e-5);
        float p;
        assert_int_equal(dprec_predict(c, rel, len, out[i].item, &p), DPREC_OK);
        assert_true(p == out[i].score);
    }
    free(all);
    free(u);
    free(x);
    free(out);
    free(ratings);
    free(v);
    free(bias);
    free(rel);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fake);
}

static void test_recommend_equals_brute_force_sort_on_random_problems(void **state) {
    (void)state;
    check_against_brute_force(200, 8, 30, 10, 1, 1);
    check_against_brute_force(200, 8, 30, 10, 0, 2);
    check_against_brute_force(50, 16, 5, 50, 1, 3);   /* fewer ratings than d */
    check_against_brute_force(10, 4, 8, 5, 1, 4);     /* k > unrated items */
    check_against_brute_force(1000, 32, 200, 20, 1, 5);
    check_against_brute_force(30, 2, 0, 5, 1, 6);     /* no ratings: u = 0, item biases rank */
    check_against_brute_force(3, 1, 3, 3, 1, 7);      /* everything rated: nothing to recommend */
}

static void test_streaming_fit_and_topk_match_the_buffer_calls_for_any_chunking(void **state) {
    (void)state;
    uint32_t m = 120, d = 6, k = 7;
    dprec_config cfg;
    cfg_for(&cfg, m, d, 20, k);
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg), len;
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    unsigned char *rel = test_make_release(m, d, 1, 77, &len, NULL, NULL);
    for (uint32_t i = 0; i < 20; i++) assert_int_equal(dprec_store_put(c, i * 5, 1.0f + (float)(i % 5), 1), DPREC_OK);
    dprec_recommendation ref[7], got[7];
    uint32_t nref = 0, ngot = 0;
    float uref[6], ugot[6];
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_recommend(c, rel, len, k, ref, &nref), DPREC_OK);
    assert_int_equal(dprec_user_vector(c, uref, d), DPREC_OK);
    const size_t chunks[] = {1, 2, 5, 13, 64, 4096};
    for (size_t ci = 0; ci < 6; ci++) {
        size_t step = chunks[ci];
        assert_int_equal(dprec_fit_begin(c), DPREC_OK);
        for (size_t off = 0; off < len; off += step)
            assert_int_equal(dprec_fit_feed(c, rel + off, len - off < step ? len - off : step), DPREC_OK);
        assert_int_equal(dprec_fit_end(c), DPREC_OK);
        assert_int_equal(dprec_user_vector(c, ugot, d), DPREC_OK);
        assert_memory_equal(ugot, uref, sizeof uref);
        assert_int_equal(dprec_topk_begin(c, k), DPREC_OK);
        for (size_t off = 0; off < len; off += step)
            assert_int_equal(dprec_topk_feed(c, rel + off, len - off < step ? len - off : step), DPREC_OK);
        assert_int_equal(dprec_topk_end(c, got, &ngot), DPREC_OK);
        assert_int_equal(ngot, nref);
        assert_memory_equal(got, ref, sizeof ref[0] * nref);
    }
    /* A store change during a stream is refused (the merge cursor relies on the ratings staying put). */
    assert_int_equal(dprec_topk_begin(c, k), DPREC_OK);
    assert_int_equal(dprec_store_put(c, 1, 3.0f, 1), DPREC_ERR_STATE);
    assert_int_equal(dprec_topk_feed(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_topk_end(c, got, &ngot), DPREC_OK);
    free(rel);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fake);
}

/* A compact release (format 2, docs/release-format.md) is used as the float32 release of its decoded values: the same
 * user vector and the same top-K, buffer and stream, bit for bit; it stays trusted across a restart (store section
 * 33); and its predictions differ from the original float32 release's by about a quantization step only. */
static void test_a_compact_release_is_used_as_its_decoded_float_release(void **state) {
    (void)state;
    const uint32_t m = 150, d = 12, k = 9;
    const uint16_t encs[2] = {DPREC_RELEASE_ENC_Q16, DPREC_RELEASE_ENC_Q8};
    for (int e = 0; e < 2; e++) {
        dprec_config cfg;
        cfg_for(&cfg, m, d, 30, k);
        fake_port fake;
        dprec_port port;
        fake_port_init(&fake, &port);
        size_t need = dprec_client_required_size(&cfg), flen = 0, dlen = 0, qlen = 0;
        void *mem = malloc(need);
        dprec_client *c = NULL;
        assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
        assert_int_equal(dprec_store_load(c), DPREC_OK);
        for (uint32_t i = 0; i < 30; i++) assert_int_equal(dprec_store_put(c, i * 4 + 1, 1.0f + (float)(i % 5), 1), DPREC_OK);

        float *v = NULL, *bias = NULL;
        unsigned char *f32 = test_make_release(m, d, 1, 99, &flen, &v, &bias);
        dprec_release_info info;
        memset(&info, 0, sizeof info);
        info.release_version = 7;
        info.job_id = 42;
        info.num_items = m;
        info.dim = d;
        info.rating_min = 1.0f;
        info.rating_max = 5.0f;
        info.global_mean = 3.5f;
        info.flags = encs[e];
        qlen = (size_t)dprec_release_size(m, d, DPREC_RELEASE_HAS_BIASES | encs[e], 0);
        unsigned char *q = malloc(qlen);
        size_t written = 0;
        assert_int_equal(dprec_release_write(q, qlen, &info, v, bias, &written), DPREC_OK);
        assert_int_equal(written, qlen);
        assert_true(qlen < flen);
        /* the float32 release of the decoded values */
        float *dv = malloc(sizeof(float) * m * d), *db = malloc(sizeof(float) * m);
        for (uint32_t j = 0; j < m; j++) assert_int_equal(dprec_release_row(q, &info, j, dv + (size_t)j * d, &db[j]), DPREC_OK);
        unsigned char *dec = test_write_release(m, d, dv, db, 3.5f, &dlen);
        assert_non_null(dec);

        dprec_recommendation rq[9], rd[9], rf[9], rs[9];
        uint32_t nq = 0, nd = 0, nf = 0, ns = 0;
        float uq[12], ud[12];
        assert_int_equal(test_trust(c, dec, dlen), DPREC_OK);
        assert_int_equal(dprec_recommend(c, dec, dlen, k, rd, &nd), DPREC_OK);
        assert_int_equal(dprec_user_vector(c, ud, d), DPREC_OK);
        assert_int_equal(test_trust(c, f32, flen), DPREC_OK);
        assert_int_equal(dprec_recommend(c, f32, flen, k, rf, &nf), DPREC_OK);
        assert_int_equal(test_trust(c, q, qlen), DPREC_OK);
        assert_int_equal(dprec_recommend(c, q, qlen, k, rq, &nq), DPREC_OK);
        assert_int_equal(dprec_user_vector(c, uq, d), DPREC_OK);
        assert_memory_equal(uq, ud, sizeof uq);
        assert_int_equal(nq, nd);
        assert_memory_equal(rq, rd, sizeof rq[0] * nq);
        double worst = 0.0; /* against the original floats: a quantization step's worth */
        for (uint32_t i = 0; i < nq; i++) {
            float sq = 0.0f, sf = 0.0f;
            assert_int_equal(dprec_predict(c, q, qlen, rq[i].item, &sq), DPREC_OK);
            assert_true(sq == rq[i].score);
            assert_int_equal(test_trust(c, f32, flen), DPREC_OK);
            assert_int_equal(dprec_fit(c, f32, flen), DPREC_OK);
            assert_int_equal(dprec_predict(c, f32, flen, rq[i].item, &sf), DPREC_OK);
            assert_int_equal(test_trust(c, q, qlen), DPREC_OK);
            assert_int_equal(dprec_fit(c, q, qlen), DPREC_OK);
            worst = fmax(worst, fabs((double)sq - (double)sf));
        }
        assert_true(worst < (encs[e] == DPREC_RELEASE_ENC_Q16 ? 1e-3 : 0.1));
        /* streamed: the same, for a few chunkings */
        const size_t chunks[] = {1, 7, 64, 100000};
        for (size_t ci = 0; ci < 4; ci++) {
            size_t step = chunks[ci];
            assert_int_equal(dprec_fit_begin(c), DPREC_OK);
            for (size_t off = 0; off < qlen; off += step)
                assert_int_equal(dprec_fit_feed(c, q + off, qlen - off < step ? qlen - off : step), DPREC_OK);
            assert_int_equal(dprec_fit_end(c), DPREC_OK);
            assert_int_equal(dprec_user_vector(c, uq, d), DPREC_OK);
            assert_memory_equal(uq, ud, sizeof uq);
            assert_int_equal(dprec_topk_begin(c, k), DPREC_OK);
            for (size_t off = 0; off < qlen; off += step)
                assert_int_equal(dprec_topk_feed(c, q + off, qlen - off < step ? qlen - off : step), DPREC_OK);
            assert_int_equal(dprec_topk_end(c, rs, &ns), DPREC_OK);
            assert_int_equal(ns, nq);
            assert_memory_equal(rs, rq, sizeof rq[0] * nq);
        }
        /* a restart keeps the compact release trusted (store section 33) */
        dprec_client_free(c);
        c = NULL;
        assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
        assert_int_equal(dprec_store_load(c), DPREC_OK);
        dprec_release_info t;
        assert_int_equal(dprec_release_trusted(c, &t, NULL), DPREC_OK);
        assert_int_equal(t.format_version, DPREC_RELEASE_FORMAT_COMPACT);
        assert_int_equal(t.flags, DPREC_RELEASE_HAS_BIASES | encs[e]);
        assert_int_equal(dprec_recommend(c, q, qlen, k, rs, &ns), DPREC_OK);
        assert_memory_equal(rs, rq, sizeof rq[0] * nq);
        (void)nf;
        (void)rf;
        free(f32);
        free(q);
        free(dec);
        free(v);
        free(bias);
        free(dv);
        free(db);
        dprec_client_free(c);
        free(mem);
        fake_port_free(&fake);
    }
}

/* A release whose rows are huge against the ridge (entries up to 1e6, near the public bound 2^20, as a local-DP
 * protocol's noise can make them) with fewer ratings than d: the normal equations are refused by the Cholesky guard, and the fit falls
 * back to Givens QR on the rows it kept. The result is the ridge solution, checked through the n x n dual
 * system: u = V^T alpha, (V V^T + lambda I) alpha = t, which is well conditioned here. */
static void test_fit_solves_a_release_of_huge_rows_by_qr(void **state) {
    (void)state;
    const uint32_t m = 40, d = 16, n = 6;
    dprec_config cfg;
    cfg_for(&cfg, m, d, 10, 5);
    cfg.lambda = 0.5f;
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg), len = 0;
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    test_rng r = {99};
    float *v = malloc(sizeof(float) * m * d);
    for (size_t i = 0; i < (size_t)m * d; i++) v[i] = (float)((2.0 * test_uniform(&r) - 1.0) * 1e6);
    float *zero = calloc(m, sizeof(float)); /* a global mean needs the biases section (all 0 here) */
    unsigned char *rel = test_write_release(m, d, v, zero, 3.0f, &len);
    assert_non_null(rel);
    free(zero);
    const uint32_t items[6] = {2, 7, 11, 20, 33, 39};
    const float values[6] = {5.0f, 1.0f, 3.5f, 4.0f, 2.0f, 4.5f};
    for (uint32_t i = 0; i < n; i++) assert_int_equal(dprec_store_put(c, items[i], values[i], 1), DPREC_OK);
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_fit(c, rel, len), DPREC_OK);
    float u[16];
    assert_int_equal(dprec_user_vector(c, u, d), DPREC_OK);
    /* the dual system in double, by Gaussian elimination without pivoting (V V^T + lambda I is positive definite) */
    double g[6][7], alpha[6], want[16] = {0};
    for (uint32_t a = 0; a < n; a++) {
        for (uint32_t b = 0; b < n; b++) {
            double s = a == b ? 0.5 : 0.0;
            for (uint32_t k = 0; k < d; k++) s += (double)v[items[a] * d + k] * (double)v[items[b] * d + k];
            g[a][b] = s;
        }
        g[a][n] = (double)values[a] - 3.0;
    }
    for (uint32_t col = 0; col < n; col++)
        for (uint32_t row = col + 1; row < n; row++) {
            double f = g[row][col] / g[col][col];
            for (uint32_t k = col; k <= n; k++) g[row][k] -= f * g[col][k];
        }
    for (uint32_t a = n; a-- > 0;) {
        double s = g[a][n];
        for (uint32_t b = a + 1; b < n; b++) s -= g[a][b] * alpha[b];
        alpha[a] = s / g[a][a];
    }
    double top = 0.0;
    for (uint32_t k = 0; k < d; k++) {
        for (uint32_t a = 0; a < n; a++) want[k] += (double)v[items[a] * d + k] * alpha[a];
        top = fmax(top, fabs(want[k]));
    }
    for (uint32_t k = 0; k < d; k++)
        if (fabs((double)u[k] - want[k]) > 1e-5 * top) fail_msg("u[%u] = %g, want %g", k, (double)u[k], want[k]);
    /* the fitted vector reproduces the ratings to the ridge's pull (lambda |alpha| is about 1e-12 here) */
    float p = 0.0f;
    assert_int_equal(dprec_predict(c, rel, len, items[2], &p), DPREC_OK);
    assert_true(fabs(p - 3.5f) < 1e-3);
    free(rel);
    free(v);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fake);
}

static void test_fit_refuses_damaged_or_mismatched_releases_and_keeps_the_old_vector(void **state) {
    (void)state;
    uint32_t m = 40, d = 4, k = 3;
    dprec_config cfg;
    cfg_for(&cfg, m, d, 10, k);
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg), len, len2, len3;
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    unsigned char *rel = test_make_release(m, d, 1, 3, &len, NULL, NULL);
    unsigned char *other = test_make_release(m, d, 1, 4, &len2, NULL, NULL);
    unsigned char *wrong_m = test_make_release(m + 1, d, 1, 3, &len3, NULL, NULL);
    assert_int_equal(dprec_store_put(c, 2, 5.0f, 1), DPREC_OK);
    dprec_recommendation out[3];
    uint32_t n = 0;
    float u0[4], u1[4], p;
    assert_int_equal(dprec_user_vector(c, u0, d), DPREC_ERR_STATE);
    assert_int_equal(dprec_topk_begin(c, k), DPREC_ERR_STATE);
    assert_int_equal(dprec_predict(c, rel, len, 0, &p), DPREC_ERR_STATE);
    assert_int_equal(dprec_fit(c, rel, len), DPREC_ERR_RELEASE_UNVERIFIED); /* nothing trusted yet */
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_fit(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_user_vector(c, u0, d), DPREC_OK);

    rel[100] ^= 0x10; /* body damage: the verification's digest catches it */
    assert_int_equal(test_trust(c, rel, len), DPREC_ERR_RELEASE_DIGEST);
    rel[100] ^= 0x10;
    assert_int_equal(dprec_fit(c, rel, len - 1), DPREC_ERR_RELEASE_TRUNCATED);
    assert_int_equal(test_trust(c, wrong_m, len3), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(dprec_fit(c, wrong_m, len3), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_fit(c, other, len2), DPREC_ERR_RELEASE_UNVERIFIED); /* valid, but not verified */
    /* a value of the rated row pushed past the public bound after verification: refused as it is read */
    unsigned char *hacked = malloc(len);
    memcpy(hacked, rel, len);
    size_t rated_row = 64 + 2 * 5 * 4;                            /* item 2: bias then 4 values */
    float big = 3e6f;
    memcpy(hacked + rated_row + 4, &big, 4);
    assert_int_equal(dprec_fit(c, hacked, len), DPREC_ERR_RELEASE_VALUE);
    memcpy(hacked, rel, len);
    memcpy(hacked + 64 + 30 * 20 + 8, &big, 4); /* item 30, unrated: a prediction checks each value it reads */
    assert_int_equal(dprec_fit(c, hacked, len), DPREC_OK);
    assert_int_equal(dprec_predict(c, hacked, len, 30, &p), DPREC_ERR_RELEASE_VALUE);
    float inf = INFINITY; /* the top-K checks each score: a non-finite value can never give a finite one */
    memcpy(hacked + 64 + 30 * 20 + 8, &inf, 4);
    assert_int_equal(dprec_recommend(c, hacked, len, k, out, &n), DPREC_ERR_RELEASE_VALUE);
    uint32_t nan_bits = 0x7fc00000u;
    memcpy(hacked + 64 + 30 * 20 + 8, &nan_bits, 4);
    assert_int_equal(dprec_recommend(c, hacked, len, k, out, &n), DPREC_ERR_RELEASE_VALUE);
    free(hacked);
    assert_int_equal(dprec_fit(c, rel, len), DPREC_OK);
    assert_int_equal(dprec_user_vector(c, u1, d), DPREC_OK);
    assert_memory_equal(u0, u1, sizeof u0);

    /* top-K over a release other than the fitted one */
    assert_int_equal(dprec_topk_begin(c, k), DPREC_OK);
    assert_int_equal(dprec_topk_feed(c, other, len2), DPREC_OK);
    assert_int_equal(dprec_topk_end(c, out, &n), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(n, 0);
    assert_int_equal(dprec_predict(c, other, len2, 0, &p), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_predict(c, rel, len, m, &p), DPREC_ERR_ITEM_OUT_OF_RANGE);
    assert_int_equal(dprec_recommend(c, rel, len, 0, out, &n), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_recommend(c, rel, len, k + 1, out, &n), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_fit_feed(c, rel, len), DPREC_ERR_STATE);
    assert_int_equal(dprec_fit_end(c), DPREC_ERR_STATE);
    assert_int_equal(dprec_topk_end(c, out, &n), DPREC_ERR_STATE);
    /* a fit stream of another (valid, unverified) release is refused at its end, the vector kept */
    assert_int_equal(dprec_fit_begin(c), DPREC_OK);
    assert_int_equal(dprec_fit_feed(c, other, len2), DPREC_OK);
    assert_int_equal(dprec_fit_end(c), DPREC_ERR_RELEASE_UNVERIFIED);
    assert_int_equal(dprec_user_vector(c, u1, d), DPREC_OK);
    assert_memory_equal(u0, u1, sizeof u0);
    /* A change of rating invalidates the vector. */
    assert_int_equal(dprec_store_put(c, 3, 5.0f, 1), DPREC_OK);
    assert_int_equal(dprec_user_vector(c, u1, d), DPREC_ERR_STATE);
    free(rel);
    free(other);
    free(wrong_m);
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fake);
}

/* Issue 19, point 3: extreme but bounded releases. Whatever the values within the public bound (|x| <= 2^20,
 * tiny or huge, NaN-free) and however small lambda, predict is never NaN and stays on the scale, and recommend k
 * returns min(k, unrated) items: the symptoms reported (u overflowing to +-inf, a NaN prediction, `recommend 2`
 * with one item) need values past the bound, which every device refuses (test_release.c, test_verify.c). */
static void test_extreme_bounded_releases_give_finite_scores_and_full_lists(void **state) {
    (void)state;
    const float vals[] = {1048576.0f, -1048576.0f, 1e-40f, 1e-30f, 1.0f, -1048575.0f};
    const float lambdas[] = {1e-45f, 1e-30f, 1e-6f, 0.1f};
    for (size_t li = 0; li < 4; li++)
        for (size_t a = 0; a < 6; a++)
            for (size_t b = 0; b < 6; b++) {
                const uint32_t m = 3, d = 2;
                float v[6] = {vals[a], vals[b], vals[b], -vals[a], vals[a], vals[a]};
                float bias[3] = {1048576.0f, -1048576.0f, 1048576.0f};
                size_t len = 0;
                unsigned char *rel = test_write_release(m, d, v, bias, -1048576.0f, &len);
                assert_non_null(rel);
                dprec_config cfg;
                cfg_for(&cfg, m, d, 4, 2);
                cfg.lambda = lambdas[li];
                fake_port fake;
                dprec_port port;
                fake_port_init(&fake, &port);
                size_t need = dprec_client_required_size(&cfg);
                void *mem = malloc(need);
                dprec_client *c = NULL;
                assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
                assert_int_equal(dprec_store_load(c), DPREC_OK);
                assert_int_equal(dprec_store_put(c, 0, 5.0f, 1), DPREC_OK);
                assert_int_equal(test_trust(c, rel, len), DPREC_OK);
                dprec_recommendation out[2];
                uint32_t n = 0;
                int rc = dprec_recommend(c, rel, len, 2, out, &n);
                assert_true(rc == DPREC_OK || rc == DPREC_ERR_SINGULAR);
                if (rc == DPREC_OK) {
                    assert_int_equal(n, 2);
                    for (uint32_t i = 0; i < n; i++) assert_true(out[i].score >= 1.0f && out[i].score <= 5.0f);
                    float p = 0;
                    assert_int_equal(dprec_predict(c, rel, len, 1, &p), DPREC_OK);
                    assert_true(p >= 1.0f && p <= 5.0f);
                }
                dprec_client_free(c);
                free(mem);
                fake_port_free(&fake);
                free(rel);
            }
}

/* The rest of point 3: predictions must also stay within float, or top-K compares +inf with +inf. An app's
 * scale of +-1e38 let a fit return u near 9e37; two unrated items then scored 4.7e43 and 9.5e43, both past
 * FLT_MAX (the conversion to float is undefined in ISO C, +inf on IEEE hardware), tied, and were ranked by item
 * id: the lower prediction first. The fit now refuses a solution with |u_k| > 2^96, for which some prediction
 * could leave the float range (DPREC_ERR_SINGULAR: raise lambda); any fit it accepts ranks exactly. */
static void test_recommend_never_ranks_predictions_past_the_float_range(void **state) {
    (void)state;
    const uint32_t m = 3, d = 1;
    float v[3] = {1.0f, 524288.0f, 1048576.0f}; /* item 2's prediction is twice item 1's */
    float bias[3] = {0.0f, 0.0f, 0.0f};
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.num_items = m;
    info.dim = d;
    info.rating_min = -1e38f;
    info.rating_max = 1e38f;
    info.flags = DPREC_RELEASE_HAS_BIASES;
    size_t cap = (size_t)dprec_release_size(m, d, info.flags, 0), len = 0;
    unsigned char *rel = malloc(cap);
    assert_int_equal(dprec_release_write(rel, cap, &info, v, bias, &len), DPREC_OK);
    dprec_config cfg;
    cfg_for(&cfg, m, d, 4, 2);
    cfg.rating_min = -1e38f;
    cfg.rating_max = 1e38f;
    fake_port fake;
    dprec_port port;
    fake_port_init(&fake, &port);
    size_t need = dprec_client_required_size(&cfg);
    void *mem = malloc(need);
    dprec_client *c = NULL;
    assert_int_equal(dprec_client_init(&c, &cfg, &port, mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(c), DPREC_OK);
    assert_int_equal(dprec_store_put(c, 0, 1e38f, 1), DPREC_OK);
    assert_int_equal(test_trust(c, rel, len), DPREC_OK);
    dprec_recommendation out[2];
    uint32_t n = 0;
    int rc = dprec_recommend(c, rel, len, 2, out, &n);
    if (rc == DPREC_OK) { /* then the order must be the predictions' */
        assert_int_equal(n, 2);
        assert_int_equal(out[0].item, 2);
        assert_true(out[0].score == out[0].score && out[1].score == out[1].score);
    } else {
        assert_int_equal(rc, DPREC_ERR_SINGULAR);
        float p;
        assert_int_equal(dprec_predict(c, rel, len, 1, &p), DPREC_ERR_STATE); /* no vector: no prediction */
    }
    dprec_client_free(c);
    free(mem);
    fake_port_free(&fake);
    free(rel);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_rejects_inconsistent_configs),
        cmocka_unit_test(test_client_with_private_fw_state_stays_under_the_bound_plus_fw_bytes),
        cmocka_unit_test(test_client_works_in_an_unaligned_arena_of_exactly_the_required_size),
        cmocka_unit_test(test_client_randomness_comes_from_the_ports_entropy_only),
        cmocka_unit_test(test_two_clients_in_one_process_are_independent),
        cmocka_unit_test(test_client_peak_memory_of_a_rate_recommend_cycle_is_under_the_documented_bound),
        cmocka_unit_test(test_client_with_secure_aggregation_stays_under_the_bound_plus_secagg_bytes),
        cmocka_unit_test(test_client_init_fails_cleanly_when_the_nth_allocation_fails),
        cmocka_unit_test(test_recommend_equals_brute_force_sort_on_random_problems),
        cmocka_unit_test(test_streaming_fit_and_topk_match_the_buffer_calls_for_any_chunking),
        cmocka_unit_test(test_a_compact_release_is_used_as_its_decoded_float_release),
        cmocka_unit_test(test_fit_solves_a_release_of_huge_rows_by_qr),
        cmocka_unit_test(test_fit_refuses_damaged_or_mismatched_releases_and_keeps_the_old_vector),
        cmocka_unit_test(test_extreme_bounded_releases_give_finite_scores_and_full_lists),
        cmocka_unit_test(test_recommend_never_ranks_predictions_past_the_float_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
