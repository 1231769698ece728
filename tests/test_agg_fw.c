/* Tests for the private-fw protocol (seed 002): common/protocols/fw.c (the device's local Frank-Wolfe step) and
 * aggregator/protocols/fw.c (symmetric noise, dense and Oja eigen-solvers, the global step, the accounting). */
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
#include "protocols/agg_protocol.h"
#include "fw.h"
#include "noise.h"

/* splitmix64: deterministic test data (not privacy noise) */
static uint64_t sm(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (double)(sm(s) >> 11) / 9007199254740992.0; }

/* A job over m items whose subset is the first nsub items. */
static char params_buf[2048];
static agg_job make_job(uint32_t m, uint32_t nsub, uint32_t d, int64_t rounds, double k, double L, uint32_t xi,
                        const char *variant) {
    char bitmap[1024] = "";
    for (uint32_t b = 0; b < (m + 7) / 8; b++) {
        unsigned byte = 0;
        for (uint32_t j = 8 * b; j < 8 * b + 8 && j < m; j++)
            if (j < nsub) byte |= 1u << (j % 8);
        snprintf(bitmap + 2 * b, 3, "%02x", byte);
    }
    snprintf(params_buf, sizeof params_buf,
             "{\"items\":\"%s\",\"k\":%.17g,\"L\":%.17g,\"xi\":%u,\"variant\":\"%s\",\"oja_steps\":400}", bitmap, k,
             L, xi, variant);
    agg_job j;
    memset(&j, 0, sizeof j);
    j.proto = &agg_protocol_private_fw;
    j.m = m;
    j.d = d;
    j.rating_min = 1.0;
    j.rating_max = 5.0;
    j.rounds = rounds;
    j.participation = 1.0;
    j.params = params_buf;
    j.has_budget = 1;
    j.budget_epsilon = 1.0;
    j.budget_delta = 1e-6;
    return j;
}

static void test_fw_projection_keeps_the_observed_row_within_L(void **state) {
    (void)state;
    uint64_t s = 7;
    for (int trial = 0; trial < 2000; trial++) {
        uint32_t n = 1 + (uint32_t)(sm(&s) % 80);
        float y[80], ystar[80], v[80];
        double L = 0.1 + 10.0 * unif(&s);
        for (uint32_t j = 0; j < n; j++) {
            y[j] = (float)(4.0 * unif(&s) - 2.0);
            ystar[j] = (float)(4.0 * unif(&s) - 2.0);
            v[j] = (float)(2.0 * unif(&s) - 1.0);
        }
        double u, sc, sq = 0.0;
        assert_int_equal(dprec_fw_local_step(n, y, ystar, v, 0.01 + unif(&s), 1.0 + 1000.0 * unif(&s), 10.0, L, &u,
                                             &sc),
                         DPREC_OK);
        for (uint32_t j = 0; j < n; j++) sq += (double)y[j] * (double)y[j];
        assert_true(sqrt(sq) <= L);
        assert_true(sc > 0.0 && sc <= 1.0);
        float a[80];
        double f = dprec_fw_residual(n, y, ystar, L, a);
        assert_true(f > 0.0 && f <= 1.0);
        sq = 0.0;
        for (uint32_t j = 0; j < n; j++) sq += (double)a[j] * (double)a[j];
        assert_true(sqrt(sq) <= 2.0 * L);
    }
}

/* power iteration in the test (independent of LAPACKE): top eigenpair of the symmetric n x n w */
static void power_top(const double *w, uint32_t n, double *v, double *ev) {
    for (uint32_t j = 0; j < n; j++) v[j] = 1.0 / sqrt((double)n) + 1e-3 * (double)j;
    double t[64], lam = 0.0;
    for (int it = 0; it < 20000; it++) {
        double nrm = 0.0;
        for (uint32_t r = 0; r < n; r++) {
            t[r] = 0.0;
            for (uint32_t c = 0; c < n; c++) t[r] += w[r * n + c] * v[c];
            nrm += t[r] * t[r];
        }
        nrm = sqrt(nrm);
        if (nrm == 0.0) break;
        for (uint32_t r = 0; r < n; r++) v[r] = t[r] / nrm;
        lam = nrm;
    }
    *ev = lam;
}

