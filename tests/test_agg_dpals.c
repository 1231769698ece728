/* Tests for the dpals protocol (private alternating least squares, Chien et al. ICML 2021): common/protocols/dpals.c (the
 * shared clipping) and aggregator/protocols/dpals.c (re-clipping, the sensitivity of the statistics, the noise
 * scale against the accountant, the projected solve, the noiseless step against exact ALS). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "dprec/release.h"
#include "protocols/agg_protocol.h"
#include "dpals.h"
#include "gauss.h"
#include "noise.h"

/* splitmix64: deterministic test data (not privacy noise) */
static uint64_t sm(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(sm(s) >> 11) / 9007199254740992.0; }

static agg_job make_job(const char *params, uint32_t m, uint32_t d, double eps, double delta, int64_t rounds, double q) {
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_dpals;
    j.m = m;
    j.d = d;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = rounds;
    j.participation = q;
    j.params = (char *)params;
    j.has_budget = 1;
    j.budget_epsilon = eps;
    j.budget_delta = delta;
    return j;
}

enum { M = 30, D = 4, K = 12, CW = D * (D + 1) / 2 + D, PMAX = 8 + 4 * (D - 1) + 8 * K };

/* A payload as a device (or an attacker) writes it: w (d - 1 floats), then n (item, target) pairs, padded to k. */
static size_t payload(uint32_t d, uint32_t k, const float *w, const uint32_t *items, const float *t, uint32_t n,
                      unsigned char *out) {
    dprec_st32(out, d);
    dprec_st32(out + 4, k);
    for (uint32_t a = 0; a + 1 < d; a++) dprec_stf32(out + 8 + 4 * a, w[a]);
    unsigned char *p = out + 8 + 4 * (d - 1);
    for (uint32_t i = 0; i < k; i++) {
        dprec_st32(p + 8 * i, i < n ? items[i] : DPREC_PAD_ITEM);
        dprec_stf32(p + 8 * i + 4, i < n ? t[i] : 0.0f);
    }
    return dprec_dpals_payload_size(d, k);
}

/* A random user, honest or not: w from well inside to far outside the clip (1e30 for some), targets within or
 * far outside the rating clip, between 0 and K items (a few for a third of them: the light users reweighting
 * scales up). */
static void random_user(uint64_t *s, float *w, uint32_t *items, float *t, uint32_t *n) {
    double scale = unif(s) < 0.1 ? 1e30 : 0.05 + 10.0 * unif(s);
    for (uint32_t a = 0; a + 1 < D; a++) w[a] = (float)(scale * (2 * unif(s) - 1));
    uint32_t cnt = 0;
    const double rate = unif(s) < 0.33 ? 0.05 : 0.4;
    for (uint32_t j = 0; j < M && cnt < K; j++)
        if (unif(s) < rate) items[cnt++] = j;
    for (uint32_t i = 0; i < cnt; i++) t[i] = (float)((unif(s) < 0.2 ? 1e30 : 6.0) * (2 * unif(s) - 1));
    *n = cnt;
}

/* n reports of random users (random_user), device ids 1..n, their payloads in p. */
static void random_reports(uint64_t *s, int n, unsigned char (*p)[PMAX], agg_report *reps) {
    for (int i = 0; i < n; i++) {
        float w[D], t[K];
        uint32_t items[K], cnt;
        random_user(s, w, items, t, &cnt);
        reps[i] = (agg_report){.device = (uint64_t)i + 1, .payload = p[i], .payload_len = payload(D, K, w, items, t, cnt, p[i])};
    }
}

/* Adding or removing one user's whole data moves the normalized statistics by at most sqrt(k (1 + alpha^2)) in L2
 * (sqrt(2k) at alpha = 1), and each item's by at most om sqrt(1 + alpha^2), for honest and malicious payloads alike
 * (the aggregator re-clips); alpha is the job's params.gram_weight, om = sqrt(k / n) for a report of n < k pairs with
 * params.reweight (the default), else 1. */
static void one_user_moves_the_statistics_by_at_most_sqrt_2k(const char *params, double alpha, int reweight) {
    agg_job j = make_job(params, M, D, 100, 1e-6, 10, 1.0);
    /* params.factors false (the bias model at d): rows of d = 1's statistics, x = [bias_scale] */
    const int factors = strstr(params, "\"factors\":false") == NULL;
    const uint32_t cw = factors ? CW : dprec_dpals_item_coords(1);
    uint64_t s = 5;
    float w[D], t[K];
    uint32_t items[K], n;
    unsigned char p[PMAX];
    double worst = 0, worst_item = 0, worst_g = 0, worst_h = 0, worst_light = 0; /* light: at most k / 2 pairs */
    const uint32_t tri = factors ? D * (D + 1) / 2 : 1;
    for (int trial = 0; trial < 400; trial++) {
        random_user(&s, w, items, t, &n);
        double *base = calloc(M * cw, sizeof(double)), *with = calloc(M * cw, sizeof(double));
        /* other users' statistics, then the same plus this user */
        for (int o = 0; o < 3; o++) {
            float wo[D], to[K];
            uint32_t io[K], no;
            random_user(&s, wo, io, to, &no);
            size_t lo = payload(D, K, wo, io, to, no, p);
            assert_int_equal(agg_dpals_accumulate(&j, p, lo, base), 0);
        }
        memcpy(with, base, sizeof(double) * M * cw);
        size_t len = payload(D, K, w, items, t, n, p);
        assert_int_equal(agg_dpals_accumulate(&j, p, len, with), 0);
        double tot = 0;
        const double om = reweight && n > 0 && n < K ? sqrt((double)K / n) : 1.0; /* written out, not the SDK's */
        for (uint32_t it = 0; it < M; it++) {
            double e = 0, eg = 0;
            for (uint32_t c = 0; c < cw; c++) {
                double dd = with[it * cw + c] - base[it * cw + c];
                e += dd * dd;
                if (c < tri) eg += dd * dd;
            }
            if (sqrt(e) > worst_item) worst_item = sqrt(e);
            if (sqrt(eg) > worst_g) worst_g = sqrt(eg);
            if (sqrt(e - eg) > worst_h) worst_h = sqrt(e - eg);
            assert_true(sqrt(eg) <= om * alpha * (1 + 1e-12) && sqrt(e - eg) <= om * (1 + 1e-12));
            assert_true(sqrt(e) <= om * sqrt(1.0 + alpha * alpha) * (1 + 1e-12));
            tot += e;
        }
        if (sqrt(tot) > worst) worst = sqrt(tot);
        if (n > 0 && 2 * n <= K && sqrt(tot) > worst_light) worst_light = sqrt(tot);
        assert_true(sqrt(tot) <= dprec_dpals_sensitivity(K, alpha) * (1 + 1e-12));
        free(base);
        free(with);
    }
    /* the bounds are approached (a clipped user with every target at the clip), so the test has teeth: h's part
     * reaches 1, the Gram part alpha times the triangle's norm, (||x||^4 + sum x_a^4) / 2 under ||x||^4, about 0.8
     * of it for these clipped x = [w; 0.8] */
    assert_true(worst_h > 0.99 && worst_g > 0.75 * alpha);
    assert_true(worst_item > 0.9 * sqrt(1.0 + 0.75 * 0.75 * alpha * alpha));
    assert_true(worst > 0.5 * dprec_dpals_sensitivity(K, alpha));
    /* reweighted, a clipped light user's report has the whole sensitivity's norm (up to the Gram part's 0.8);
     * without, at most half of it */
    if (reweight) assert_true(worst_light > 0.9 * dprec_dpals_sensitivity(K, 0.8 * alpha));
    else assert_true(worst_light <= dprec_dpals_sensitivity(K / 2, alpha) * (1 + 1e-12));
    assert_true(worst_light > 0.0);
}

static void test_dpals_one_user_moves_the_statistics_by_at_most_sqrt_2k(void **state) {
    (void)state;
    /* the default Gram weight, DPALS's own (1), and one above it */
    one_user_moves_the_statistics_by_at_most_sqrt_2k("{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1}",
                                                     DPREC_DPALS_DEFAULT_GRAM_WEIGHT, DPREC_DPALS_DEFAULT_REWEIGHT);
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"gram_weight\":1}", 1.0, 1);
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"gram_weight\":3}", 3.0, 1);
    /* without reweighting (DPALS's own: every rating weighs 1) */
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"reweight\":false}", 0.5, 0);
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"gram_weight\":1,\"reweight\":false}",
        1.0, 0);
    /* the bias model at d (params.factors false): w is ignored, the same bound on d = 1's statistics */
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"factors\":false}",
        DPREC_DPALS_DEFAULT_GRAM_WEIGHT, 1);
    /* residual targets (params.residual): the same payload, the same re-clipping, the same bound */
    one_user_moves_the_statistics_by_at_most_sqrt_2k(
        "{\"max_items\":12,\"u_clip\":0.8,\"rating_clip\":1.5,\"noise_multiplier\":1,\"residual\":true}",
        DPREC_DPALS_DEFAULT_GRAM_WEIGHT, 1);
}

