/* dprec aggregator core — the SGD/SGLD solver of seed 003 (agg_mf.h says what it computes; this file and its
 * siblings how). This file: the configuration, building the solver (check, layout, SGLD's preconditioner, the public
 * initialization), freeing it, and reading the model out.
 *
 * Why this layout. One pass reads every rating once and, for each, a user row and an item row of k floats, and
 * writes both back. Ratings are streamed (8 bytes each), so the cost is in the rows: a user's row is loaded once
 * per block and kept in registers over all of that user's ratings in the block (the seed's "process users
 * sequentially", Section 5.1), and the item rows come from cache whenever possible: items are renumbered by
 * popularity, so the most-rated items' rows are contiguous and stay in L1/L2 (Section 5.2's popularity tiers; under
 * a power law the top few hundred items take about a third of the ratings), and the next item's row is prefetched
 * while the current rating is updated (Section 5.3). Each user's ratings within a block are sorted by item, so the
 * popular part of the item group is walked first and in order.
 *
 * Threads. The users are dealt into P groups (by rating count, round robin, so the groups carry equal work) and the
 * items into Q groups (by popularity rank modulo Q, so every group has the same mix of popular and rare items); a
 * pass processes each of the P x Q blocks once, each block by one thread, and a thread only takes a block whose
 * user group and item group are both free (LIBMF's scheduler, Chin et al. 2015). No row is ever written by two
 * threads at the same time: no locks in the inner loop and no data race (the seed updates items "Hogwild", which in
 * C is undefined behaviour). With P = Q = 2T + 1 groups for T threads there is always a free block for a thread
 * that finishes one, even when the machine is shared and one thread stalls.
 *
 * Kernels: k is padded to a multiple of 8 (zeros that stay zero) and the inner loops work on 8-float vectors (GCC
 * vector extensions), compiled twice on x86-64: for AVX2 + FMA and for the baseline, chosen at run time.
 *
 * The files, one job each (agg_mf_priv.h holds the state they share):
 *   agg_mf.c          configuration, create / free, the model read-outs (this file)
 *   agg_mf_layout.c   the layout: rows renumbered by rating count and dealt into groups, the blocks
 *   agg_mf_kernels.c  the pass kernels: one block of SGD or of SGLD's drift, the vectorized inner loops
 *   agg_mf_pass.c     one pass: the block scheduler, the threads, SGLD's prior-and-noise step
 *   agg_mf_stream.c   SGLD's noise: AES-256-CTR keystreams and ziggurat normals
 * All of them are compiled with the kernels' options (aggregator/CMakeLists.txt), as when they were one file. */
#include "agg_mf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agg_mf_priv.h"

void agg_mf_config_default(agg_mf_config *c) {
    memset(c, 0, sizeof *c);
    c->method = AGG_MF_SGD;
    c->k = 16;
    c->threads = 1;
    c->init_scale = 0.1;
    c->seed = 1;
    c->lr = 0.05;
    c->lr_decay = 0.3;
    c->lambda = 0.05;
    c->lambda_bias = 0.01;
    c->beta = 1.0;
    c->lo = 1.0;
    c->hi = 5.0;
    c->prior_sd = 0.5;
    c->bias_prior_sd = 0.5;
    c->step = 0.1;
}

double agg_mf_noise_variance(double eta, double sd) {
    return sd * sd * -expm1(-2.0 * eta / (sd * sd));
}

/* ---- public randomness of the initialization (splitmix64: agg_mf_priv.h), never privacy noise ------------------- */

