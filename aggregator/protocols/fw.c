/* dprec aggregator — protocol `private-fw`: seed 002 (Jain, Thakkar, Thakurta, ICML 2018), Private Frank-Wolfe,
 * joint differential privacy at user level (docs/privacy.md "private-fw", docs/protocol.md "private-fw").
 *
 * A_global of seed 002 Alg. 1, one round of the job per Frank-Wolfe iteration t = 1 .. T (T = the job's rounds):
 *   W  = sum_i A_i^T A_i over the round's reports (A_i: the device's residual row on its <= xi sampled items,
 *        clipped here to ||A_i|| <= 2L whatever the device sent)
 *   W~ = W + N, N symmetric with i.i.d. N(0, sigma^2) on and above the diagonal (mirrored below),
 *        sigma = L^2 sqrt(64 T log(1/delta)) / epsilon                         (seed 002 Alg. 1, first line)
 *   (v, lambda^2) = top eigenvector and eigenvalue of W~ (LAPACKE_dsyevr)      (Alg. 1, last line of the loop)
 *   lambda-hat = lambda + sqrt(sigma log(n/beta)) n^(1/4)                      (Alg. 1, first line of the loop)
 * Variant "oja" (seed 002 Alg. 2): W is never formed; Gamma steps of v <- v + eta (A^T A v + g),
 * g ~ N(0, sigma_o^2 1_n), v <- v / ||v||, eta = 1 / (sigma_o sqrt(n Gamma)) (Alg. 2 with Thm. 3.3's
 * V = sigma_o^2 n), then lambda^2 = ||A v||^2 + N(0, sigma_o^2) (Alg. 2, last line). Memory O(nnz + n).
 *
 * Release: column c = t - 1 of V holds v_t on the subset's items (0 elsewhere); earlier columns are copied
 * from the previous release, so that a device's row Y_i = sum_c g_c v_c can be evaluated on any item from the
 * latest release; the item biases are the subset's indicator (1 in the subset, 0 outside), and global_mean
 * is lambda-hat of the newest column. Releasing the earlier directions again is post-processing.
 *
 * Privacy (add/remove one user; docs/privacy.md): ||A_i^T A_i||_F = ||A_i||^2 <= 4L^2 = Delta, and the upper
 * triangle (diagonal included) of a symmetric matrix has an L2 norm at most its Frobenius norm, so the noised
 * vector of n(n+1)/2 coordinates has L2 sensitivity <= Delta. Each round is a Gaussian mechanism:
 * rho = S^2 / (2 sigma^2)-zCDP (Bun, Steinke 2016, Prop. 1.6), with S = Delta + sqrt(n(n+1)/2) g the allowance
 * of common/noise.h for the grid g; T rounds compose to T rho (Prop. 1.7). With S = Delta and the sigma above,
 * T rho = epsilon^2 / (8 log(1/delta)), and rho + 2 sqrt(rho log(1/delta)) (Prop. 1.3)
 * = epsilon^2/(8 log(1/delta)) + epsilon/sqrt(2) <= epsilon for epsilon <= 2 log(1/delta): seed 002 Thm. 3.1.
 * The job's accountant (DPREC_STEP_ZCDP, CKS conversion) gives the exact epsilon. Oja: each of the Gamma
 * steps is a Gaussian mechanism on an n-vector (||A_i^T A_i v|| <= ||A_i||^2 <= Delta for ||v|| = 1) and the
 * eigenvalue one more on a scalar (Delta), so sigma_o = L^2 sqrt(64 T (Gamma + 1) log(1/delta)) / epsilon gives
 * the same total rho. The devices' own rows Y_i are never released: they depend on the released directions
 * and their own data only, hence joint DP (Kearns et al. 2014; seed 002 Thm. 3.1, the billboard lemma). */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "bytes.h"
#include "dprec/status.h"
#include "fw.h"
#include "noise.h"

#define FW_MAX_ITEMS 4096u        /* the dense W is n x n doubles (128 MiB at 4096) */
#define FW_MAX_OJA_ITEMS 1000000u