/* The noise multiplier is the accountant inverted for the job's (epsilon, delta, rounds, q), the round's step
 * is that Gaussian, the published figure equals the accountant's, and sigma = z times the sensitivity
 * sqrt(k (1 + alpha^2)) with the grid's allowance (alpha the default Gram weight, 0.5: sqrt(62.5) at k = 50). */
static void test_dpals_noise_scale_equals_the_accountant_inversion(void **state) {
    (void)state;
    agg_job j = make_job("{\"max_items\":50}", 200, 6, 2.0, 1e-6, 8, 0.5);
    double z = 0, sens = 0, sigma = 0, zinv = 0, eps = 0, eps_acc = 0;
    assert_int_equal(dprec_gauss_noise_multiplier(2.0, 1e-6, 8, 0.5, &zinv), DPREC_OK);
    assert_int_equal(agg_dpals_noise_scale(&j, &z, &sens, &sigma), 0);
    assert_true(z == zinv);
    double a = sqrt(200.0 * (6 * 7 / 2 + 6)) * z * 0x1p-19;
    assert_true(DPREC_DPALS_DEFAULT_GRAM_WEIGHT == 0.5);
    assert_true(fabs(sens - sqrt(62.5) / (1 - a)) <= 1e-12 * sens);
    assert_true(sens >= sqrt(62.5) && sigma == z * sens);
    dprec_step st;
    assert_int_equal(agg_protocol_dpals.round_step(&j, &st), 0);
    assert_true(st.kind == DPREC_STEP_GAUSSIAN && st.noise_multiplier == z && st.q == 0.5 && st.discrete == 1);
    assert_int_equal(agg_budget_check(&j, 8, &eps), 1);
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    assert_int_equal(dprec_accountant_add_discrete_gaussian(&acc, z, 0.5, 8), DPREC_OK);
    assert_int_equal(dprec_accountant_epsilon(&acc, 1e-6, DPREC_CONVERSION_CKS, &eps_acc, NULL), DPREC_OK);
    assert_true(eps == eps_acc && eps <= 2.0 && eps > 1.998);
    assert_int_equal(agg_budget_check(&j, 9, NULL), 0); /* a ninth round never opens */
    cJSON *priv = cJSON_CreateObject();
    agg_protocol_dpals.privacy_extra(&j, priv);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(priv, "noise_multiplier");
    const cJSON *ue = cJSON_GetObjectItemCaseSensitive(priv, "user_epsilon");
    assert_true(cJSON_IsNumber(nm) && nm->valuedouble == z);
    assert_true(cJSON_IsNumber(ue) && ue->valuedouble == eps);
    const cJSON *gw = cJSON_GetObjectItemCaseSensitive(priv, "gram_weight");
    assert_true(cJSON_IsNumber(gw) && gw->valuedouble == 0.5);
    cJSON_Delete(priv);
    /* an explicit multiplier is taken as it is */
    agg_job j2 = make_job("{\"noise_multiplier\":3.5}", 200, 6, 1e4, 1e-6, 8, 1.0);
    assert_int_equal(agg_dpals_noise_scale(&j2, &z, &sens, &sigma), 0);
    assert_true(z == 3.5);
}

/* The round's statistics carry exactly the published noise: with no reports, every normalized coordinate of
 * every item (the Gram entries and the right-hand side alike) is the discrete Gaussian of standard deviation sigma
 * (the published z times the sensitivity with its allowance), for the private bias model (d = 1: each item's
 * count and sum) as for a factor model (d = 2). 4000 items: the sample std within 4 standard errors (false failure
 * below 1e-4) and the mean within 4.5; a scale off by 3% fails. */
static void check_published_noise(uint32_t d, const char *params, double eps, double want_z, double alpha) {
    const uint32_t m = 4000, cw = d * (d + 1) / 2 + d;
    agg_job j = make_job(params, m, d, eps, 1e-6, 5, 0.5);
    double z, sens, sigma;
    assert_int_equal(agg_dpals_noise_scale(&j, &z, &sens, &sigma), 0);
    /* sqrt(k (1 + alpha^2)) (k = 8), with the grid's allowance 1 / (1 - sqrt(N) z 2^-19) over the N noised
     * coordinates */
    assert_true(z == want_z);
    const double want_sens = sqrt(8.0 * (1.0 + alpha * alpha));
    assert_true(fabs(sens / (want_sens / (1.0 - sqrt((double)m * cw) * z * ldexp(1.0, -19))) - 1.0) < 1e-12);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"dpals-noise", 11, "test"), DPREC_OK);
    double *stats = NULL;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_dpals_stats(&j, NULL, 0, &rng, 1, &stats, err, sizeof err), 0);
    const size_t n = (size_t)m * cw;
    double s1 = 0, s2 = 0;
    for (size_t c = 0; c < n; c++) {
        s1 += stats[c];
        s2 += stats[c] * stats[c];
    }
    double sd = sqrt(s2 / n - (s1 / n) * (s1 / n));
    assert_true(fabs(sd / sigma - 1.0) < 4.0 / sqrt(2.0 * (double)n));
    assert_true(fabs(s1 / n) < 4.5 * sigma / sqrt((double)n)); /* centred */
    free(stats);
    /* without noise the statistics are exactly the (empty) sums */
    assert_int_equal(agg_dpals_stats(&j, NULL, 0, NULL, 0, &stats, err, sizeof err), 0);
    for (size_t c = 0; c < n; c++) assert_true(stats[c] == 0.0);
    free(stats);
    dprec_rng_free(&rng);
}

static void test_dpals_step_adds_the_published_noise(void **state) {
    (void)state;
    check_published_noise(2, "{\"noise_multiplier\":2,\"max_items\":8,\"rating_clip\":1.5}", 1e4, 2.0, 0.5);
    check_published_noise(2, "{\"noise_multiplier\":2,\"max_items\":8,\"gram_weight\":1}", 1e4, 2.0, 1.0);
    /* the private bias model, its multiplier inverted from the budget (eps 1, delta 1e-6, 5 rounds, q = 0.5) */
    agg_job b = make_job("{\"max_items\":8}", 4000, 1, 1.0, 1e-6, 5, 0.5);
    double z, sens, sigma, want;
    assert_int_equal(agg_dpals_noise_scale(&b, &z, &sens, &sigma), 0);
    assert_int_equal(dprec_gauss_noise_multiplier(1.0, 1e-6, 5, 0.5, &want), DPREC_OK);
    assert_true(fabs(z / want - 1.0) < 1e-12);
    check_published_noise(1, "{\"max_items\":8}", 1.0, z, 0.5);
}

/* The posterior filter (agg_dpals_solve with kappa > 0): in G's eigenbasis each coefficient is g h_e / (g^2 +
 * lambda g + kappa), so a direction nobody rated (g = 0) gets 0 whatever the noise on h, and no coefficient exceeds
 * |h_e| / (lambda + 2 sqrt(kappa)); kappa = 0 is the ridge solve. */
static void test_dpals_posterior_filter_shrinks_what_the_noise_hides(void **state) {
    (void)state;
    const double c = cos(0.3), sn = sin(0.3), e[2] = {900.0, -40.0}, lam = 5.0, kappa = 2500.0, h[2] = {30.0, -70.0};
    double q[4] = {c, -sn, sn, c}, g[4], s[2];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) g[a * 2 + b] = q[a * 2 + 0] * e[0] * q[b * 2 + 0] + q[a * 2 + 1] * e[1] * q[b * 2 + 1];
    assert_int_equal(agg_dpals_solve(g, h, 2, lam, kappa, s), 0);
    for (int a = 0; a < 2; a++) {
        double want = 0;
        for (int k = 0; k < 2; k++) {
            double qh = q[0 * 2 + k] * h[0] + q[1 * 2 + k] * h[1], gv = e[k] > 0 ? e[k] : 0;
            want += q[a * 2 + k] * qh * gv / (gv * gv + lam * gv + kappa);
        }
        assert_true(fabs(s[a] - want) < 1e-12);
    }
    /* d = 1, the bias model: b = n S / (n^2 + lambda n + kappa); a negative noisy count gives 0 */
    double g1 = 60.0, h1 = 30.0, s1;
    assert_int_equal(agg_dpals_solve(&g1, &h1, 1, lam, kappa, &s1), 0);
    assert_true(fabs(s1 - 60.0 * 30.0 / (3600.0 + 300.0 + 2500.0)) < 1e-12);
    g1 = -10.0;
    assert_int_equal(agg_dpals_solve(&g1, &h1, 1, lam, kappa, &s1), 0);
    assert_true(s1 == 0.0);
    /* the bound, over every count */
    for (double n = 0.5; n < 1e5; n *= 1.7) {
        g1 = n;
        h1 = 1e3;
        assert_int_equal(agg_dpals_solve(&g1, &h1, 1, lam, kappa, &s1), 0);
        assert_true(fabs(s1) <= 1e3 / (lam + 2.0 * sqrt(kappa)) * (1.0 + 1e-12));
    }
}