enum { FU = 40, FM = 12, FN = 8, FXI = 5, FT = 6 };

static void test_fw_without_noise_equals_direct_frank_wolfe(void **state) {
    (void)state;
    const double k = 30.0, L = 3.0;
    agg_job job = make_job(FM, FN, FT, FT, k, L, FXI, "dense");
    uint64_t s = 99;
    /* the data: each user rates FXI distinct items of the subset (centred ratings), with a rank-one trend */
    uint32_t items[FU][FXI];
    float ystar[FU][FXI];
    double pu[FU], pv[FN];
    for (uint32_t j = 0; j < FN; j++) pv[j] = 0.5 + unif(&s);
    for (uint32_t i = 0; i < FU; i++) {
        pu[i] = unif(&s) * 2.0 - 1.0;
        uint32_t perm[FN];
        for (uint32_t j = 0; j < FN; j++) perm[j] = j;
        for (uint32_t j = 0; j < FN; j++) {
            uint32_t r = j + (uint32_t)(sm(&s) % (FN - j)), t = perm[j];
            perm[j] = perm[r];
            perm[r] = t;
        }
        for (uint32_t a = 0; a < FXI; a++)
            for (uint32_t b = a + 1; b < FXI; b++)
                if (perm[b] < perm[a]) { uint32_t t = perm[a]; perm[a] = perm[b]; perm[b] = t; }
        for (uint32_t a = 0; a < FXI; a++) {
            items[i][a] = perm[a];
            ystar[i][a] = (float)(1.5 * pu[i] * pv[perm[a]] + 0.3 * (unif(&s) - 0.5));
        }
    }
    /* the protocol: devices keep g (FT coefficients); the aggregator's noiseless global step */
    float g[FU][FT];
    memset(g, 0, sizeof g);
    agg_model rel;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_private_fw.initial_model(&job, &rel, err, sizeof err), 0);
    /* the direct Frank-Wolfe on the same data, Y over the subset */
    double Y[FU][FN], v[FN], lam = 1.0;
    memset(Y, 0, sizeof Y);
    memset(v, 0, sizeof v);
    unsigned char pay[FU][8 + 8 * FXI];
    agg_report reps[FU];
    for (int64_t t = 1; t <= FT; t++) {
        for (uint32_t i = 0; i < FU; i++) {
            float y[FXI], vo[FXI], a[FXI];
            int64_t col = (int64_t)t - 2; /* release t's newest direction */
            for (uint32_t e = 0; e < FXI; e++) {
                const float *row = rel.v + (size_t)items[i][e] * FT;
                double acc = 0.0;
                for (uint32_t c = 0; c < FT; c++) acc += (double)g[i][c] * (double)row[c];
                y[e] = (float)acc;
                vo[e] = col >= 0 ? row[col] : 0.0f;
            }
            double u, sc;
            assert_int_equal(dprec_fw_local_step(FXI, y, ystar[i], vo, (double)rel.mu, k, FT, L, &u, &sc), DPREC_OK);
            for (uint32_t c = 0; c < FT; c++) g[i][c] = (float)(sc * (1.0 - 1.0 / FT) * (double)g[i][c]);
            if (col >= 0) g[i][col] = (float)((double)g[i][col] - sc * k / FT * u);
            assert_true(dprec_fw_residual(FXI, y, ystar[i], L, a) > 0.0);
            dprec_st32(pay[i], FXI);
            dprec_st32(pay[i] + 4, 0);
            for (uint32_t e = 0; e < FXI; e++) {
                dprec_st32(pay[i] + 8 + 8 * e, items[i][e]);
                dprec_stf32(pay[i] + 12 + 8 * e, a[e]);
            }
            reps[i].device = i + 1;
            reps[i].payload = pay[i];
            reps[i].payload_len = sizeof pay[i];
            assert_int_equal(agg_protocol_private_fw.validate_payload(&job, pay[i], sizeof pay[i], err, sizeof err), 0);
        }
        /* direct: Y <- Pi((1 - 1/T) Y - (k/T) (A v / lam) v^T), A = P_Omega(Y - Y*) */
        double Wd[FN * FN];
        memset(Wd, 0, sizeof Wd);
        for (uint32_t i = 0; i < FU; i++) {
            double dot = 0.0, sq = 0.0, M[FN];
            for (uint32_t e = 0; e < FXI; e++) dot += (Y[i][items[i][e]] - ystar[i][e]) * v[items[i][e]];
            double u = dot / lam;
            for (uint32_t j = 0; j < FN; j++) M[j] = (1.0 - 1.0 / FT) * Y[i][j] - k / FT * u * v[j];
            for (uint32_t e = 0; e < FXI; e++) sq += M[items[i][e]] * M[items[i][e]];
            double sc = sqrt(sq) > L ? L / sqrt(sq) : 1.0;
            for (uint32_t j = 0; j < FN; j++) Y[i][j] = sc * M[j];
            double a[FXI], an = 0.0;
            for (uint32_t e = 0; e < FXI; e++) {
                a[e] = Y[i][items[i][e]] - ystar[i][e];
                an += a[e] * a[e];
            }
            double cs = sqrt(an) > 2.0 * L ? 2.0 * L / sqrt(an) : 1.0;
            for (uint32_t e = 0; e < FXI; e++)
                for (uint32_t f = 0; f < FXI; f++) Wd[items[i][e] * FN + items[i][f]] += cs * cs * a[e] * a[f];
        }
        double ev;
        power_top(Wd, FN, v, &ev);
        lam = sqrt(ev);
        job.round = t;
        agg_model next;
        assert_int_equal(agg_fw_step(&job, &rel, reps, FU, NULL, 0, &next, err, sizeof err), 0);
        agg_model_free(&rel);
        rel = next;
        assert_true(fabs((double)rel.mu - lam) <= 1e-4 * lam);
    }
    /* every device's full row (all subset items, observed or not) equals the direct iterate */
    for (uint32_t i = 0; i < FU; i++)
        for (uint32_t j = 0; j < FN; j++) {
            double acc = 0.0;
            for (uint32_t c = 0; c < FT; c++) acc += (double)g[i][c] * (double)rel.v[(size_t)j * FT + c];
            assert_true(fabs(acc - Y[i][j]) <= 1e-4 * (1.0 + fabs(Y[i][j])));
        }
    for (uint32_t j = 0; j < FM; j++) assert_true(rel.bias[j] == (j < FN ? 1.0f : 0.0f));
    agg_model_free(&rel);
}