typedef struct fw_params {
    double k, L, beta, offset;
    uint32_t xi, oja_steps;
    int oja, has_offset;
    uint32_t n;        /* items in the subset */
    int32_t *sub_of;   /* m: index in the subset, or -1 (malloc'd) */
} fw_params;

static void fw_params_free(fw_params *p) {
    free(p->sub_of);
    p->sub_of = NULL;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* params: items (hex bitmap over the m items: byte j/8, bit j%8, 2 ceil(m/8) hex digits), k, L, xi
 * (required); beta, variant, oja_steps, offset, center (optional). */
static int parse_params(const cJSON *params, uint32_t m, fw_params *p, char *err, size_t errcap) {
    memset(p, 0, sizeof *p);
    p->beta = 0.1;
    p->oja_steps = 64;
    const char *items = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        const char *key = it->string != NULL ? it->string : "?";
        int bad = 0;
        double v = 0;
        if (strcmp(key, "items") == 0) {
            if (cJSON_IsString(it)) items = it->valuestring;
            else bad = 1;
        } else if (strcmp(key, "k") == 0) bad = agg_json_number_in(it, 0.0, 1e12, 1, &p->k);
        else if (strcmp(key, "L") == 0) bad = agg_json_number_in(it, 0.0, 1e6, 1, &p->L);
        else if (strcmp(key, "beta") == 0) bad = agg_json_number_in(it, 0.0, 1.0, 1, &p->beta) || p->beta >= 1.0;
        else if (strcmp(key, "offset") == 0) { bad = agg_json_number_in(it, -1e6, 1e6, 1, &p->offset); p->has_offset = 1; }
        else if (strcmp(key, "center") == 0) /* used by the devices only (sdk/protocols/fw.c) */
            bad = !cJSON_IsString(it) || (strcmp(it->valuestring, "user") != 0 && strcmp(it->valuestring, "offset") != 0);
        else if (strcmp(key, "xi") == 0) {
            bad = agg_json_number_in(it, 0.0, 65535.0, 1, &v) || floor(v) != v;
            p->xi = (uint32_t)v;
        } else if (strcmp(key, "oja_steps") == 0) {
            bad = agg_json_number_in(it, 0.0, 100000.0, 1, &v) || floor(v) != v;
            p->oja_steps = (uint32_t)v;
        } else if (strcmp(key, "variant") == 0) {
            if (cJSON_IsString(it) && strcmp(it->valuestring, "dense") == 0) p->oja = 0;
            else if (cJSON_IsString(it) && strcmp(it->valuestring, "oja") == 0) p->oja = 1;
            else bad = 1;
        } else {
            snprintf(err, errcap, "params.%s is not a parameter of private-fw (items, k, L, xi, beta, variant, "
                     "oja_steps, offset, center)", key);
            return -1;
        }
        if (bad) {
            snprintf(err, errcap, "params.%s is out of range (see docs/protocol.md, private-fw)", key);
            return -1;
        }
    }
    if (items == NULL || p->k == 0.0 || p->L == 0.0 || p->xi == 0) {
        snprintf(err, errcap, "private-fw needs params.items, params.k, params.L and params.xi");
        return -1;
    }
    size_t want = 2u * (((size_t)m + 7u) / 8u);
    if (strlen(items) != want) {
        snprintf(err, errcap, "params.items must be %zu hex digits (a bitmap over the m items)", want);
        return -1;
    }
    p->sub_of = malloc(sizeof(int32_t) * (m > 0 ? m : 1u));
    if (p->sub_of == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (uint32_t j = 0; j < m; j++) {
        int hi = hexval(items[2 * (j / 8)]), lo = hexval(items[2 * (j / 8) + 1]);
        if (hi < 0 || lo < 0) {
            fw_params_free(p);
            snprintf(err, errcap, "params.items is not hexadecimal");
            return -1;
        }
        unsigned byte = ((unsigned)hi << 4) | (unsigned)lo;
        p->sub_of[j] = (byte >> (j % 8)) & 1u ? (int32_t)p->n++ : -1;
    }
    if (p->n < 2 || p->n > (p->oja ? FW_MAX_OJA_ITEMS : FW_MAX_ITEMS)) {
        fw_params_free(p);
        snprintf(err, errcap, "the item subset must have 2 .. %u items (variant %s)",
                 p->oja ? FW_MAX_OJA_ITEMS : FW_MAX_ITEMS, p->oja ? "oja" : "dense");
        return -1;
    }
    return 0;
}

static int job_params(const agg_job *job, fw_params *p, char *err, size_t errcap) {
    cJSON *params = cJSON_Parse(job->params != NULL ? job->params : "{}");
    int rc = params != NULL ? parse_params(params, job->m, p, err, errcap) : -1;
    if (params == NULL) snprintf(err, errcap, "params are not JSON");
    cJSON_Delete(params);
    if (rc == 0 && !p->has_offset) p->offset = (job->rating_min + job->rating_max) / 2.0;
    return rc;
}

/* The grid step common/noise.h picks for sigma: 2^(ceil(log2 sigma) - 20). */
static double grid_of(double sigma) {
    int e;
    (void)frexp(sigma, &e);
    if (ldexp(0.5, e) == sigma) e -= 1;
    return ldexp(1.0, e - 20);
}

int agg_fw_mechanism(const agg_job *job, double *sigma, double *sens, double *sens1, double *rho) {
    fw_params p;
    char err[AGG_ERRMSG];
    if (!job->has_budget || !(job->budget_epsilon > 0.0) || !isfinite(job->budget_epsilon) ||
        !(job->budget_delta > 0.0 && job->budget_delta < 1.0) || job->rounds < 1)
        return -1;
    if (job_params(job, &p, err, sizeof err) != 0) return -1;
    double T = (double)job->rounds, delta = 4.0 * p.L * p.L, n = (double)p.n;
    double calls = p.oja ? (double)p.oja_steps + 1.0 : 1.0;
    /* seed 002 Alg. 1: sigma = L^2 sqrt(64 T log(1/delta)) / epsilon; Oja: T (Gamma + 1) mechanisms per job */
    double s = p.L * p.L * sqrt(64.0 * T * calls * log(1.0 / job->budget_delta)) / job->budget_epsilon;
    double g = grid_of(s);
    double coords = p.oja ? n : n * (n + 1.0) / 2.0;
    /* common/noise.h: one grid step per noised coordinate, L2: sqrt(coords) g */
    double S = delta + sqrt(coords) * g, S1 = delta + g;
    double r = p.oja ? ((double)p.oja_steps * S * S + S1 * S1) / (2.0 * s * s) : S * S / (2.0 * s * s);
    fw_params_free(&p);
    if (sigma) *sigma = s;
    if (sens) *sens = S;
    if (sens1) *sens1 = S1;
    if (rho) *rho = r;
    return isfinite(r) && r > 0.0 ? 0 : -1;
}

static int fw_round_step(const agg_job *job, dprec_step *step) {
    double rho;
    if (agg_fw_mechanism(job, NULL, NULL, NULL, &rho) != 0) return -1;
    memset(step, 0, sizeof *step);
    step->kind = DPREC_STEP_ZCDP; /* Bun, Steinke 2016; seed 002 Thm. 3.1's proof */
    step->rho = rho;
    step->steps = 1;
    return 0;
}

static void fw_privacy_extra(const agg_job *job, cJSON *priv) {
    double sigma, rho;
    if (agg_fw_mechanism(job, &sigma, NULL, NULL, &rho) != 0) return;
    cJSON_AddStringToObject(priv, "accountant", "zCDP (Gaussian, seed 002 Thm. 3.1), CKS conversion");
    cJSON_AddStringToObject(priv, "guarantee", "joint DP: the releases and every other device's output");
    cJSON_AddNumberToObject(priv, "sigma", sigma);
    cJSON_AddNumberToObject(priv, "rho_per_round", rho);
}

static int fw_validate_job(const agg_job *shape, const cJSON *params, char *err, size_t errcap) {
    fw_params p;
    if (parse_params(params, shape->m, &p, err, errcap) != 0) return -1;
    fw_params_free(&p);
    if (!shape->has_budget || !(shape->budget_delta > 0.0) || !isfinite(shape->budget_epsilon)) {
        snprintf(err, errcap, "private-fw needs a budget with a finite epsilon and delta > 0");
        return -1;
    }
    if (shape->rounds < 1 || (int64_t)shape->d != shape->rounds) {
        snprintf(err, errcap, "private-fw needs d = rounds = T (release column t - 1 holds iteration t's direction; "
                 "the devices read T from d)");
        return -1;
    }
    return 0;
}

/* The real pairs of a payload: those before the first padding pair. */
static uint32_t real_pairs(const unsigned char *p) {
    uint32_t n = dprec_ld32(p), k = 0;
    while (k < n && dprec_ld32(p + 8 + 8 * (size_t)k) != DPREC_PAD_ITEM) k++;
    return k;
}

static int fw_validate_payload(const agg_job *job, const unsigned char *p, size_t len, char *err, size_t errcap) {
    fw_params fp;
    if (job_params(job, &fp, err, errcap) != 0) return -1;
    int rc = -1;
    if (len < DPREC_FW_PAYLOAD_HEADER) {
        snprintf(err, errcap, "private-fw payload shorter than its header");
        goto out;
    }
    /* every report carries exactly xi pairs: the real ones first, then padding (DPREC_PAD_ITEM, +0.0), so that
     * its length never tells how many ratings the user has (sdk/protocols/fw.c) */
    uint32_t n = dprec_ld32(p), real = real_pairs(p);
    if (n != fp.xi || dprec_ld32(p + 4) != 0 || (uint64_t)len != (uint64_t)dprec_fw_payload_size(n)) {
        snprintf(err, errcap, "payload of %u entries and length %zu: every report carries xi = %u, padded", n, len,
                 fp.xi);
        goto out;
    }
    for (uint32_t i = real; i < n; i++)
        if (dprec_ld32(p + 8 + 8 * (size_t)i) != DPREC_PAD_ITEM || dprec_ld32(p + 12 + 8 * (size_t)i) != 0u) {
            snprintf(err, errcap, "pair %u after the padding began is not a padding pair", i);
            goto out;
        }
    int64_t prev = -1;
    for (uint32_t i = 0; i < real; i++) {
        uint32_t item = dprec_ld32(p + 8 + 8 * (size_t)i);
        if (item >= job->m || (int64_t)item <= prev || fp.sub_of[item] < 0) {
            snprintf(err, errcap, "items must be strictly increasing and in the job's subset (item %u)", item);
            goto out;
        }
        prev = item;
        if (!isfinite(dprec_ldf32(p + 12 + 8 * (size_t)i))) {
            snprintf(err, errcap, "residual of item %u is not finite", item);
            goto out;
        }
    }
    rc = 0;
out:
    fw_params_free(&fp);
    return rc;
}

/* One report's row, clipped to ||a|| <= 2L, as subset indices and values; returns the count (<= xi). */
static uint32_t report_row(const fw_params *fp, const unsigned char *p, uint32_t *idx, double *val) {
    uint32_t n = real_pairs(p);
    double sq = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        idx[i] = (uint32_t)fp->sub_of[dprec_ld32(p + 8 + 8 * (size_t)i)];
        val[i] = (double)dprec_ldf32(p + 12 + 8 * (size_t)i);
        sq += val[i] * val[i];
    }
    double nrm = sqrt(sq), lim = 2.0 * fp->L * (1.0 - 0x1p-40);
    if (nrm > lim)
        for (uint32_t i = 0; i < n; i++) val[i] *= lim / nrm;
    return n;
}