/* The bias model's count posterior (aggregator/protocols/dpals_count.c): with a well measured count it is the plug-in
 * solve g h / (g^2 + lambda g + kappa), exactly so without count noise; it is odd in h, 0 at h = 0, and never beyond
 * the plug-in's bound |h| / (lambda + 2 sqrt(kappa)) whatever the noisy count says (a negative one too). */
static void test_dpals_count_posterior_is_the_plug_in_solve_for_a_measured_count(void **state) {
    (void)state;
    const double lam = 5.0, kap = 2500.0, tau2 = 0.25;
    agg_dpals_count_prior pr;
    agg_dpals_count_prior_fit(100.0 * 1000, (100.0 * 100.0 + 250.0 * 250.0) * 1000, 1000, 1.0, &pr);
    assert_true(fabs(pr.mean - 100.0) < 1e-9 && fabs(pr.var - (250.0 * 250.0 - 1.0)) < 1e-6); /* the moments, less the noise */
    const double counts[3] = {20.0, 300.0, 5000.0};
    for (int i = 0; i < 3; i++) {
        const double g = counts[i], h = 0.3 * g, plug = g * h / (g * g + lam * g + kap);
        double gbar, s = agg_dpals_count_posterior(&pr, g, 0.0, h, lam, kap, tau2, &gbar);
        assert_true(s == plug && gbar == g); /* no count noise: the plug-in itself */
        s = agg_dpals_count_posterior(&pr, g, 1e-3 * g, h, lam, kap, tau2, &gbar);
        assert_true(fabs(s / plug - 1.0) < 1e-4 && fabs(gbar / g - 1.0) < 1e-4);
    }
    /* a noise far above the counts (sigma_g 5.5 times their mean, as on MovieLens 100K at epsilon 0.5) */
    agg_dpals_count_prior_fit(0.0, 0.0, 1682, 550.0, &pr); /* moments hidden by the noise: the floors */
    assert_true(fabs(pr.mean - 550.0 / sqrt(1682.0)) < 1e-9 && fabs(pr.var - 4.0 * pr.mean * pr.mean) < 1e-9);
    pr.mean = 100.0;
    pr.var = 4e4;
    const double ghats[5] = {-2000.0, -100.0, 0.0, 90.0, 3000.0}, hs[4] = {0.0, 10.0, 400.0, 1e4};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++) {
            double gb1, gb2;
            const double sp = agg_dpals_count_posterior(&pr, ghats[i], 550.0, hs[k], lam, kap, tau2, &gb1);
            const double sm_ = agg_dpals_count_posterior(&pr, ghats[i], 550.0, -hs[k], lam, kap, tau2, &gb2);
            assert_true(isfinite(sp) && sp == -sm_ && gb1 == gb2 && gb1 > 0.0);
            assert_true(fabs(sp) <= hs[k] / (lam + 2.0 * sqrt(kap)) * (1.0 + 1e-12));
            if (hs[k] == 0.0) assert_true(sp == 0.0);
            if (hs[k] > 0.0) assert_true(sp > 0.0);
        }
    /* the larger |h|, the larger the count the posterior infers (a rare item rarely sums to a large h) */
    double gsmall, gbig;
    (void)agg_dpals_count_posterior(&pr, 90.0, 550.0, 10.0, lam, kap, tau2, &gsmall);
    (void)agg_dpals_count_posterior(&pr, 90.0, 550.0, 1e4, lam, kap, tau2, &gbig);
    assert_true(gbig > 2.0 * gsmall);
}

/* Its purpose, measured under the solve's own model with a count prior it does not assume (log-normal, CV 1.5): items'
 * coefficients s ~ N(0, tau^2), noisy counts and right-hand sides as the aggregator releases them. Where the count's
 * noise is 5.5 times the mean count, the count posterior's error (weighted by each item's count, as a test set of
 * ratings weighs items) is below both the plug-in solve's and the prior mean's (0: the device keeps nothing); where the
 * count is well measured (noise a twentieth of the mean) it is the plug-in's, within 2%. Deterministic data (here 3%
 * and 18% below the two, and 1.5% below the plug-in where the count is measured). */
static void test_dpals_count_posterior_beats_the_plug_in_where_counts_are_noise(void **state) {
    (void)state;
    enum { N = 4000 };
    const double lam = 5.0, tau2 = 0.25, mean = 100.0, cv = 1.5, noise_ratios[2] = {5.5, 0.05};
    const double sl2 = log(1.0 + cv * cv), ml = log(mean) - 0.5 * sl2;
    static double g[N], s[N], gh[N], h[N];
    for (int r = 0; r < 2; r++) {
        uint64_t st = 11;
        const double sigma_g = noise_ratios[r] * mean, sigma_h = 0.5 * sigma_g, kap = sigma_h * sigma_h / tau2;
        double sum1 = 0.0, sum2 = 0.0;
        for (int j = 0; j < N; j++) {
            double z[4];
            for (int k = 0; k < 4; k += 2) { /* Box-Muller */
                const double u1 = 1.0 - unif(&st), u2 = unif(&st);
                z[k] = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
                z[k + 1] = sqrt(-2.0 * log(u1)) * sin(6.283185307179586 * u2);
            }
            g[j] = exp(ml + sqrt(sl2) * z[0]);
            s[j] = sqrt(tau2) * z[1];
            gh[j] = g[j] + sigma_g * z[2];
            h[j] = g[j] * s[j] + sqrt(lam * tau2 * g[j] + sigma_h * sigma_h) * z[3];
            sum1 += gh[j];
            sum2 += gh[j] * gh[j];
        }
        agg_dpals_count_prior pr;
        agg_dpals_count_prior_fit(sum1, sum2, N, sigma_g, &pr);
        double e_post = 0.0, e_plug = 0.0, e_zero = 0.0;
        for (int j = 0; j < N; j++) {
            double gbar, gp = gh[j] > 0.0 ? gh[j] : 0.0;
            const double sp = agg_dpals_count_posterior(&pr, gh[j], sigma_g, h[j], lam, kap, tau2, &gbar);
            const double su = gp > 0.0 ? gp * h[j] / (gp * gp + lam * gp + kap) : 0.0;
            e_post += g[j] * (sp - s[j]) * (sp - s[j]);
            e_plug += g[j] * (su - s[j]) * (su - s[j]);
            e_zero += g[j] * s[j] * s[j];
        }
        if (r == 0) {
            assert_true(e_post < 0.985 * e_plug); /* 3% below it here */
            assert_true(e_post < 0.85 * e_zero);  /* 18% below it here */
        } else {
            assert_true(e_post < 1.02 * e_plug);
        }
    }
}

/* The bias model with noise (d = 1): with the count posterior (the default) each released bias is
 * agg_dpals_count_posterior of its item's noisy statistics, and the column says so: each bias's spread without bound
 * (code 255), so that a device keeps it whole, the solve having shrunk it already (not in a job with a base_job, whose
 * column carries the start's uncertainty); params.count_posterior false is the plug-in solve, whose column measures
 * one spread for the release. The same noise (one seed) in both. Without noise the
 * count posterior does nothing (the noiseless tests above: exact ALS). */