/* Statistical test: n(n+1)/2 = 1830 i.i.d. entries. The sample variance over sigma^2 has standard deviation
 * sqrt(2/1829) = 0.033; a deviation above 0.2 (6 standard deviations) has probability below 1e-8 (chi-square
 * tail); the sample mean beyond 6 sigma/sqrt(1830) likewise below 2e-9. Fixed seed. */
static void test_fw_noise_matrix_is_symmetric_with_the_stated_sigma(void **state) {
    (void)state;
    const uint32_t n = 60;
    double *w = calloc((size_t)n * n, sizeof(double));
    assert_non_null(w);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"fw-noise", 8, "test"), DPREC_OK);
    agg_job job = make_job(16, 16, 10, 10, 100.0, 2.0, 80, "dense");
    double sigma, sens, sens1, rho;
    assert_int_equal(agg_fw_mechanism(&job, &sigma, &sens, &sens1, &rho), 0);
    /* seed 002 Alg. 1: sigma = L^2 sqrt(64 T log(1/delta)) / epsilon */
    assert_true(fabs(sigma - 4.0 * sqrt(640.0 * log(1e6)) / 1.0) < 1e-9 * sigma);
    assert_int_equal(agg_fw_noise_symmetric(&rng, w, n, sens, sigma), 0);
    double sum = 0.0, sq = 0.0, cnt = 0.0;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < n; c++) {
            assert_true(w[r * n + c] == w[c * n + r]);
            if (c >= r) {
                sum += w[r * n + c];
                cnt += 1.0;
            }
        }
    double mean = sum / cnt;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = r; c < n; c++) sq += (w[r * n + c] - mean) * (w[r * n + c] - mean);
    double var = sq / (cnt - 1.0);
    assert_true(fabs(var / (sigma * sigma) - 1.0) < 0.2);
    assert_true(fabs(mean) < 6.0 * sigma / sqrt(cnt));
    dprec_rng_free(&rng);
    free(w);
}