int agg_fw_noise_symmetric(dprec_rng *rng, double *w, uint32_t n, double sens, double sigma) {
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = r; c < n; c++) {
            double out;
            if (dprec_noise_gaussian(rng, w[(size_t)r * n + c], sens, sigma, &out, NULL) != DPREC_OK) return -1;
            w[(size_t)r * n + c] = out;
            w[(size_t)c * n + r] = out;
        }
    return 0;
}

int agg_fw_top_dense(double *w, uint32_t n, double *v, double *ev) {
    lapack_int found = 0, isuppz[2];
    double wv[1];
    /* the largest eigenvalue (il = iu = n) and its eigenvector of the symmetric w (upper triangle used) */
    lapack_int info = LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'V', 'I', 'U', (lapack_int)n, w, (lapack_int)n, 0.0, 0.0,
                                     (lapack_int)n, (lapack_int)n, 0.0, &found, wv, v, 1, isuppz);
    if (info != 0 || found != 1) return -1;
    *ev = wv[0];
    return 0;
}

int agg_fw_oja(const agg_fw_rows *A, uint32_t n, uint32_t steps, double eta, double sigma, double sens,
               double sens1, dprec_rng *rng, double *v, double *ev2) {
    double *w = malloc(sizeof(double) * n);
    if (w == NULL) return -1;
    int rc = -1;
    /* v_0 ~ N(0, sigma^2 I) (seed 002 Alg. 2; data-independent); without noise (tests), a fixed start. Then
     * scaled to unit norm: the sensitivity of A^T A v, ||a||^2 ||v|| <= (2L)^2, holds for ||v|| = 1 only, and
     * seed 002's first step would otherwise use v_0 of norm about sigma sqrt(n) (docs/privacy.md). */
    double sq0 = 0.0;
    for (uint32_t j = 0; j < n; j++) {
        v[j] = 1.0 + 0.01 * (double)j / (double)n;
        if (sigma > 0.0 && dprec_noise_gaussian(rng, 0.0, 1.0, sigma, &v[j], NULL) != DPREC_OK) goto out;
        sq0 += v[j] * v[j];
    }
    double nrm0 = sqrt(sq0);
    if (!(nrm0 > 0.0) || !isfinite(nrm0)) goto out; /* a start of norm 0 has probability 0 */
    for (uint32_t j = 0; j < n; j++) v[j] /= nrm0;
    for (uint32_t s = 0; s < steps; s++) {
        memset(w, 0, sizeof(double) * n);
        for (size_t i = 0; i < A->rows; i++) { /* A^T A v = sum_i a_i (a_i . v), O(nnz) */
            double dot = 0.0;
            for (size_t e = A->off[i]; e < A->off[i + 1]; e++) dot += A->val[e] * v[A->idx[e]];
            for (size_t e = A->off[i]; e < A->off[i + 1]; e++) w[A->idx[e]] += dot * A->val[e];
        }
        double sq = 0.0;
        for (uint32_t j = 0; j < n; j++) {
            double g = w[j];
            if (sigma > 0.0 && dprec_noise_gaussian(rng, w[j], sens, sigma, &g, NULL) != DPREC_OK) goto out;
            v[j] += eta * g; /* v <- v + eta (A^T A v + g) (seed 002 Alg. 2) */
            sq += v[j] * v[j];
        }
        double nrm = sqrt(sq);
        if (!(nrm > 0.0) || !isfinite(nrm)) goto out;
        for (uint32_t j = 0; j < n; j++) v[j] /= nrm;
    }
    double e2 = 0.0;
    for (size_t i = 0; i < A->rows; i++) {
        double dot = 0.0;
        for (size_t e = A->off[i]; e < A->off[i + 1]; e++) dot += A->val[e] * v[A->idx[e]];
        e2 += dot * dot;
    }
    /* lambda^2 = ||A v||^2 + N(0, sigma^2) (seed 002 Alg. 2, last line) */
    if (sigma > 0.0 && dprec_noise_gaussian(rng, e2, sens1, sigma, &e2, NULL) != DPREC_OK) goto out;
    *ev2 = e2;
    rc = 0;
out:
    free(w);
    return rc;
}