static void test_dpals_count_posterior_releases_each_item_s_posterior_mean(void **state) {
    (void)state;
    enum { U = 40 };
    agg_job on = make_job("{\"max_items\":12,\"noise_multiplier\":3}", M, 1, 100, 1e-6, 10, 1.0);
    agg_job off = make_job("{\"max_items\":12,\"noise_multiplier\":3,\"count_posterior\":false}", M, 1, 100, 1e-6, 10, 1.0);
    on.release_uncertainty = off.release_uncertainty = 1;
    uint64_t st = 9;
    static unsigned char p[U][PMAX];
    agg_report reps[U];
    for (int i = 0; i < U; i++) { /* d = 1 payloads: no w, up to K (item, target) pairs */
        uint32_t items[K], n = 0;
        float t[K];
        for (uint32_t it = 0; it < M && n < K; it++)
            if (unif(&st) < 0.3) {
                items[n] = it;
                t[n++] = (float)(unif(&st) - 0.3);
            }
        reps[i] = (agg_report){.device = (uint64_t)i + 1, .payload = p[i], .payload_len = payload(1, K, NULL, items, t, n, p[i])};
    }
    char err[AGG_ERRMSG];
    agg_model prev, a, b;
    assert_int_equal(agg_protocol_dpals.initial_model(&on, &prev, err, sizeof err), 0);
    dprec_rng r1, r2;
    assert_int_equal(dprec_rng_init(&r1, NULL, (const unsigned char *)"count", 5, "test"), DPREC_OK);
    assert_int_equal(dprec_rng_init(&r2, NULL, (const unsigned char *)"count", 5, "test"), DPREC_OK);
    assert_int_equal(agg_dpals_step(&on, &prev, reps, U, &r1, 1, &a, err, sizeof err), 0);
    assert_int_equal(agg_dpals_step(&off, &prev, reps, U, &r2, 1, &b, err, sizeof err), 0);
    /* the same noisy statistics, solved here both ways */
    dprec_rng r3;
    assert_int_equal(dprec_rng_init(&r3, NULL, (const unsigned char *)"count", 5, "test"), DPREC_OK);
    double *stats = NULL, z, sens, sigma;
    assert_int_equal(agg_dpals_stats(&on, reps, U, &r3, 1, &stats, err, sizeof err), 0);
    assert_int_equal(agg_dpals_noise_scale(&on, &z, &sens, &sigma), 0);
    const double x2 = dprec_dpals_x2(1, DPREC_DPALS_DEFAULT_U_CLIP, 1.0), alpha = 0.5; /* bias_scale 1 at d = 1 */
    const double gsc = x2 / alpha, hsc = 1.0 * sqrt(x2), sigma_g = sigma * gsc; /* rating_clip 1 at d = 1 */
    const double kappa = (sigma * hsc / 0.5) * (sigma * hsc / 0.5), lam = 5.0;
    double sum1 = 0.0, sum2 = 0.0, g, h;
    for (uint32_t it = 0; it < M; it++) {
        agg_dpals_unpack(stats + it * 2, 1, gsc, hsc, &g, &h);
        sum1 += g;
        sum2 += g * g;
    }
    agg_dpals_count_prior pr;
    agg_dpals_count_prior_fit(sum1, sum2, M, sigma_g, &pr);
    int differ = 0;
    for (uint32_t it = 0; it < M; it++) {
        agg_dpals_unpack(stats + it * 2, 1, gsc, hsc, &g, &h);
        double gbar, gg = g, s_plug;
        const double s_post = agg_dpals_count_posterior(&pr, g, sigma_g, h, lam, kappa, 0.25, &gbar);
        assert_int_equal(agg_dpals_solve(&gg, &h, 1, lam, kappa, &s_plug), 0);
        assert_true(fabs((double)a.bias[it] - s_post) < 1e-5); /* b = s bias_scale, 1 at d = 1 */
        assert_true(fabs((double)b.bias[it] - s_plug) < 1e-5);
        differ += fabs(s_post - s_plug) > 1e-4;
        assert_int_equal(a.unc[it * DPREC_RELEASE_UNCERTAINTY_WIDTH + 2], 255); /* kept whole */
        assert_int_equal(b.unc[it * DPREC_RELEASE_UNCERTAINTY_WIDTH + 2], b.unc[2]);
        assert_true(a.unc[it * DPREC_RELEASE_UNCERTAINTY_WIDTH] > 0); /* its noise, published */
    }
    assert_true(b.unc[2] != 255);
    assert_true(differ > M / 2);
    /* a job that corrects another's biases (base_job) keeps its column's measured spread: it carries the start's
     * uncertainty, which the devices still shrink by */
    agg_job based = on;
    based.base_job = 7;
    agg_model c;
    dprec_rng r4;
    assert_int_equal(dprec_rng_init(&r4, NULL, (const unsigned char *)"count", 5, "test"), DPREC_OK);
    assert_int_equal(agg_dpals_step(&based, &prev, reps, U, &r4, 1, &c, err, sizeof err), 0);
    assert_memory_equal(c.bias, a.bias, sizeof(float) * M); /* the same solve */
    assert_true(c.unc[2] != 255);
    dprec_rng_free(&r4);
    agg_model_free(&c);
    free(stats);
    dprec_rng_free(&r1);
    dprec_rng_free(&r2);
    dprec_rng_free(&r3);
    agg_model_free(&prev);
    agg_model_free(&a);
    agg_model_free(&b);
}

/* The projected solve: a noisy Gram matrix of any sign gives (P(G) + lambda I)^-1 h, finite, never a failure;
 * PSD inputs are solved exactly; non-finite entries count as 0. */
static void test_dpals_solve_projects_and_never_fails(void **state) {
    (void)state;
    /* G = Q diag(e) Q^T with Q a rotation in the (0, 1) plane, e = (-50, 3, -1e6) */
    const double c = cos(0.7), sn = sin(0.7), e[3] = {-50.0, 3.0, -1e6}, lam = 2.0, h[3] = {1.0, -2.0, 0.5};
    double q[9] = {c, -sn, 0, sn, c, 0, 0, 0, 1}, g[9], s[3];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            g[a * 3 + b] = 0;
            for (int k = 0; k < 3; k++) g[a * 3 + b] += q[a * 3 + k] * e[k] * q[b * 3 + k];
        }
    assert_int_equal(agg_dpals_solve(g, h, 3, lam, 0.0, s), 0);
    for (int a = 0; a < 3; a++) {
        double want = 0;
        for (int k = 0; k < 3; k++) {
            double qh = q[0 * 3 + k] * h[0] + q[1 * 3 + k] * h[1] + q[2 * 3 + k] * h[2];
            want += q[a * 3 + k] * qh / ((e[k] > 0 ? e[k] : 0) + lam);
        }
        assert_true(fabs(s[a] - want) < 1e-9);
    }
    /* a PSD G: the plain ridge solution, checked by its residual */
    double g2[4] = {4, 1, 1, 3}, g2c[4] = {4, 1, 1, 3}, h2[2] = {1, 2}, s2[2];
    assert_int_equal(agg_dpals_solve(g2c, h2, 2, 0.5, 0.0, s2), 0);
    assert_true(fabs((g2[0] + 0.5) * s2[0] + g2[1] * s2[1] - h2[0]) < 1e-12);
    assert_true(fabs(g2[2] * s2[0] + (g2[3] + 0.5) * s2[1] - h2[1]) < 1e-12);
    /* random noise-only systems, huge and of either sign, and NaN/Inf entries: always a finite answer */
    uint64_t st = 3;
    for (int t = 0; t < 500; t++) {
        double g3[D * D], h3[D], s3[D];
        for (int a = 0; a < D; a++) {
            h3[a] = 1e3 * (2 * unif(&st) - 1);
            for (int b = a; b < D; b++) g3[a * D + b] = g3[b * D + a] = 1e6 * (2 * unif(&st) - 1);
        }
        if (t % 50 == 0) g3[1] = g3[D] = NAN;
        if (t % 70 == 0) g3[0] = INFINITY;
        assert_int_equal(agg_dpals_solve(g3, h3, D, 1.0, t % 2 ? 0.0 : 1e4, s3), 0);
        for (int a = 0; a < D; a++) assert_true(isfinite(s3[a]) && fabs(s3[a]) <= 2e3);
    }
    assert_int_equal(agg_dpals_solve(g2, h2, 2, 0.0, 0.0, s2), -1); /* lambda must be > 0 */
    assert_int_equal(agg_dpals_solve(g2, h2, 2, 1.0, -1.0, s2), -1); /* and kappa >= 0 */
}

/* The Gram matrix a round solves is symmetric: only its upper triangle is noised and the lower mirrors it
 * (agg_dpals_unpack, which the step uses), with each block scaled back from its normalization. */
static void test_dpals_noisy_gram_is_symmetric(void **state) {
    (void)state;
    double row[CW];
    uint64_t st = 9;
    for (uint32_t c = 0; c < CW; c++) row[c] = 100 * (2 * unif(&st) - 1);
    double g[D * D], h[D];
    agg_dpals_unpack(row, D, 2.0, 3.0, g, h);
    for (uint32_t a = 0; a < D; a++) {
        for (uint32_t b = 0; b < D; b++) assert_true(g[a * D + b] == g[b * D + a]);
    }
    /* the upper triangle row by row, then h, each scaled */
    assert_true(g[0 * D + 1] == row[1] * 2.0 && g[1 * D + 1] == row[D] * 2.0 && h[0] == row[D * (D + 1) / 2] * 3.0);
}