static void test_fw_oja_and_the_dense_solver_agree_without_noise(void **state) {
    (void)state;
    enum { R = 200, N = 30 };
    uint64_t s = 3;
    agg_fw_rows A;
    A.rows = R;
    A.off = malloc(sizeof(size_t) * (R + 1));
    A.idx = malloc(sizeof(uint32_t) * R * 6);
    A.val = malloc(sizeof(double) * R * 6);
    double *w = calloc(N * N, sizeof(double)), pv[N], vd[N], vo[N];
    assert_true(A.off && A.idx && A.val && w);
    for (uint32_t j = 0; j < N; j++) pv[j] = unif(&s) + 0.2;
    A.off[0] = 0;
    for (uint32_t i = 0; i < R; i++) {
        size_t o = A.off[i];
        double pu = unif(&s) * 2.0 - 1.0;
        for (uint32_t e = 0; e < 6; e++) {
            A.idx[o + e] = (uint32_t)(5 * e + sm(&s) % 5); /* distinct items */
            A.val[o + e] = pu * pv[A.idx[o + e]] + 0.2 * (unif(&s) - 0.5);
        }
        A.off[i + 1] = o + 6;
        for (uint32_t e = 0; e < 6; e++)
            for (uint32_t f = 0; f < 6; f++) w[A.idx[o + e] * N + A.idx[o + f]] += A.val[o + e] * A.val[o + f];
    }
    double evd, evo, tr = 0.0;
    for (uint32_t j = 0; j < N; j++) tr += w[j * N + j];
    assert_int_equal(agg_fw_top_dense(w, N, vd, &evd), 0);
    assert_int_equal(agg_fw_oja(&A, N, 2000, 1.0 / tr, 0.0, 1.0, 1.0, NULL, vo, &evo), 0);
    double dot = 0.0;
    for (uint32_t j = 0; j < N; j++) dot += vd[j] * vo[j];
    assert_true(fabs(dot) > 0.9999);
    assert_true(fabs(evo - evd) <= 1e-6 * evd);
    free(A.off);
    free(A.idx);
    free(A.val);
    free(w);
}

static void test_fw_job_fits_its_budget_by_theorem_3_1(void **state) {
    (void)state;
    const char *variants[] = {"dense", "oja"};
    const double eps[] = {0.1, 0.5, 1.0, 2.0, 5.0};
    for (int v = 0; v < 2; v++)
        for (int e = 0; e < 5; e++) {
            agg_job job = make_job(1682, 400, 10, 10, 100.0, 9.0, 80, variants[v]);
            job.budget_epsilon = eps[e];
            double rho, got;
            assert_int_equal(agg_fw_mechanism(&job, NULL, NULL, NULL, &rho), 0);
            /* seed 002 Thm. 3.1 via Bun-Steinke Prop. 1.3 on the whole job's rho */
            assert_true(dprec_zcdp_to_dp(10.0 * rho, job.budget_delta) <= eps[e]);
            assert_int_equal(agg_budget_check(&job, 10, &got), 1);
            assert_true(got <= eps[e]);
            cJSON *p = cJSON_Parse(job.params);
            char err[AGG_ERRMSG];
            assert_int_equal(agg_protocol_private_fw.validate_job(&job, p, err, sizeof err), 0);
            job.d = 9; /* fewer columns than rounds */
            assert_int_equal(agg_protocol_private_fw.validate_job(&job, p, err, sizeof err), -1);
            cJSON_Delete(p);
        }
}