static int fw_initial_model(const agg_job *job, agg_model *out, char *err, size_t errcap) {
    fw_params p;
    if (job_params(job, &p, err, errcap) != 0) return -1;
    memset(out, 0, sizeof *out);
    out->m = job->m;
    out->d = job->d;
    out->v = calloc((size_t)job->m * job->d, sizeof(float));
    out->bias = calloc(job->m, sizeof(float));
    if (out->v == NULL || out->bias == NULL) {
        agg_model_free(out);
        fw_params_free(&p);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    for (uint32_t j = 0; j < job->m; j++) out->bias[j] = p.sub_of[j] >= 0 ? 1.0f : 0.0f;
    out->mu = 1.0f; /* v_0 = 0 (seed 002 Alg. 1): any lambda-hat > 0 gives u_i = 0 in round 1 */
    fw_params_free(&p);
    return 0;
}

/* ---- the dense round folded as reports arrive (docs/notes/streaming-sums.md) ------------------------------------
 * W = sum_i A_i^T A_i is a sum of reports: the round keeps its upper triangle (diagonal included), n (n + 1) / 2
 * values in fixed point, not the reports. Coordinate of (r, c), r <= c: row r starts after the r rows above it, of
 * n, n - 1, ... values. One report adds a_e a_f to (min, max) of its items' subset indices, each coordinate once (a
 * report's items are distinct: of the pairs (e, f) and (f, e) one has r < c). Rounded toward zero, a report's
 * contribution keeps L2 norm <= ||A_i^T A_i||_F = ||A_i||^2 <= 4 L^2, the sensitivity the noise is calibrated to
 * (the file's head); its largest value is a_e^2 <= 4 L^2, the bound the grid is chosen from. Oja's variant reads
 * every report in each of its steps (A^T A v for a new v each time): not a sum; it keeps the raw path. */
static uint64_t tri_index(uint32_t n, uint32_t r, uint32_t c) {
    return (uint64_t)r * (2u * (uint64_t)n - r + 1u) / 2u + (c - r);
}

static int fw_fold_spec(const agg_job *job, agg_fold_spec *spec) {
    fw_params fp;
    char err[AGG_ERRMSG];
    if (job_params(job, &fp, err, sizeof err) != 0) return 0;
    int dense = !fp.oja;
    spec->coords = (uint64_t)fp.n * (fp.n + 1u) / 2u;
    spec->bound = 4.0 * fp.L * fp.L;
    fw_params_free(&fp);
    return dense;
}

static int fw_fold(const agg_job *job, const unsigned char *p, size_t len, agg_sum *sum) {
    fw_params fp;
    char err[AGG_ERRMSG];
    (void)len; /* validated: exactly xi pairs (fw_validate_payload) */
    if (job_params(job, &fp, err, sizeof err) != 0) return -1;
    int rc = -1;
    const uint32_t n = fp.n;
    uint32_t *idx = malloc(sizeof(uint32_t) * (fp.xi > 0 ? fp.xi : 1u));
    double *val = malloc(sizeof(double) * (fp.xi > 0 ? fp.xi : 1u));
    if (fp.oja || sum->coords != (uint64_t)n * (n + 1u) / 2u || idx == NULL || val == NULL) goto out;
    uint32_t cnt = report_row(&fp, p, idx, val);
    for (uint32_t e = 0; e < cnt; e++)
        for (uint32_t f = 0; f < cnt; f++) {
            uint32_t r = idx[e], c = idx[f];
            if (r <= c) agg_sum_put(sum, tri_index(n, r, c), val[e] * val[f]);
        }
    rc = 0;
out:
    free(idx);
    free(val);
    fw_params_free(&fp);
    return rc;
}

/* The global step: dense, W from the round's sum (folded here from reports when sum is NULL, as the streaming path
 * folds them: one release, bit for bit, whichever path made the sum); Oja, from the reports. */
static int fw_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t nrep,
                   const agg_sum *folded, dprec_rng *rng, int noisy, agg_model *next, char *err, size_t errcap) {
    fw_params fp;
    if (job_params(job, &fp, err, errcap) != 0) return -1;
    const uint32_t m = job->m, d = job->d, n = fp.n;
    double sigma = 0.0, sens = 0.0, sens1 = 0.0;
    if (noisy && agg_fw_mechanism(job, &sigma, &sens, &sens1, NULL) != 0) {
        fw_params_free(&fp);
        snprintf(err, errcap, "private-fw: no mechanism for this job (budget?)");
        return -1;
    }
    memset(next, 0, sizeof *next);
    agg_sum own = {0};
    const size_t rows = fp.oja ? nrep : 0; /* the rows themselves only for Oja's steps */
    size_t nnz = 0;
    for (size_t i = 0; i < rows; i++) nnz += dprec_ld32(reports[i].payload);
    agg_fw_rows A = {rows, malloc(sizeof(size_t) * (rows + 1)), malloc(sizeof(uint32_t) * (nnz + 1)),
                     malloc(sizeof(double) * (nnz + 1))};
    double *v = malloc(sizeof(double) * n), *w = NULL;
    next->m = m;
    next->d = d;
    next->v = malloc(sizeof(float) * (size_t)m * d);
    next->bias = malloc(sizeof(float) * m);
    int rc = -1;
    if (A.off == NULL || A.idx == NULL || A.val == NULL || v == NULL || next->v == NULL || next->bias == NULL) {
        snprintf(err, errcap, "out of memory in the private-fw global step");
        goto out;
    }
    A.off[0] = 0;
    for (size_t i = 0; i < rows; i++)
        A.off[i + 1] = A.off[i] + report_row(&fp, reports[i].payload, A.idx + A.off[i], A.val + A.off[i]);
    double ev = 0.0;
    if (!fp.oja) {
        w = calloc((size_t)n * n, sizeof(double));
        if (w == NULL) {
            snprintf(err, errcap, "out of memory for the %u x %u covariance", n, n);
            goto out;
        }
        agg_fold_spec spec;
        if (folded == NULL) { /* the reports folded first, as the streaming path folds them */
            if (fw_fold_spec(job, &spec) != 1) {
                snprintf(err, errcap, "private-fw: this job has no round sum (its parameters are out of range)");
                goto out;
            }
            if (agg_sum_init(&own, &spec) != 0) {
                snprintf(err, errcap, "out of memory for the round's sum (%llu values)",
                         (unsigned long long)spec.coords);
                goto out;
            }
            for (size_t i = 0; i < nrep; i++)
                if (agg_fold_report(job, reports[i].payload, reports[i].payload_len, &own) != 0) {
                    snprintf(err, errcap, "private-fw: a stored report does not fold");
                    goto out;
                }
            folded = &own;
        }
        if (folded->coords != (uint64_t)n * (n + 1u) / 2u) {
            snprintf(err, errcap, "private-fw: the round's sum has %llu values, not n (n + 1) / 2 = %llu",
                     (unsigned long long)folded->coords, (unsigned long long)n * (n + 1u) / 2u);
            goto out;
        }
        for (uint32_t r = 0; r < n; r++) /* W = sum_i A_i^T A_i, upper triangle */
            for (uint32_t c = r; c < n; c++) w[(size_t)r * n + c] = agg_sum_value(folded, tri_index(n, r, c));
        if (noisy && agg_fw_noise_symmetric(rng, w, n, sens, sigma) != 0) {
            snprintf(err, errcap, "private-fw: noise sampler failed");
            goto out;
        }
        if (agg_fw_top_dense(w, n, v, &ev) != 0) {
            snprintf(err, errcap, "private-fw: the eigen-solver failed");
            goto out;
        }
    } else {
        double eta = noisy ? 1.0 / (sigma * sqrt((double)n * (double)fp.oja_steps)) : 0.0;
        if (!noisy) { /* no noise (tests): a step of 1 / trace(W) >= 1 / ||W|| */
            double tr = 0.0;
            for (size_t e = 0; e < nnz; e++) tr += A.val[e] * A.val[e];
            eta = tr > 0.0 ? 1.0 / tr : 1.0;
        }
        if (agg_fw_oja(&A, n, fp.oja_steps, eta, noisy ? sigma : 0.0, sens, sens1, rng, v, &ev) != 0) {
            snprintf(err, errcap, "private-fw: Oja's method failed");
            goto out;
        }
    }
    /* lambda-hat = sqrt(lambda^2) + sqrt(sigma log(n/beta)) n^(1/4) (seed 002 Alg. 1) */
    double lam = sqrt(ev > 0.0 ? ev : 0.0) + sqrt(sigma * log((double)n / fp.beta)) * pow((double)n, 0.25);
    int zero = !(lam > 0.0) || !isfinite((float)lam);
    for (uint32_t j = 0; j < m; j++) {
        next->bias[j] = fp.sub_of[j] >= 0 ? 1.0f : 0.0f;
        for (uint32_t c = 0; c < d; c++) next->v[(size_t)j * d + c] = prev->v[(size_t)j * d + c];
    }
    int64_t col = job->round - 1;
    if (col >= 0 && col < (int64_t)d)
        for (uint32_t j = 0; j < m; j++)
            next->v[(size_t)j * d + (size_t)col] = fp.sub_of[j] >= 0 && !zero ? (float)v[fp.sub_of[j]] : 0.0f;
    next->mu = zero ? 1.0f : (float)lam;
    rc = 0;
out:
    if (rc != 0) agg_model_free(next);
    agg_sum_free(&own);
    free(A.off);
    free(A.idx);
    free(A.val);
    free(v);
    free(w);
    fw_params_free(&fp);
    return rc;
}