/* With epsilon = infinity (no noise), every clip loose (||w|| <= sqrt(3) < 2, |t| <= 2) and k at least every user's
 * ratings, a dpals round is, up to its sum's fixed-point grid (2^-28 here: clips near the data keep the statistics
 * far above it; docs/notes/streaming-sums.md), the item half of ALS with biases on the same data: [f_j; b_j] = (sum x x^T + lambda I)^-1 sum t x. */
/* Without noise, each item's solve against the normal equations solved directly. With residual targets
 * (params.residual) the solve is the correction of the release's m_j = [f_j; b_j]: s = m_j + (G + lambda I)^-1 h',
 * h' the sums of the residual targets t' x; since t' = t - x . m_j gives h' = h - G m_j, that is the ridge
 * regression toward the release, (G + lambda I)^-1 (h + lambda m_j). */
static void check_exact_als(int residual, const char *gram_weight, int reweight) {
    enum { U = 60 };
    char params[256];
    snprintf(params, sizeof params,
             "{\"max_items\":30,\"u_clip\":2,\"bias_scale\":1,\"rating_clip\":2,\"lambda\":0.7,"
             "\"noise_multiplier\":1,\"gram_weight\":%s%s,\"reweight\":%s}",
             gram_weight, residual ? ",\"residual\":true" : "", reweight ? "true" : "false");
    agg_job j = make_job(params, M, D, 100, 1e-6, 10, 1.0);
    uint64_t s = 17;
    static float w[U][D], t[U][M];
    static uint32_t items[U][M], n[U];
    static unsigned char p[U][8 + 4 * (D - 1) + 8 * 30];
    agg_report reps[U];
    for (int i = 0; i < U; i++) {
        for (int a = 0; a + 1 < D; a++) w[i][a] = (float)(2 * unif(&s) - 1);
        n[i] = 0;
        for (uint32_t it = 0; it < M && n[i] < 30; it++)
            if (unif(&s) < 0.5) {
                items[i][n[i]] = it;
                t[i][n[i]] = (float)(4 * unif(&s) - 2);
                n[i]++;
            }
        reps[i].device = i + 1;
        reps[i].payload = p[i];
        reps[i].payload_len = payload(D, 30, w[i], items[i], t[i], n[i], p[i]);
    }
    agg_model prev, next;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_dpals.initial_model(&j, &prev, err, sizeof err), 0);
    for (uint32_t it = 0; it < M; it++) prev.bias[it] = (float)(2 * unif(&s) - 1); /* a release with biases */
    assert_int_equal(agg_dpals_step(&j, &prev, reps, U, NULL, 0, &next, err, sizeof err), 0);
    /* the reference: normal equations per item, solved by Gaussian elimination with partial pivoting */
    double worst = 0;
    for (uint32_t it = 0; it < M; it++) {
        double A[D][D + 1];
        memset(A, 0, sizeof A);
        for (int a = 0; a < D; a++) A[a][a] = 0.7;

        for (int i = 0; i < U; i++)
            for (uint32_t r = 0; r < n[i]; r++) {
                if (items[i][r] != it) continue;
                /* reweighted: user i's terms weigh sqrt(k / n_i) (k = 30) */
                const double om = reweight && n[i] < 30 ? sqrt(30.0 / n[i]) : 1.0;
                double x[D];
                for (int a = 0; a + 1 < D; a++) x[a] = w[i][a];
                x[D - 1] = 1.0;
                for (int a = 0; a < D; a++) {
                    for (int b = 0; b < D; b++) A[a][b] += om * x[a] * x[b];
                    A[a][D] += om * (double)t[i][r] * x[a];
                }
            }
        for (int col = 0; col < D; col++) {
            int piv = col;
            for (int r = col + 1; r < D; r++)
                if (fabs(A[r][col]) > fabs(A[piv][col])) piv = r;
            for (int b = 0; b <= D; b++) {
                double tmp = A[col][b];
                A[col][b] = A[piv][b];
                A[piv][b] = tmp;
            }
            for (int r = 0; r < D; r++) {
                if (r == col) continue;
                double f = A[r][col] / A[col][col];
                for (int b = col; b <= D; b++) A[r][b] -= f * A[col][b];
            }
        }
        double sol[D];
        for (int a = 0; a < D; a++) sol[a] = A[a][D] / A[a][a];
        if (residual) { /* + m_j: the correction is added to the release's coefficients */
            for (int a = 0; a + 1 < D; a++) sol[a] += (double)prev.v[it * D + a + 1];
            sol[D - 1] += (double)prev.bias[it];
        }
        assert_true(next.v[it * D] == 1.0f);
        for (int a = 1; a < D; a++) {
            double dlt = fabs((double)next.v[it * D + a] - sol[a - 1]);
            if (dlt > worst) worst = dlt;
        }
        double db = fabs((double)next.bias[it] - sol[D - 1]);
        if (db > worst) worst = db;
    }
    assert_true(worst < 1e-5); /* float32 releases */
    agg_model_free(&prev);
    agg_model_free(&next);
}

/* The uncertainty of a solve (agg_dpals_solve_unc, docs/privacy.md "Release uncertainty"), in units of tau^2: for
 * one coefficient the conjugate posterior (lambda g + kappa) / (g^2 + lambda g + kappa), the same without noise
 * lambda / (g + lambda), the attenuation g^2 / (g^2 + lambda g + kappa) and the noise f^2 (lambda g + kappa); a
 * direction nobody rated keeps its prior; in d dimensions each coefficient's share of the directions', summing to the
 * directions' own. The solution itself is agg_dpals_solve's. */
static void test_dpals_uncertainty_is_the_solves_posterior(void **state) {
    (void)state;
    const double lam = 5.0, kappas[3] = {0.0, 40.0, 1e4}, gs[4] = {-3.0, 0.0, 2.0, 300.0};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) {
            double g = gs[i], h = 7.0, s1, s2, kap = kappas[k];
            agg_dpals_unc u;
            double gg = g;
            assert_int_equal(agg_dpals_solve_unc(&gg, &h, 1, lam, kap, &s1, &u), 0);
            gg = g;
            assert_int_equal(agg_dpals_solve(&gg, &h, 1, lam, kap, &s2), 0);
            assert_true(s1 == s2);
            double gv = g > 0 ? g : 0, den = gv * gv + lam * gv + kap, f = kap > 0 ? gv / den : 1.0 / (gv + lam);
            double post = kap > 0 ? (lam * gv + kap) / den : lam / (gv + lam);
            assert_true(fabs(u.post[0] - post) < 1e-12);
            assert_true(fabs(u.post0[0] - lam / (gv + lam)) < 1e-12);
            assert_true(fabs(u.att[0] - f * gv) < 1e-12);
            assert_true(fabs(u.noise[0] - f * f * (lam * gv + kap)) < 1e-12);
            assert_true(fabs(u.carry2[0] - (1 - f * gv) * (1 - f * gv)) < 1e-12);
            assert_true(u.post[0] >= u.post0[0] - 1e-15 && u.post[0] <= 1.0 + 1e-15); /* noise only widens it */
            if (gv == 0) assert_true(u.post[0] == 1.0 && u.att[0] == 0.0 && u.carry2[0] == 1.0); /* nothing learned */
        }
    /* d = 3 without noise: the coefficients' posteriors sum to the trace of lambda (G + lambda I)^-1 (the directions'
     * lambda / (g + lambda), by orthogonality), computed here by cofactors */
    double g[9] = {4, 1, 0, 1, 3, 0.5, 0, 0.5, 2}, h[3] = {1, -1, 2}, s[3];
    agg_dpals_unc u;
    assert_int_equal(agg_dpals_solve_unc(g, h, 3, lam, 0.0, s, &u), 0);
    double A[3][3] = {{4 + lam, 1, 0}, {1, 3 + lam, 0.5}, {0, 0.5, 2 + lam}};
    double det = A[0][0] * (A[1][1] * A[2][2] - A[1][2] * A[2][1]) - A[0][1] * (A[1][0] * A[2][2] - A[1][2] * A[2][0]) +
                 A[0][2] * (A[1][0] * A[2][1] - A[1][1] * A[2][0]);
    double cof = (A[1][1] * A[2][2] - A[1][2] * A[2][1]) + (A[0][0] * A[2][2] - A[0][2] * A[2][0]) +
                 (A[0][0] * A[1][1] - A[0][1] * A[1][0]);
    double tr = 0.0;
    for (int a = 0; a < 3; a++) {
        assert_true(u.post[a] > 0.0 && u.post[a] < 1.0 && fabs(u.post[a] - u.post0[a]) < 1e-12);
        tr += u.post[a];
    }
    assert_true(fabs(tr - lam * cof / det) < 1e-9);
}