/* Every report carries exactly xi pairs, the real ones first and then padding (DPREC_PAD_ITEM, +0.0), so that
 * its length never tells how many ratings its user has: the aggregator refuses any other shape, and a padded
 * report steps the model exactly as the same report with the padding replaced by zero residuals. */
static void test_fw_reports_are_padded_to_xi_and_padding_adds_nothing(void **state) {
    (void)state;
    agg_job job = make_job(FM, FN, FT, FT, 30.0, 3.0, FXI, "dense");
    job.round = 1;
    agg_model rel;
    char err[AGG_ERRMSG];
    assert_int_equal(agg_protocol_private_fw.initial_model(&job, &rel, err, sizeof err), 0);
    enum { R = 6, REAL = 3 };
    unsigned char padded[R][8 + 8 * FXI], zeroed[R][8 + 8 * FXI];
    agg_report rp[R], rz[R];
    uint64_t s = 3;
    for (uint32_t i = 0; i < R; i++) {
        dprec_st32(padded[i], FXI);
        dprec_st32(padded[i] + 4, 0);
        for (uint32_t e = 0; e < FXI; e++) {
            /* real items 2e + (i % 2) in 0..5; the zero-residual stand-ins 6, 7 (above them: order kept) */
            uint32_t item = e < REAL ? 2 * e + (i % 2) : 6 + (e - REAL);
            float a = (float)(unif(&s) * 2.0 - 1.0);
            dprec_st32(padded[i] + 8 + 8 * e, e < REAL ? item : DPREC_PAD_ITEM);
            dprec_stf32(padded[i] + 12 + 8 * e, e < REAL ? a : 0.0f);
        }
        memcpy(zeroed[i], padded[i], sizeof zeroed[i]);
        for (uint32_t e = REAL; e < FXI; e++) dprec_st32(zeroed[i] + 8 + 8 * e, 6 + (e - REAL));
        assert_int_equal(agg_protocol_private_fw.validate_payload(&job, padded[i], sizeof padded[i], err, sizeof err), 0);
        assert_int_equal(agg_protocol_private_fw.validate_payload(&job, zeroed[i], sizeof zeroed[i], err, sizeof err), 0);
        rp[i] = (agg_report){0};
        rp[i].device = i + 1;
        rp[i].payload = padded[i];
        rp[i].payload_len = sizeof padded[i];
        rz[i] = rp[i];
        rz[i].payload = zeroed[i];
    }
    agg_model a, b;
    assert_int_equal(agg_fw_step(&job, &rel, rp, R, NULL, 0, &a, err, sizeof err), 0);
    assert_int_equal(agg_fw_step(&job, &rel, rz, R, NULL, 0, &b, err, sizeof err), 0);
    for (size_t k = 0; k < (size_t)FM * FT; k++) assert_true(a.v[k] == b.v[k]);
    agg_model_free(&a);
    agg_model_free(&b);
    /* shapes refused: fewer pairs than xi, a real pair after the padding began, a padding pair with a value */
    unsigned char q[8 + 8 * FXI];
    assert_int_equal(agg_protocol_private_fw.validate_payload(&job, padded[0], 8 + 8 * REAL, err, sizeof err), -1);
    memcpy(q, padded[0], sizeof q);
    dprec_st32(q, REAL);
    assert_int_equal(agg_protocol_private_fw.validate_payload(&job, q, 8 + 8 * REAL, err, sizeof err), -1);
    memcpy(q, padded[0], sizeof q);
    dprec_st32(q + 8 + 8 * (REAL + 1), 7);
    assert_int_equal(agg_protocol_private_fw.validate_payload(&job, q, sizeof q, err, sizeof err), -1);
    memcpy(q, padded[0], sizeof q);
    dprec_stf32(q + 12 + 8 * REAL, 1.0f);
    assert_int_equal(agg_protocol_private_fw.validate_payload(&job, q, sizeof q, err, sizeof err), -1);
    agg_model_free(&rel);
}