int agg_fw_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t nrep, dprec_rng *rng,
                int noisy, agg_model *next, char *err, size_t errcap) {
    return fw_step(job, prev, reports, nrep, NULL, rng, noisy, next, err, errcap);
}

static int fw_global_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n,
                          dprec_rng *rng, agg_model *next, char *err, size_t errcap) {
    if (prev->m != job->m || prev->d != job->d) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    return fw_step(job, prev, reports, n, NULL, rng, 1, next, err, errcap);
}

static int fw_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng, agg_model *next,
                       char *err, size_t errcap) {
    if (prev->m != job->m || prev->d != job->d) {
        snprintf(err, errcap, "release shape differs from the job");
        return -1;
    }
    return fw_step(job, prev, NULL, 0, sum, rng, 1, next, err, errcap);
}

/* every report has exactly xi pairs (issue 18: the front end caps the body before reading it) */
static uint64_t fw_max_payload(const agg_job *job) {
    fw_params fp;
    char err[AGG_ERRMSG];
    if (job_params(job, &fp, err, sizeof err) != 0) return 0;
    uint64_t n = (uint64_t)dprec_fw_payload_size(fp.xi);
    fw_params_free(&fp);
    return n;
}

/* How far k reports move a round (docs/privacy.md "Poisoning"): every residual row is re-clipped to ||A_i|| <= 2L, so
 * one report moves W = sum_i A_i^T A_i by ||A_i||^2 <= 4 L^2 in Frobenius norm (the sensitivity Delta of the file's
 * head) and k reports by 4 k L^2; by Weyl's inequality the top eigenvalue moves by at most as much. The released
 * direction is a unit vector whatever the reports (its change is a matter of the eigengap, Davis-Kahan: not stated), and
 * the biases mark the public subset. */
static int fw_influence(const agg_job *job, uint64_t k, uint64_t n, agg_influence *out) {
    fw_params fp;
    char err[AGG_ERRMSG];
    (void)n;
    out->per_report = out->stat = out->release = out->bias_abs = NAN;
    if (job_params(job, &fp, err, sizeof err) != 0) return -1;
    out->per_report = 4.0 * fp.L * fp.L;
    out->stat = (double)k * out->per_report;
    fw_params_free(&fp);
    return 0;
}

const agg_protocol agg_protocol_private_fw = {
    .name = "private-fw",
    .id = DPREC_PROTO_PRIVATE_FW,
    .unit = DPREC_UNIT_USER,
    .model = DPREC_MODEL_JOINT,
    .needs_budget = 1,
    .validate_job = fw_validate_job,
    .validate_payload = fw_validate_payload,
    .max_payload = fw_max_payload,
    .initial_model = fw_initial_model,
    .global_step = fw_global_step,
    .round_step = fw_round_step,
    .unit_of = NULL,
    .privacy_extra = fw_privacy_extra,
    .influence = fw_influence,
    .fold_spec = fw_fold_spec,
    .fold = fw_fold,
    .sum_step = fw_sum_step,
};