/* A job that asks for its items' uncertainty releases the same values as one that does not (the column is computed
 * beside them), with the column: flag PINNED0; release 1's biases without noise and its random factors noise with
 * no gain; after a round from it, each value's gain and noise as the solve's gain and data noise say (residual: the
 * factors' initial noise carried through 1 - f g), one spread for the release. */
static void test_dpals_uncertainty_leaves_the_released_values_as_they_are(void **state) {
    (void)state;
    enum { U = 40 };
    const char *params = "{\"max_items\":12,\"noise_multiplier\":1,\"prior_sd\":0.5,\"residual\":true}";
    agg_job j = make_job(params, M, D, 100, 1e-6, 10, 1.0), ju = j;
    ju.release_uncertainty = 1;
    uint64_t st = 5;
    static unsigned char p[U][PMAX];
    agg_report reps[U];
    random_reports(&st, U, p, reps);
    agg_model prev, prevu, a, b;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_dpals.initial_model(&j, &prev, err, sizeof err), 0);
    assert_int_equal(agg_protocol_dpals.initial_model(&ju, &prevu, err, sizeof err), 0);
    assert_null(prev.unc);
    assert_non_null(prevu.unc);
    for (uint32_t it = 0; it < M * DPREC_RELEASE_UNCERTAINTY_WIDTH; it += DPREC_RELEASE_UNCERTAINTY_WIDTH) {
        assert_true(prevu.unc[it] == 0 && prevu.unc[it + 1] == 0);               /* release 1's biases: 0, no noise */
        assert_int_equal(prevu.unc[it + 3], dprec_uncertainty_code(0.1 / sqrt(3.0))); /* its factors: U(-0.1, 0.1) */
        assert_int_equal(prevu.unc[it + 4], 0);                                  /* with nothing of the items */
    }
    assert_int_equal(agg_dpals_step(&j, &prev, reps, U, NULL, 0, &a, err, sizeof err), 0);
    assert_int_equal(agg_dpals_step(&ju, &prevu, reps, U, NULL, 0, &b, err, sizeof err), 0);
    assert_memory_equal(a.v, b.v, sizeof(float) * M * D);
    assert_memory_equal(a.bias, b.bias, sizeof(float) * M);
    assert_null(a.unc);
    assert_non_null(b.unc);
    assert_int_equal(b.unc_flags, DPREC_RELEASE_UNC_PINNED0);
    for (uint32_t it = 0; it < M; it++) {
        const unsigned char *c = b.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        assert_true(c[0] > 0 && c[3] > 0);                 /* the ratings' noise, at least (lambda > 0) */
        assert_true(c[1] < 255 && c[4] < 255);             /* a gain below 1 */
        assert_true(c[2] == b.unc[2] && c[5] == b.unc[5]); /* one spread for the release */
    }
    agg_model_free(&prev);
    agg_model_free(&prevu);
    agg_model_free(&a);
    agg_model_free(&b);
}

static void test_dpals_without_noise_equals_exact_als(void **state) {
    (void)state;
    check_exact_als(0, "1", 0);
    check_exact_als(0, "0.5", 0); /* the Gram statistics' weight is undone before the solve */
    check_exact_als(0, "3", 0);
}

/* With reweighting (the default), the noiseless round is exactly the weighted ridge ALS item step, user i's terms
 * weighing sqrt(k / n_i): most of the 60 users here report fewer than k = 30 ratings. */
static void test_dpals_reweighted_without_noise_equals_weighted_als(void **state) {
    (void)state;
    check_exact_als(0, "1", 1);
    check_exact_als(0, "0.5", 1);
    check_exact_als(1, "0.5", 1);
}

static void test_dpals_residual_without_noise_equals_ridge_toward_the_release(void **state) {
    (void)state;
    check_exact_als(1, "1", 0);
    check_exact_als(1, "0.5", 0);
}

/* params.factors false is the private bias model at the job's d (the base of another protocol's job at that d): the
 * same statistics, noise and item biases as the d = 1 job on the same ratings, whatever w the reports carry, and a
 * release whose factor columns stay 0 (column 0 pinned to 1). */
static void check_bias_model_at_d(int residual) {
    enum { U = 60 };
    char pd[256], p1[256];
    snprintf(pd, sizeof pd, "{\"max_items\":30,\"noise_multiplier\":2,\"lambda\":0.7,\"factors\":false%s}",
             residual ? ",\"residual\":true" : "");
    snprintf(p1, sizeof p1, "{\"max_items\":30,\"noise_multiplier\":2,\"lambda\":0.7%s}", residual ? ",\"residual\":true" : "");
    agg_job jd = make_job(pd, M, D, 100, 1e-6, 10, 1.0), j1 = make_job(p1, M, 1, 100, 1e-6, 10, 1.0);
    uint64_t s = 29;
    static float w[U][D], t[U][M];
    static uint32_t items[U][M], n[U];
    static unsigned char bd[U][8 + 4 * (D - 1) + 8 * 30], b1[U][8 + 8 * 30];
    agg_report rd[U], r1[U];
    for (int i = 0; i < U; i++) {
        for (int a = 0; a + 1 < D; a++) w[i][a] = (float)(3 * (2 * unif(&s) - 1)); /* ignored: no factors */
        n[i] = 0;
        for (uint32_t it = 0; it < M && n[i] < 30; it++)
            if (unif(&s) < 0.4) {
                items[i][n[i]] = it;
                t[i][n[i]] = (float)(3 * unif(&s) - 1.5); /* some past the default clamp of 1 */
                n[i]++;
            }
        rd[i] = (agg_report){.device = (uint64_t)i + 1, .payload = bd[i], .payload_len = payload(D, 30, w[i], items[i], t[i], n[i], bd[i])};
        r1[i] = (agg_report){.device = (uint64_t)i + 1, .payload = b1[i], .payload_len = payload(1, 30, NULL, items[i], t[i], n[i], b1[i])};
    }
    char err[AGG_ERRMSG];
    double zd, sd, sgd, z1, s1, sg1;
    assert_int_equal(agg_dpals_noise_scale(&jd, &zd, &sd, &sgd), 0);
    assert_int_equal(agg_dpals_noise_scale(&j1, &z1, &s1, &sg1), 0);
    assert_true(zd == z1 && sd == s1 && sgd == sg1); /* the same noise on the same statistics */
    agg_model prevd, prev1, nextd, next1;
    assert_int_equal(agg_protocol_dpals.initial_model(&jd, &prevd, err, sizeof err), 0);
    assert_int_equal(agg_protocol_dpals.initial_model(&j1, &prev1, err, sizeof err), 0);
    for (uint32_t it = 0; it < M; it++) {
        assert_true(prevd.v[it * D] == 1.0f);
        for (uint32_t a = 1; a < D; a++) assert_true(prevd.v[it * D + a] == 0.0f);
        prevd.bias[it] = prev1.bias[it] = (float)(2 * unif(&s) - 1); /* a release with biases (the residual's prior) */
    }
    assert_int_equal(agg_dpals_step(&jd, &prevd, rd, U, NULL, 0, &nextd, err, sizeof err), 0);
    assert_int_equal(agg_dpals_step(&j1, &prev1, r1, U, NULL, 0, &next1, err, sizeof err), 0);
    double moved = 0;
    for (uint32_t it = 0; it < M; it++) {
        assert_true(nextd.bias[it] == next1.bias[it]);
        moved += fabs((double)next1.bias[it] - (double)prev1.bias[it]);
        assert_true(nextd.v[it * D] == 1.0f);
        for (uint32_t a = 1; a < D; a++) assert_true(nextd.v[it * D + a] == 0.0f);
    }
    assert_true(moved > 0.1); /* the step learned something: the equality is not of two untouched releases */
    agg_model_free(&prevd);
    agg_model_free(&prev1);
    agg_model_free(&nextd);
    agg_model_free(&next1);
    /* the statistics themselves: one row of d = 1 coordinates per item, identical */
    double *std = NULL, *st1 = NULL;
    assert_int_equal(agg_dpals_stats(&jd, rd, U, NULL, 0, &std, err, sizeof err), 0);
    assert_int_equal(agg_dpals_stats(&j1, r1, U, NULL, 0, &st1, err, sizeof err), 0);
    for (uint32_t c = 0; c < M * dprec_dpals_item_coords(1); c++) assert_true(std[c] == st1[c]);
    free(std);
    free(st1);
}

