/* dprec aggregator core — the job's privacy budget: a round that would take the job past its budget is
 * never opened (docs/protocol.md, job spec). The accountant is rebuilt from the number of rounds, since every
 * round of a job runs the same mechanism; sdk/accountant.c holds the formulas. */
#include <math.h>

#include "agg_priv.h"
#include "dprec/status.h"

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