static double unit01(uint64_t *s) { /* (0, 1) */
    return ((double)(splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double public_normal(uint64_t *s) {
    return sqrt(-2.0 * log(unit01(s))) * cos(6.283185307179586 * unit01(s));
}

/* ---- create and free -------------------------------------------------------------------------------------------- */

static void *alloc32(size_t bytes) {
    size_t b = (bytes + 31u) & ~(size_t)31u;
    void *p = aligned_alloc(32, b > 0 ? b : 32);
    if (p != NULL) memset(p, 0, b > 0 ? b : 32);
    return p;
}

void agg_mf_free(agg_mf *s) {
    if (s == NULL) return;
    agg_mf_blocks_free(s);
    free(s->U);
    free(s->V);
    free(s->bu);
    free(s->bv);
    free(s->user_row);
    free(s->item_row);
    free(s->gw);
    free(s->iv);
    free(s->ou_u);
    free(s->ou_v);
    if (s->streams != NULL)
        for (unsigned t = 0; t < s->cfg.threads; t++) agg_mf_stream_wipe(&s->streams[t]);
    free(s->streams);
    free(s);
}

static int check_config(const agg_mf_data *d, const agg_mf_config *c, char *err, size_t errcap) {
    if (c->k < 1 || c->k > AGG_MF_MAX_K) return fail(err, errcap, "k must be in 1..256");
    if (c->threads < 1 || c->threads > AGG_MF_MAX_THREADS) return fail(err, errcap, "threads must be in 1..64");
    if (d->users < 1 || d->items < 1) return fail(err, errcap, "no users or no items");
    if (d->n > 0 && (d->user == NULL || d->item == NULL || d->rating == NULL)) return fail(err, errcap, "no ratings");
    if (!isfinite(c->mu) || !(c->init_scale >= 0.0 && c->init_scale <= 1e3)) return fail(err, errcap, "bad mu or init_scale");
    if (c->groups > 256) return fail(err, errcap, "groups must be at most 256");
    if (c->method == AGG_MF_SGD) {
        if (!(c->lr > 0.0 && c->lr <= 1.0) || !(c->lr_decay >= 0.0 && isfinite(c->lr_decay)) ||
            !(c->lambda >= 0.0 && c->lambda <= 1e3) || !(c->lambda_bias >= 0.0 && c->lambda_bias <= 1e3))
            return fail(err, errcap, "SGD needs 0 < lr <= 1, lr_decay >= 0, 0 <= lambda, lambda_bias <= 1000");
    } else if (c->method == AGG_MF_SGLD) {
        if (!(c->beta > 0.0 && isfinite(c->beta)) || !(c->lo < c->hi) || !isfinite(c->lo) || !isfinite(c->hi) ||
            !(c->prior_sd > 0.0 && c->prior_sd <= 1e3) || !(c->bias_prior_sd > 0.0 && c->bias_prior_sd <= 1e3) ||
            !(c->step > 0.0 && c->step <= 1.0) || !(c->mu_prior_sd >= 0.0 && c->mu_prior_sd <= 1e3))
            return fail(err, errcap, "SGLD needs beta > 0, lo < hi, prior sds in (0, 1000] (mu's in [0, 1000]), "
                                     "0 < step <= 1");
    } else {
        return fail(err, errcap, "unknown method");
    }
    for (size_t i = 0; i < d->n; i++) {
        if (d->user[i] >= d->users || d->item[i] >= d->items) return fail(err, errcap, "a rating's user or item id is out of range");
        if (!isfinite(d->rating[i])) return fail(err, errcap, "a rating is not finite");
    }
    if (c->method == AGG_MF_SGLD && c->weight != NULL)
        for (uint32_t u = 0; u < d->users; u++)
            if (!(c->weight[u] >= 0.0f && c->weight[u] <= 1e6f)) return fail(err, errcap, "a weight is not in [0, 1e6]");
    return 0;
}

int agg_mf_create(const agg_mf_data *d, const agg_mf_config *cfg, agg_mf **out, char *err, size_t errcap) {
    *out = NULL;
    if (d == NULL || cfg == NULL) return fail(err, errcap, "no data or no configuration");
    if (check_config(d, cfg, err, errcap) != 0) return -1;
    agg_mf *s = calloc(1, sizeof *s);
    if (s == NULL) return fail(err, errcap, "out of memory");
    s->cfg = *cfg;
    s->cfg.weight = NULL;
    s->k = cfg->k;
    s->kp = (cfg->k + 7u) & ~7u;
    s->users = d->users;
    s->items = d->items;
    s->n = d->n;
    s->mu = cfg->mu;
    unsigned g = cfg->groups > 0 ? cfg->groups : (cfg->threads > 1 ? 2u * cfg->threads + 1u : 1u);
    s->P = g < d->users ? g : d->users;
    s->Q = g < d->items ? g : d->items;
#ifdef MF_X86
    __builtin_cpu_init();
    s->avx2 = !cfg->portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    uint32_t *ucount = calloc(d->users, sizeof *ucount), *icount = calloc(d->items, sizeof *icount);
    uint32_t *ugroup = malloc(sizeof *ugroup * d->users), *igroup = malloc(sizeof *igroup * d->items);
    s->user_row = malloc(sizeof *s->user_row * d->users);
    s->item_row = malloc(sizeof *s->item_row * d->items);
    s->U = alloc32(sizeof(float) * (size_t)d->users * s->kp);
    s->V = alloc32(sizeof(float) * (size_t)d->items * s->kp);
    s->bu = calloc(d->users, sizeof(float));
    s->bv = calloc(d->items, sizeof(float));
    int ok = ucount && icount && ugroup && igroup && s->user_row && s->item_row && s->U && s->V && s->bu && s->bv;
    if (ok) {
        for (size_t i = 0; i < d->n; i++) {
            if (ucount[d->user[i]] == UINT32_MAX || icount[d->item[i]] == UINT32_MAX) {
                ok = 0;
                break;
            }
            ucount[d->user[i]]++;
            icount[d->item[i]]++;
        }
    }
    ok = ok && agg_mf_assign_rows(ucount, d->users, s->P, s->user_row, ugroup) == 0 &&
         agg_mf_assign_rows(icount, d->items, s->Q, s->item_row, igroup) == 0 && agg_mf_build_blocks(s, d, ugroup, igroup) == 0;
    if (ok && cfg->method == AGG_MF_SGLD) {
        /* the preconditioner: eta_row = step / curvature_row, from the rows' weighted rating counts */
        double *su = calloc(d->users, sizeof *su), *sv = calloc(d->items, sizeof *sv);
        s->gw = malloc(sizeof *s->gw * d->users);
        s->ou_u = malloc(sizeof *s->ou_u * d->users);
        s->ou_v = malloc(sizeof *s->ou_v * d->items);
        s->iv = alloc32(sizeof(float) * 4u * d->items);
        s->streams = calloc(cfg->threads, sizeof *s->streams);
        ok = su && sv && s->gw && s->ou_u && s->ou_v && s->iv && s->streams;
        if (ok) {
            for (size_t i = 0; i < d->n; i++) {
                double w = cfg->weight != NULL ? (double)cfg->weight[d->user[i]] : 1.0;
                su[d->user[i]] += w;
                sv[d->item[i]] += w;
            }
            const double sd = cfg->prior_sd, sb = cfg->bias_prior_sd, b2 = 2.0 * cfg->beta;
            if (cfg->mu_prior_sd > 0.0) { /* mu is one more coordinate, rated by every rating */
                double sum = 0.0, sr = 0.0, sm = cfg->mu_prior_sd;
                for (uint32_t x = 0; x < d->items; x++) sum += sv[x];
                s->eta_mu = cfg->step / (1.0 / (sm * sm) + b2 * sum);
                s->a_mu = exp(-s->eta_mu / (sm * sm));
                s->s_mu = sqrt(agg_mf_noise_variance(s->eta_mu, sm));
                /* with a warm-up, the chain starts mu at its mode given zero biases and factors (part of the descent
                 * toward the posterior's mode): otherwise the biases of the most-rated items, whose data outweigh
                 * their prior, take up the common offset in the first passes and hand it back to mu only at the
                 * prior's slow pace (step / (1 + their data's weight) a pass) */
                if (cfg->warmup > 0) {
                    for (size_t i = 0; i < d->n; i++) {
                        double r = d->rating[i] < cfg->lo ? cfg->lo : d->rating[i] > cfg->hi ? cfg->hi : d->rating[i];
                        sr += (cfg->weight != NULL ? (double)cfg->weight[d->user[i]] : 1.0) * r;
                    }
                    s->mu = (cfg->mu / (sm * sm) + b2 * sr) / (1.0 / (sm * sm) + b2 * sum);
                }
            }
            for (uint32_t u = 0; u < d->users; u++) {
                double w = cfg->weight != NULL ? (double)cfg->weight[u] : 1.0;
                s->gw[s->user_row[u]] = (float)(b2 * w);
            }
            for (int side = 0; side < 2; side++) {
                uint32_t nrows = side == 0 ? d->users : d->items;
                for (uint32_t x = 0; x < nrows; x++) {
                    double sum = side == 0 ? su[x] : sv[x];
                    double eta = cfg->step / (1.0 / (sd * sd) + b2 * sum * sd * sd);
                    double eta_b = cfg->step / (1.0 / (sb * sb) + b2 * sum);
                    mf_ou o;
                    o.eta = (float)eta;
                    o.a = (float)exp(-eta / (sd * sd));
                    o.s = (float)sqrt(agg_mf_noise_variance(eta, sd));
                    o.eta_b = (float)eta_b;
                    o.a_b = (float)exp(-eta_b / (sb * sb));
                    o.s_b = (float)sqrt(agg_mf_noise_variance(eta_b, sb));
                    if (side == 0) {
                        s->ou_u[s->user_row[x]] = o;
                    } else {
                        s->ou_v[s->item_row[x]] = o;
                        s->iv[4u * s->item_row[x] + 1u] = o.eta;
                        s->iv[4u * s->item_row[x] + 2u] = o.eta_b;
                    }
                }
            }
        }
        free(su);
        free(sv);
    }
    free(ucount);
    free(icount);
    free(ugroup);
    free(igroup);
    if (!ok) {
        agg_mf_free(s);
        return fail(err, errcap, "out of memory building the solver's layout");
    }
    /* initialization (public seed): SGD uniform in [0, init_scale) like LIBMF; SGLD small normals (agg_mf.h) */
    uint64_t seed = cfg->seed;
    for (int side = 0; side < 2; side++) {
        float *m = side == 0 ? s->U : s->V;
        uint32_t nrows = side == 0 ? s->users : s->items;
        for (uint32_t x = 0; x < nrows; x++) {
            for (uint32_t a = 0; a < s->k; a++)
                m[(size_t)x * s->kp + a] = cfg->method == AGG_MF_SGD ? (float)(cfg->init_scale * unit01(&seed))
                                                                       : (float)(0.1 * cfg->prior_sd * public_normal(&seed));
            *(side == 0 ? &s->bu[x] : item_bias(s, x)) =
                0.0f;
        }
    }
    *out = s;
    return 0;
}

unsigned agg_mf_passes(const agg_mf *s) {
    return s->passes;
}

/* ---- the model ------------------------------------------------------------------------------------------------ */

static double predict(const agg_mf *s, uint32_t user, uint32_t item) {
    double p = s->mu;
    if (user < s->users && item < s->items) {
        const f8 *u = (const f8 *)__builtin_assume_aligned(s->U + (size_t)s->user_row[user] * s->kp, 32);
        const f8 *v = (const f8 *)__builtin_assume_aligned(s->V + (size_t)s->item_row[item] * s->kp, 32);
        f8 acc = u[0] * v[0];
        for (uint32_t a = 1; a < s->kp / 8u; a++) acc += u[a] * v[a];
        p += (double)hsum8(acc);
    }
    if (user < s->users) p += s->bu[s->user_row[user]];
    if (item < s->items) p += *item_bias(s, s->item_row[item]);
    return p;
}

double agg_mf_rmse(const agg_mf *s, const agg_mf_data *test, double lo, double hi) {
    if (test->n == 0) return NAN;
    double sse = 0.0;
    for (size_t i = 0; i < test->n; i++) {
        double p = predict(s, test->user[i], test->item[i]);
        if (lo < hi) p = p < lo ? lo : (p > hi ? hi : p);
        double e = p - (double)test->rating[i];
        sse += e * e;
    }
    return sqrt(sse / (double)test->n);
}

double agg_mf_mu(const agg_mf *s) {
    return s->mu;
}

void agg_mf_item(const agg_mf *s, uint32_t item, float *v, float *bias) {
    const uint32_t r = s->item_row[item];
    memcpy(v, s->V + (size_t)r * s->kp, sizeof(float) * s->k);
    *bias = *item_bias(s, r);
}

void agg_mf_user(const agg_mf *s, uint32_t user, float *u, float *bias) {
    const uint32_t r = s->user_row[user];
    memcpy(u, s->U + (size_t)r * s->kp, sizeof(float) * s->k);
    *bias = s->bu[r];
}

int agg_mf_item_step(const agg_mf *s, uint32_t item, double *eta_factor, double *eta_bias) {
    if (s->cfg.method != AGG_MF_SGLD || item >= s->items) return -1;
    const mf_ou *o = &s->ou_v[s->item_row[item]];
    *eta_factor = o->eta;
    *eta_bias = o->eta_b;
    return 0;
}