static void test_dpals_bias_model_at_any_d_equals_d1(void **state) {
    (void)state;
    check_bias_model_at_d(0);
    check_bias_model_at_d(1);
}

/* A start's factors kept (base_factors with params.factors false): the bias model's statistics correct the item biases
 * alone, noised like the bias model's, and every factor column, with its part of the uncertainty column, is the
 * previous release's bit for bit; the biases equal those of the same job without the factors (the statistics are
 * d = 1's either way). */
static void test_dpals_a_start_keeps_its_factors_when_only_the_biases_are_corrected(void **state) {
    (void)state;
    enum { U = 40 };
    const char *params = "{\"max_items\":12,\"noise_multiplier\":1,\"factors\":false,\"residual\":true}";
    agg_job j = make_job(params, M, D, 100, 1e-6, 10, 1.0), jb = j;
    j.base_factors = 1;
    j.release_uncertainty = jb.release_uncertainty = 1;
    char err[AGG_ERRMSG];
    agg_model prev, prevb;
    assert_int_equal(agg_protocol_dpals.initial_model(&jb, &prev, err, sizeof err), 0);
    assert_int_equal(agg_protocol_dpals.initial_model(&jb, &prevb, err, sizeof err), 0);
    uint64_t st = 11;
    for (uint32_t it = 0; it < M; it++) { /* a start: factors, biases and a column (the factors' part its own) */
        for (uint32_t a = 1; a < D; a++) prev.v[it * D + a] = (float)(2 * unif(&st) - 1);
        prev.bias[it] = prevb.bias[it] = (float)(unif(&st) - 0.5);
        unsigned char *u = prev.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[3] = (unsigned char)(1 + it), u[4] = (unsigned char)(200 + it % 50), u[5] = 7;
    }
    static unsigned char p[U][PMAX];
    agg_report reps[U];
    random_reports(&st, U, p, reps);
    for (int noisy = 0; noisy < 2; noisy++) {
        agg_model next, nextb;
        dprec_rng r1, r2;
        assert_int_equal(dprec_rng_init(&r1, NULL, (const unsigned char *)"kept-factors", 12, "test"), DPREC_OK);
        assert_int_equal(dprec_rng_init(&r2, NULL, (const unsigned char *)"kept-factors", 12, "test"), DPREC_OK);
        assert_int_equal(agg_dpals_step(&j, &prev, reps, U, noisy ? &r1 : NULL, noisy, &next, err, sizeof err), 0);
        assert_int_equal(agg_dpals_step(&jb, &prevb, reps, U, noisy ? &r2 : NULL, noisy, &nextb, err, sizeof err), 0);
        double moved = 0;
        for (uint32_t it = 0; it < M; it++) {
            assert_true(next.v[it * D] == 1.0f);
            for (uint32_t a = 1; a < D; a++) assert_true(next.v[it * D + a] == prev.v[it * D + a]); /* kept */
            for (uint32_t a = 1; a < D; a++) assert_true(nextb.v[it * D + a] == 0.0f);              /* the bias model */
            assert_true(next.bias[it] == nextb.bias[it]);
            moved += fabs((double)next.bias[it] - (double)prev.bias[it]);
            const unsigned char *u = next.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
            const unsigned char *ub = nextb.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
            assert_memory_equal(u + 3, prev.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH + 3, 3); /* the start's */
            assert_memory_equal(u, ub, 3); /* the biases' part: the bias model's */
        }
        assert_true(moved > 0.01); /* the biases were corrected */
        agg_model_free(&next);
        agg_model_free(&nextb);
    }
    agg_model_free(&prev);
    agg_model_free(&prevb);
    /* without residual targets the kept factors would not enter the targets: refused */
    const char *bp = "{\"max_items\":12,\"factors\":false,\"residual\":false}";
    agg_job bad = make_job(bp, M, D, 1, 1e-6, 3, 1.0);
    cJSON *bj = cJSON_Parse(bp);
    assert_int_equal(agg_protocol_dpals.validate_job(&bad, bj, err, sizeof err), 0); /* the bias model: fine */
    bad.base_factors = 1;
    assert_int_not_equal(agg_protocol_dpals.validate_job(&bad, bj, err, sizeof err), 0);
    assert_non_null(strstr(err, "residual"));
    cJSON_Delete(bj);
}

/* A job built on another that corrects biases alone takes each item's prior from the corrected release's column
 * (item_prior_sd): without noise the correction is h / (g + lambda (prior_sd / tau_j)^2), tau_j^2 = (1 - a)^2 T^2 + N
 * over bias_scale^2, so of two items with the same statistics the one the start measured well (a near 1, N small) is
 * corrected less, one the start never saw (a = 0) by the job's prior (tau_j capped at prior_sd); a column without a
 * measured spread, or a job without a base, leaves every item the job's prior. */
static void test_dpals_a_start_s_column_is_each_correction_s_prior(void **state) {
    (void)state;
    enum { U = 30 };
    const char *params = "{\"max_items\":12,\"factors\":false,\"residual\":true,\"lambda\":5,\"prior_sd\":0.5}";
    agg_job j = make_job(params, M, D, 100, 1e-6, 10, 1.0), nobase = j;
    j.base_job = 7;
    j.base_factors = 1;
    j.release_uncertainty = nobase.release_uncertainty = 1;
    char err[AGG_ERRMSG];
    agg_model prev;
    assert_int_equal(agg_protocol_dpals.initial_model(&nobase, &prev, err, sizeof err), 0);
    for (uint32_t it = 0; it < M; it++) {
        unsigned char *u = prev.unc + it * DPREC_RELEASE_UNCERTAINTY_WIDTH;
        u[0] = dprec_uncertainty_code(0.05); /* noise sd 0.05 */
        u[1] = dprec_uncertainty_gain_code(it == 0 ? 1.0 : 0.0); /* item 0 measured, the others never seen */
        u[2] = dprec_uncertainty_code(1.0); /* the items' spread: an unseen item's tau_j is past prior_sd, capped */
    }
    /* every device rates items 0 and 1 alike: the two items have the same statistics */
    static unsigned char p[U][PMAX];
    agg_report reps[U];
    for (int i = 0; i < U; i++) {
        float w[D] = {0}, t[2] = {0.6f, 0.6f};
        uint32_t items[2] = {0, 1};
        reps[i] = (agg_report){.device = (uint64_t)i + 1, .payload = p[i], .payload_len = payload(D, K, w, items, t, 2, p[i])};
    }
    agg_model next, plainnext;
    assert_int_equal(agg_dpals_step(&j, &prev, reps, U, NULL, 0, &next, err, sizeof err), 0);
    assert_int_equal(agg_dpals_step(&nobase, &prev, reps, U, NULL, 0, &plainnext, err, sizeof err), 0);
    const double c0 = (double)next.bias[0] - (double)prev.bias[0], c1 = (double)next.bias[1] - (double)prev.bias[1];
    const double p0 = (double)plainnext.bias[0] - (double)prev.bias[0], p1 = (double)plainnext.bias[1] - (double)prev.bias[1];
    assert_true(c1 > 0.0 && c0 > 0.0);
    assert_true(c0 < 0.5 * c1);        /* the measured item is corrected less */
    assert_true(fabs(p0 - p1) < 1e-6); /* without a base: one prior, the same correction */
    assert_true(fabs(c1 - p1) < 1e-6); /* the unseen item: the job's prior (capped) */
    /* a column without a measured spread (code 0): every item the job's prior */
    for (uint32_t it = 0; it < M; it++) prev.unc[it * DPREC_RELEASE_UNCERTAINTY_WIDTH + 2] = 0;
    agg_model_free(&next);
    assert_int_equal(agg_dpals_step(&j, &prev, reps, U, NULL, 0, &next, err, sizeof err), 0);
    assert_true(next.bias[0] == plainnext.bias[0] && next.bias[1] == plainnext.bias[1]);
    agg_model_free(&next);
    agg_model_free(&plainnext);
    agg_model_free(&prev);
}

/* Every report carries exactly max_items pairs, real ones first (items increasing, below m), then padding:
 * any other shape is refused, and padding adds nothing. */
