/* dprec-fleet — the comparisons (--compare) and the verdict.
 *
 * After the main job, each protocol of the list (--compare, else the main protocol's own) runs on a fresh copy of the
 * fleet (new clients and stores for the same users, as another deployment would be) at the same whole budget, with
 * its own defaults and a trusted aggregator of its own. Then the verdict of a private run: does it beat the user
 * mean, which each device has without sending anything, and each private comparison at the same budget? Its own file
 * because the comparison is a separate question from running a job: it only swaps the protocol and its defaults
 * around fleet_run_job and reads the results. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fleet_sim.h"

/* One comparison: the protocol named `name` with its own defaults (its flags as given, if any), on a fresh copy of
 * the fleet, at the main job's budget. *res gets its outcome; 0, or -1 (printed). */
static int run_compare(fleet *f, worker *ws, unsigned nthreads, const char *token, const fleet_proto *p,
                       job_result *res) {
    options *o = f->o;
    const fleet_proto *main_proto = o->proto;
    fleet_common main_c = o->c;
    o->proto = p;
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rank = FLEET_DEFAULT_RANK;
    o->c.rounds_set = o->c.rank_set = 0;
    o->c.factor_start = 0; /* a comparison starts from its own release 1, not from --opt-in's */
    o->c.start_biases_only = 0;
    o->c.lambda = -1;
    o->c.lambda_set = 0; /* the comparison's own ridge (--lambda is the main job's) */
    o->c.device_lambda_per_rating = o->device_lambda_per_rating_given;
    o->c.device_lambda_floor = o->device_lambda_floor_given;
    o->c.device_lambda_fixed = 0;
    o->c.population_rule = 0; /* the comparison's population hook sets its own */
    o->c.secure_agg = 0; /* a comparison runs with its own trusted aggregator */
    o->c.dropout = 0;
    o->c.epsilon = o->total_epsilon; /* the whole budget, which a --bias-base run spends over two jobs */
    o->c.delta = o->total_delta;
    int rc = fleet_finish_proto(p, &o->c);
    if (rc == 0 && p->population != NULL) p->population(&o->c, &f->data);
    if (rc == 0) rc = fleet_load_devices(f, ws, nthreads, 0);
    if (rc == 0) rc = fleet_run_job(f, ws, nthreads, token, 0, 0, 0, 0, res);
    else fprintf(stderr, "dprec-fleet: --compare %s: its defaults do not fit this run\n", p->name);
    o->proto = main_proto;
    o->c = main_c;
    return rc == 0 ? 0 : -1;
}

int fleet_compare_run(fleet *f, worker *ws, unsigned nthreads, const char *token, fleet_comparisons *cmp,
                      unsigned long long *failures) {
    options *o = f->o;
    const char *list = o->compare != NULL ? o->compare : (o->proto->compare != NULL ? o->proto->compare : "");
    char names[256];
    snprintf(names, sizeof names, "%s", list);
    cmp->n = 0;
    for (char *save = NULL, *name = strtok_r(names, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
        const fleet_proto *p = fleet_proto_find(name);
        if (p == NULL || p == o->proto || cmp->n == FLEET_MAX_COMPARE) continue; /* checked by fleet_parse_args */
        if (run_compare(f, ws, nthreads, token, p, &cmp->res[cmp->n]) != 0) return -1;
        *failures += cmp->res[cmp->n].failures;
        cmp->proto[cmp->n++] = p;
    }
    return 0;
}

void fleet_compare_print(const options *o, const job_result *main_res, double user_rmse,
                         const fleet_comparisons *cmp) {
    char es[32];
    for (size_t k = 0; k < cmp->n; k++) {
        fleet_fmt_eps(es, sizeof es, cmp->res[k].epsilon);
        printf("compare: %s test_rmse=%.4f epsilon=%s (%s), %s\n", cmp->proto[k]->name, cmp->res[k].rmse, es,
               dprec_model_name(cmp->res[k].model),
               cmp->proto[k]->summary != NULL ? cmp->proto[k]->summary : cmp->proto[k]->name);
    }
    /* the verdict of a private run: does it beat what its devices have for free, and the private bias model at the
     * same budget? */
    if (main_res->model != DPREC_MODEL_NONE && isfinite(main_res->rmse)) {
        fleet_fmt_eps(es, sizeof es, main_res->epsilon);
        if (!(main_res->rmse < user_rmse))
            printf("verdict: %s at epsilon = %s%s does not beat the user mean (%.4f > %.4f), which each device has "
                   "without sending anything: at this budget and fleet size it learns nothing worth its privacy\n",
                   o->proto->name, es,
                   main_res->model == DPREC_MODEL_POSTERIOR_HEURISTIC ? " (posterior-sampling heuristic)" : "",
                   main_res->rmse, user_rmse);
        for (size_t k = 0; k < cmp->n; k++) {
            if (cmp->res[k].model == DPREC_MODEL_NONE || !isfinite(cmp->res[k].rmse)) continue;
            if (main_res->rmse < cmp->res[k].rmse)
                printf("verdict: %s (%.4f) beats %s (%.4f) at the same budget\n", o->proto->name, main_res->rmse,
                       cmp->proto[k]->name, cmp->res[k].rmse);
            else
                printf("verdict: %s (%.4f) does NOT beat %s (%.4f) at the same budget: use %s at epsilon = %s\n",
                       o->proto->name, main_res->rmse, cmp->proto[k]->name, cmp->res[k].rmse, cmp->proto[k]->name, es);
        }
    }
}