/* Private Oja's start is a unit vector (the sensitivity (2L)^2 of A^T A v holds for ||v|| = 1 only): with no
 * steps the direction returned is v_0 itself, of norm 1, with or without noise. */
static void test_fw_oja_starts_from_a_unit_vector(void **state) {
    (void)state;
    enum { N = 50 };
    size_t off[2] = {0, 1};
    uint32_t idx[1] = {3};
    double val[1] = {2.0}, v[N], ev2;
    agg_fw_rows A = {1, off, idx, val};
    assert_int_equal(agg_fw_oja(&A, N, 0, 0.1, 0.0, 1.0, 1.0, NULL, v, &ev2), 0);
    double sq = 0.0;
    for (uint32_t j = 0; j < N; j++) sq += v[j] * v[j];
    assert_true(fabs(sqrt(sq) - 1.0) <= 1e-12);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"oja-v0", 6, "test"), DPREC_OK);
    assert_int_equal(agg_fw_oja(&A, N, 0, 0.1, 7.0, 1.0, 1.0, &rng, v, &ev2), 0);
    sq = 0.0;
    for (uint32_t j = 0; j < N; j++) sq += v[j] * v[j];
    assert_true(fabs(sqrt(sq) - 1.0) <= 1e-12);
    dprec_rng_free(&rng);
}

/* The dense round is a sum (docs/notes/streaming-sums.md): each report folds the upper triangle of its re-clipped
 * A_i^T A_i, rounded toward zero, so its contribution is never longer than ||A_i||^2 <= 4 L^2 (the noise's
 * sensitivity) whatever the device sent; the round's sum is within n 2^-F of the double W of the clipped rows; a
 * release from the sum folded in another order is bitwise the global step's over the reports, for the same noise;
 * Oja's variant, which reads every row in each step, does not fold. */