static void test_dpals_reports_are_padded_and_padding_adds_nothing(void **state) {
    (void)state;
    agg_job j = make_job("{\"max_items\":12,\"noise_multiplier\":1}", M, D, 100, 1e-6, 10, 1.0);
    char err[AGG_ERRMSG];
    float w[D - 1] = {0.1f, -0.2f, 0.3f}, t[3] = {1.0f, -0.5f, 0.25f};
    uint32_t items[3] = {2, 7, 29};
    unsigned char p[PMAX + 16];
    size_t len = payload(D, K, w, items, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), 0);
    double s1[M * CW] = {0};
    assert_int_equal(agg_dpals_accumulate(&j, p, len, s1), 0);
    for (uint32_t it = 0; it < M; it++) {
        int rated = it == 2 || it == 7 || it == 29;
        double e = 0;
        for (uint32_t c = 0; c < CW; c++) e += fabs(s1[it * CW + c]);
        assert_true(rated ? e > 0 : e == 0);
    }
    /* unpadded (3 pairs), a wrong k, a wrong d, a pair after the padding, a padding pair with bits, items out of
     * order or past m, a non-finite w or target: refused */
    size_t l3 = payload(D, 3, w, items, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, l3, err, sizeof err), -1);
    len = payload(D, K, w, items, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len - 8, err, sizeof err), -1);
    dprec_st32(p, D + 1);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    unsigned char *pairs = p + 8 + 4 * (D - 1);
    len = payload(D, K, w, items, t, 3, p);
    dprec_st32(pairs + 8 * 5, 11); /* a real pair after padding began */
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    len = payload(D, K, w, items, t, 3, p);
    dprec_stf32(pairs + 8 * 5 + 4, 1.0f); /* a padding pair that carries a value */
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    uint32_t bad[3] = {7, 2, 29}, past[3] = {2, 7, M};
    len = payload(D, K, w, bad, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    len = payload(D, K, w, past, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    float wn[D - 1] = {0.1f, NAN, 0.3f}, tn[3] = {1.0f, INFINITY, 0.0f};
    len = payload(D, K, wn, items, t, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    len = payload(D, K, w, items, tn, 3, p);
    assert_int_equal(agg_protocol_dpals.validate_payload(&j, p, len, err, sizeof err), -1);
    double s2[M * CW] = {0};
    assert_int_equal(agg_dpals_accumulate(&j, p, len, s2), -1); /* and accumulate refuses it as well */
}

static int validate(const char *params, uint32_t m, uint32_t d, int has_budget, double eps, char *err, size_t cap) {
    agg_job j = make_job(params, m, d, eps, 1e-6, 10, 1.0);
    j.has_budget = has_budget;
    cJSON *pj = cJSON_Parse(params);
    assert_non_null(pj);
    int rc = agg_protocol_dpals.validate_job(&j, pj, err, cap);
    cJSON_Delete(pj);
    return rc;
}

static void test_dpals_job_validation_refuses_bad_params(void **state) {
    (void)state;
    char err[AGG_ERRMSG];
    assert_int_equal(validate("{}", 100, 8, 1, 1.0, err, sizeof err), 0);
    assert_int_equal(validate("{\"gram_weight\":16}", 100, 8, 1, 1.0, err, sizeof err), 0);
    assert_int_equal(validate("{\"reweight\":false}", 100, 8, 1, 1.0, err, sizeof err), 0);
    assert_int_equal(validate("{\"factors\":false}", 100, 8, 1, 1.0, err, sizeof err), 0);
    assert_int_equal(validate("{\"count_posterior\":false}", 100, 8, 1, 1.0, err, sizeof err), 0);
    assert_int_equal(validate("{\"aggregation\":\"secure\"}", 100, 8, 1, 1.0, err, sizeof err), 0);
    /* the bias model at d > 1 with secure aggregation: the devices' secure report carries the statistics at d */
    assert_int_equal(validate("{\"factors\":false,\"aggregation\":\"secure\"}", 100, 8, 1, 1.0, err, sizeof err), -1);
    assert_non_null(strstr(err, "factors"));
    assert_int_equal(validate("{}", 100, 0, 1, 1.0, err, sizeof err), -1);
    assert_int_equal(validate("{}", 100, 65, 1, 1.0, err, sizeof err), -1);
    assert_int_equal(validate("{}", 100, 8, 0, 1.0, err, sizeof err), -1); /* no budget */
    assert_non_null(strstr(err, "budget"));
    const char *bad[] = {"{\"max_items\":0}", "{\"max_items\":1.5}", "{\"max_items\":70000}", "{\"u_clip\":0}",
                         "{\"rating_clip\":-1}", "{\"lambda\":0}", "{\"mu\":9}", "{\"noise_multiplier\":0}",
                         "{\"what\":1}", "{\"u_clip\":\"big\"}", "{\"residual\":1}", "{\"bias_scale\":0}",
                         "{\"gram_weight\":0}", "{\"gram_weight\":17}", "{\"gram_weight\":-1}", "{\"reweight\":1}",
                         "{\"reweight\":\"yes\"}", "{\"factors\":0}", "{\"factors\":\"no\"}",
                         "{\"count_posterior\":1}", "{\"count_posterior\":\"on\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(validate(bad[i], 100, 8, 1, 1.0, err, sizeof err), -1);
    /* a budget no multiplier up to 1e6 fits */
    assert_int_equal(validate("{}", 100, 8, 1, 1e-9, err, sizeof err), -1);
    assert_non_null(strstr(err, "noise multiplier"));
    /* the grid allowance: sqrt(m (d (d+1)/2 + d)) z 2^-19 >= 1 is refused, never run with less noise */
    assert_int_equal(validate("{\"noise_multiplier\":100000}", 100000, 8, 1, 1.0, err, sizeof err), -1);
    assert_non_null(strstr(err, "grid"));
}

/* The shared clipping (common/protocols/dpals.c): x = [s w; 1] with ||s w|| < Gamma_u, non-finite w gives [0; 1], targets
 * clamped, NaN to 0. */
static void test_dpals_features_and_clamp(void **state) {
    (void)state;
    float w[3] = {3.0f, 4.0f, 0.0f};
    double x[4];
    dprec_dpals_features(w, 4, 1.0, x);
    assert_true(x[3] == 1.0 && sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) < 1.0);
    assert_true(fabs(x[0] - 0.6) < 1e-9 && fabs(x[1] - 0.8) < 1e-9);
    float small[3] = {0.1f, 0.0f, 0.0f};
    dprec_dpals_features(small, 4, 1.0, x);
    assert_true(x[0] == (double)0.1f);
    float inf[3] = {INFINITY, 1.0f, 0.0f};
    dprec_dpals_features(inf, 4, 1.0, x);
    assert_true(x[0] == 0.0 && x[1] == 0.0 && x[3] == 1.0);
    dprec_dpals_features(NULL, 1, 1.0, x);
    assert_true(x[0] == 1.0);
    assert_true(dprec_dpals_clamp(5.0, 2.0) == 2.0 && dprec_dpals_clamp(-5.0, 2.0) == -2.0);
    assert_true(dprec_dpals_clamp(NAN, 2.0) == 0.0 && dprec_dpals_clamp(0.5, 2.0) == 0.5);
    assert_true(dprec_dpals_x2(1, 3.0, 1.0) == 1.0 && dprec_dpals_x2(5, 3.0, 1.0) == 10.0 && dprec_dpals_x2(5, 3.0, 0.5) == 9.25);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dpals_one_user_moves_the_statistics_by_at_most_sqrt_2k),
        cmocka_unit_test(test_dpals_noise_scale_equals_the_accountant_inversion),
        cmocka_unit_test(test_dpals_step_adds_the_published_noise),
        cmocka_unit_test(test_dpals_posterior_filter_shrinks_what_the_noise_hides),
        cmocka_unit_test(test_dpals_count_posterior_is_the_plug_in_solve_for_a_measured_count),
        cmocka_unit_test(test_dpals_count_posterior_beats_the_plug_in_where_counts_are_noise),
        cmocka_unit_test(test_dpals_count_posterior_releases_each_item_s_posterior_mean),
        cmocka_unit_test(test_dpals_solve_projects_and_never_fails),
        cmocka_unit_test(test_dpals_uncertainty_is_the_solves_posterior),
        cmocka_unit_test(test_dpals_uncertainty_leaves_the_released_values_as_they_are),
        cmocka_unit_test(test_dpals_noisy_gram_is_symmetric),
        cmocka_unit_test(test_dpals_without_noise_equals_exact_als),
        cmocka_unit_test(test_dpals_reweighted_without_noise_equals_weighted_als),
        cmocka_unit_test(test_dpals_residual_without_noise_equals_ridge_toward_the_release),
        cmocka_unit_test(test_dpals_bias_model_at_any_d_equals_d1),
        cmocka_unit_test(test_dpals_a_start_keeps_its_factors_when_only_the_biases_are_corrected),
        cmocka_unit_test(test_dpals_a_start_s_column_is_each_correction_s_prior),
        cmocka_unit_test(test_dpals_reports_are_padded_and_padding_adds_nothing),
        cmocka_unit_test(test_dpals_job_validation_refuses_bad_params),
        cmocka_unit_test(test_dpals_features_and_clamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
