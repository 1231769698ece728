/* dprec aggregator core — the job's privacy budget: a round that would take the job past its budget is
 * never opened (docs/protocol.md, job spec). The accountant is rebuilt from the number of rounds, since every
 * round of a job runs the same mechanism; common/accountant.c holds the formulas.
 *
 * In protocols/ (agg_protocol.h), below the round engine that applies the gate: the central protocols calibrate their
 * noise from the budget (agg_budget_multiplier, agg_grid_allowance) and show its epsilon in their job views, and a
 * protocol may call nothing above its layer (docs/architecture.md). */
#include <math.h>
#include <pthread.h>

#include "agg_protocol.h"
#include "dprec/status.h"
#include "gauss.h"

int agg_budget_check(const agg_job *job, int64_t rounds, double *epsilon) {
    if (epsilon != NULL) *epsilon = 0.0;
    if (job == NULL || job->proto == NULL || rounds < 0) return -1;
    if (job->proto->round_step == NULL) {
        if (epsilon != NULL) *epsilon = rounds > 0 ? INFINITY : 0.0;
        return 1;
    }
    if (rounds == 0) return 1;
    if (!job->has_budget || !(job->budget_delta >= 0.0 && job->budget_delta < 1.0)) return 0;
    dprec_step step;
    if (job->proto->round_step(job, &step) != 0 || step.steps == 0) return -1;
    step.steps *= (uint64_t)rounds;
    if (job->budget_delta == 0.0) {
        /* A pure budget (delta = 0) takes pure steps only, composed by addition (DR14 Thm. 3.16), the same sum
         * the accountant forms: steps * epsilon. */
        if (step.kind != DPREC_STEP_PURE) return 0;
        double eps = (double)step.steps * step.epsilon;
        if (epsilon != NULL) *epsilon = eps;
        return eps <= job->budget_epsilon ? 1 : 0;
    }
    dprec_accountant acc;
    dprec_accountant_init(&acc);
    double eps = INFINITY;
    int rc = dprec_accountant_try_add(&acc, &step, job->budget_epsilon, job->budget_delta, DPREC_CONVERSION_CKS,
                                      &eps);
    if (epsilon != NULL) *epsilon = eps;
    if (rc == DPREC_OK) return 1;
    return rc == DPREC_ERR_BUDGET_EXCEEDED ? 0 : -1;
}

/* The inverted accountant is costly (tens of ms) and every round asks again: a few recent answers are kept,
 * keyed by everything they depend on. */
typedef struct z_cache_line {
    double eps, delta, q, z;
    int64_t rounds;
} z_cache_line;
static pthread_mutex_t z_mu = PTHREAD_MUTEX_INITIALIZER;
static z_cache_line z_cache[8];
static unsigned z_next;

int agg_budget_multiplier(const agg_job *job, double *z) {
    if (!job->has_budget || !(job->budget_delta > 0.0) || job->rounds < 1) return -1;
    double q = job->participation;
    pthread_mutex_lock(&z_mu);
    for (unsigned i = 0; i < 8; i++) {
        const z_cache_line *l = &z_cache[i];
        if (l->z > 0 && l->eps == job->budget_epsilon && l->delta == job->budget_delta && l->q == q &&
            l->rounds == job->rounds) {
            *z = l->z;
            pthread_mutex_unlock(&z_mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&z_mu);
    double found;
    if (dprec_gauss_noise_multiplier(job->budget_epsilon, job->budget_delta, (uint64_t)job->rounds, q, &found) !=
        DPREC_OK)
        return -1;
    pthread_mutex_lock(&z_mu);
    z_cache[z_next % 8] = (z_cache_line){job->budget_epsilon, job->budget_delta, q, found, job->rounds};
    z_next++;
    pthread_mutex_unlock(&z_mu);
    *z = found;
    return 0;
}

int agg_grid_allowance(double sens, double z, uint64_t coords, double *sens_eff) {
    /* common/noise.h: noising N = coords coordinates one call each, the rounded vector's L2 sensitivity is at most
     * Delta + sqrt(N) g, with the grid g = 2^(ceil(log2 sigma) - 20) chosen from sigma. Since
     * 2^ceil(log2 sigma) < 2 sigma, g <= sigma 2^-19. With sigma = z S and
     *   S = Delta / (1 - sqrt(N) z 2^-19),
     * Delta + sqrt(N) g <= Delta + sqrt(N) z S 2^-19 = S: S bounds the rounded vector's sensitivity, so the
     * noise keeps the multiplier z for it. When sqrt(N) z 2^-19 >= 1 no S works (the grid's rounding alone
     * would need more noise than it adds): the caller refuses the job, never runs it with less. */
    double a = sqrt((double)coords) * z * 0x1p-19;
    if (!(a < 1.0) || !(sens > 0.0) || !(z > 0.0)) return -1;
    double s_eff = sens / (1.0 - a);
    if (!isfinite(s_eff) || !isfinite(z * s_eff)) return -1;
    *sens_eff = s_eff;
    return 0;
}