static void test_fw_dense_round_folds_within_its_clip_and_streams_the_same_release(void **state) {
    (void)state;
    enum { M = 12, N = 8, XI = 5, R = 60 };
    const double L = 1.5;
    agg_job job = make_job(M, N, 3, 3, 10.0, L, XI, "dense");
    job.round = 1;
    agg_fold_spec spec;
    assert_int_equal(agg_fold_job(&job, &spec), 1);
    assert_int_equal(spec.coords, N * (N + 1) / 2);
    assert_true(spec.bound >= 4.0 * L * L);
    agg_sum total, one, reversed;
    assert_int_equal(agg_sum_init(&total, &spec), 0);
    assert_int_equal(agg_sum_init(&one, &spec), 0);
    assert_int_equal(agg_sum_init(&reversed, &spec), 0);
    static unsigned char pay[R][8 + 8 * XI];
    agg_report reps[R];
    double W[N][N];
    memset(W, 0, sizeof W);
    uint64_t s = 77;
    char err[256];
    for (int i = 0; i < R; i++) {
        double scale = unif(&s) < 0.2 ? 1e6 : 1.0; /* far outside the clip now and then */
        uint32_t items[XI], cnt = 0;
        for (uint32_t j = 0; j < N && cnt < XI; j++)
            if (unif(&s) < 0.6) items[cnt++] = j;
        double a[XI], an = 0.0;
        dprec_st32(pay[i], XI);
        dprec_st32(pay[i] + 4, 0);
        for (uint32_t e = 0; e < XI; e++) {
            float v = e < cnt ? (float)(scale * (2.0 * unif(&s) - 1.0)) : 0.0f;
            dprec_st32(pay[i] + 8 + 8 * e, e < cnt ? items[e] : DPREC_PAD_ITEM);
            dprec_stf32(pay[i] + 12 + 8 * e, v);
            a[e] = (double)v;
            an += e < cnt ? a[e] * a[e] : 0.0;
        }
        assert_int_equal(agg_protocol_private_fw.validate_payload(&job, pay[i], sizeof pay[i], err, sizeof err), 0);
        reps[i] = (agg_report){0};
        reps[i].device = (int64_t)i + 1;
        reps[i].payload = pay[i];
        reps[i].payload_len = sizeof pay[i];
        double cs = sqrt(an) > 2.0 * L ? 2.0 * L / sqrt(an) : 1.0;
        for (uint32_t e = 0; e < cnt; e++)
            for (uint32_t f = 0; f < cnt; f++) W[items[e]][items[f]] += cs * cs * a[e] * a[f];
        agg_sum_zero(&one);
        assert_int_equal(agg_fold_report(&job, pay[i], sizeof pay[i], &one), 0);
        double fro2 = 0.0; /* the symmetric matrix's Frobenius norm: each off-diagonal value twice */
        for (uint32_t r = 0, c = 0, k = 0; k < one.coords; k++, c++) {
            if (c == N) c = ++r;
            double x = agg_sum_value(&one, k);
            fro2 += (r == c ? 1.0 : 2.0) * x * x;
        }
        assert_true(sqrt(fro2) <= 4.0 * L * L);
        assert_int_equal(agg_fold_report(&job, pay[i], sizeof pay[i], &total), 0);
    }
    for (int i = R - 1; i >= 0; i--) assert_int_equal(agg_fold_report(&job, pay[i], sizeof pay[i], &reversed), 0);
    assert_memory_equal(total.q, reversed.q, (size_t)total.coords * sizeof *total.q);
    for (uint32_t r = 0, k = 0; r < N; r++)
        for (uint32_t c = r; c < N; c++, k++)
            assert_true(fabs(W[r][c] - agg_sum_value(&total, k)) <= R * ldexp(1.0, -total.frac_bits));

    agg_model prev, raw, folded;
    assert_int_equal(agg_protocol_private_fw.initial_model(&job, &prev, err, sizeof err), 0);
    dprec_rng rng;
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"fw-fold", 7, "test"), DPREC_OK);
    assert_int_equal(agg_protocol_private_fw.global_step(&job, &prev, reps, R, &rng, &raw, err, sizeof err), 0);
    dprec_rng_free(&rng);
    assert_int_equal(dprec_rng_init(&rng, NULL, (const unsigned char *)"fw-fold", 7, "test"), DPREC_OK);
    assert_int_equal(agg_fold_sum_step(&job, &prev, &reversed, &rng, &folded, err, sizeof err), 0);
    dprec_rng_free(&rng);
    assert_memory_equal(raw.v, folded.v, sizeof(float) * M * 3);
    assert_memory_equal(raw.bias, folded.bias, sizeof(float) * M);
    assert_true(raw.mu == folded.mu);
    float col0 = 0.0f;
    for (uint32_t j = 0; j < N; j++) col0 += fabsf(raw.v[(size_t)j * 3]);
    assert_true(col0 > 0.0f); /* the round released a direction, not zeros */
    agg_model_free(&prev);
    agg_model_free(&raw);
    agg_model_free(&folded);
    agg_sum_free(&total);
    agg_sum_free(&one);
    agg_sum_free(&reversed);

    agg_job oja = make_job(M, N, 3, 3, 10.0, L, XI, "oja");
    assert_int_equal(agg_fold_job(&oja, &spec), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fw_projection_keeps_the_observed_row_within_L),
        cmocka_unit_test(test_fw_without_noise_equals_direct_frank_wolfe),
        cmocka_unit_test(test_fw_noise_matrix_is_symmetric_with_the_stated_sigma),
        cmocka_unit_test(test_fw_oja_and_the_dense_solver_agree_without_noise),
        cmocka_unit_test(test_fw_job_fits_its_budget_by_theorem_3_1),
        cmocka_unit_test(test_fw_reports_are_padded_to_xi_and_padding_adds_nothing),
        cmocka_unit_test(test_fw_oja_starts_from_a_unit_vector),
        cmocka_unit_test(test_fw_dense_round_folds_within_its_clip_and_streams_the_same_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
