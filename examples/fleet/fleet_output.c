/* dprec-fleet — what the fleet prints: the data and baselines lines, each job's line and per-round table, the
 * --csv file and the --plot, the guarantee lines, and the closing lines (the final line last).
 *
 * The output is a contract: tests/fleet_*.cmake and scripts read these lines (the final line, the ledger line), so
 * their words and formats stay as they are; every epsilon is printed rounded up (fleet_fmt_eps). Its own file so that
 * the formats sit together, away from the loop that computes the figures (fleet_run.c) and from main(). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_sim.h"

/* An epsilon as every summary prints it: rounded up (dprec_format_up), "n/a" when unknown. */
void fleet_fmt_eps(char *out, size_t cap, double e) {
    if (isnan(e) || dprec_format_up(e, out, cap) != DPREC_OK) snprintf(out, cap, "n/a");
}

/* ---- before the jobs ------------------------------------------------------------------------------------- */

void fleet_print_data(const options *o, const fleet_data *d, const fleet_baselines *b) {
    printf("data: %s: %u users, %u items, %zu ratings (%zu train, %zu test, seed %llu), scale %g..%g\n",
           o->data ? o->data : o->synthetic, d->num_users, d->num_items, d->num_ratings,
           d->num_ratings - b->ntest, b->ntest, (unsigned long long)o->c.seed, (double)d->rating_min,
           (double)d->rating_max);
    printf("baselines: global mean %.4f -> test RMSE %.4f; item mean test RMSE %.4f; user mean test RMSE %.4f (the "
           "first two without privacy; the user mean from each device's own ratings, at no privacy cost)\n", b->mean,
           b->global_rmse, b->item_rmse, b->user_rmse);
}

/* ---- a job ----------------------------------------------------------------------------------------------- */

void fleet_print_job(const fleet *f, unsigned nthreads, int main_job) {
    const options *o = f->o;
    char dl[64];
    if (o->c.device_lambda_per_rating > 0 && o->c.device_lambda_floor > 0)
        snprintf(dl, sizeof dl, "%g x ratings, at least %g", o->c.device_lambda_per_rating, o->c.device_lambda_floor);
    else if (o->c.device_lambda_per_rating > 0) snprintf(dl, sizeof dl, "%g x ratings", o->c.device_lambda_per_rating);
    else snprintf(dl, sizeof dl, "%g", o->device_lambda > 0 ? o->device_lambda : o->c.lambda);
    if (main_job) {
        printf("job %llu: protocol %s, d = %u, lambda = %g (devices: %s), %u rounds, %u devices, %u threads\n",
               (unsigned long long)f->job, o->proto->name, o->c.rank, o->c.lambda, dl, o->c.rounds, f->data.num_users,
               nthreads);
        if (o->proto->describe != NULL) o->proto->describe(&o->c, &f->data);
    } else if (!o->quiet) {
        fprintf(stderr, "%s: job %llu: protocol %s, d = %u, %u rounds\n", o->c.base_model ? "base" : f->optin_only ? "opt-in" : o->audit_two_world > 0 ? "audit run" : "compare",
                (unsigned long long)f->job, o->proto->name, o->c.rank, o->c.rounds);
    }
}

void fleet_print_secagg_plan(fleet *f) {
    char err[1024] = "";
    char vpath[64];
    snprintf(vpath, sizeof vpath, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
    cJSON *v = fleet_call_json(f, 1, "GET", vpath, NULL, NULL, 200, err, sizeof err);
    const cJSON *pv = v != NULL ? cJSON_GetObjectItemCaseSensitive(v, "privacy") : NULL;
    const cJSON *sa = pv != NULL ? cJSON_GetObjectItemCaseSensitive(pv, "secagg") : NULL;
    if (sa != NULL)
        printf("secure aggregation: %g neighbours, threshold %g, n_min %g of n_max %g, vector %g -> D = %g, b = %g bits, "
               "gamma = 2^%g, share variance %.6g, z = %.6g\n",
               fleet_json_num(sa, "neighbours", NAN), fleet_json_num(sa, "threshold", NAN),
               fleet_json_num(sa, "n_min", NAN), fleet_json_num(sa, "n_max", NAN), fleet_json_num(sa, "d", NAN),
               fleet_json_num(sa, "dim", NAN), fleet_json_num(sa, "bits", NAN), fleet_json_num(sa, "gamma_log2", NAN),
               fleet_json_num(sa, "share_num", NAN) / 1024.0,
               fleet_json_num(pv, "noise_multiplier", NAN));
    cJSON_Delete(v);
}

void fleet_print_round_head(void) {
    printf("%5s %9s %10s %8s %8s\n", "round", "reported", "test_rmse", "epsilon", "seconds");
}

void fleet_print_round(unsigned r, unsigned long long reported, double rmse, const char *eps, double secs) {
    printf("%5u %9llu %10.4f %8s %8.2f\n", r, reported, rmse, eps, secs);
}

FILE *fleet_csv_open(const char *path) {
    FILE *csv = fopen(path, "w");
    if (csv == NULL) {
        fprintf(stderr, "dprec-fleet: cannot write %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fprintf(csv, "round,reported,test_rmse,epsilon,seconds\n");
    return csv;
}

void fleet_csv_round(FILE *csv, unsigned r, unsigned long long reported, double rmse, const char *eps, double secs) {
    fprintf(csv, "%u,%llu,%.6f,%s,%.3f\n", r, reported, rmse, eps, secs);
    fflush(csv);
}

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

void fleet_draw_plot(const options *o, const char *csv, double gm, double im, double um) {
    if (!have_gnuplot()) {
        fprintf(stderr, "dprec-fleet: gnuplot is not installed (Debian: apt-get install gnuplot-nox); "
                        "no plot, the CSV is %s\n", csv);
        return;
    }
    FILE *g = popen("gnuplot", "w");
    if (g == NULL) {
        fprintf(stderr, "dprec-fleet: cannot run gnuplot: %s\n", strerror(errno));
        return;
    }
    fprintf(g, "set terminal pngcairo size 900,540 noenhanced\n");
    fprintf(g, "set output '%s'\n", o->plot);
    fprintf(g, "set datafile separator ','\n");
    fprintf(g, "set title 'dprec-fleet: protocol %s, d = %u, lambda = %g'\n", o->proto->name, o->c.rank, o->c.lambda);
    fprintf(g, "set xlabel 'round'\nset ylabel 'test RMSE'\nset grid\nset key top right\n");
    fprintf(g, "plot '%s' every ::1 using 1:3 with linespoints lw 2 title '%s', "
               "%.6f with lines dt 2 title 'item mean', %.6f with lines dt 4 title 'user mean (free)', "
               "%.6f with lines dt 3 title 'global mean'\n",
            csv, o->proto->name, im, um, gm);
    int rc = pclose(g);
    if (rc != 0) fprintf(stderr, "dprec-fleet: gnuplot failed (status %d)\n", rc);
    else printf("plot: %s\n", o->plot);
}

void fleet_print_secagg_stored(fleet *f) {
    /* what the aggregator kept: with secure aggregation no report (masked or not) is stored as a report; the masked
     * inputs live for their round only, in memory (on a shared PostgreSQL state also in the round's log, deleted with
     * the round's commit: docs/privacy.md, "Secure aggregation") */
    unsigned char *mt = NULL;
    size_t mlen = 0;
    int ms = fleet_conn_call(f->conn, 1, "GET", "/metrics", NULL, NULL, NULL, 0, &mt, &mlen);
    const char *at = ms == 200 && mt != NULL ? strstr((const char *)mt, "\ndprec_committed_reports_total ") : NULL;
    if (at != NULL)
        printf("secure aggregation: reports stored by the aggregator: %llu (as reports in its state database; the "
               "masked inputs were kept for their round only)\n",
               strtoull(at + strlen("\ndprec_committed_reports_total "), NULL, 10));
    else
        printf("secure aggregation: reports stored by the aggregator: unknown (no metrics)\n");
    free(mt);
}

void fleet_print_guarantee(const options *o, const dprec_guarantee *g, const cJSON *priv) {
    char gtext[512];
    dprec_guarantee_text(g, gtext, sizeof gtext);
    printf("guarantee: %s%s\n", gtext,
           o->subset_from_data ? "; NOT covered: the item subset (--items-top) was chosen from the users' own "
                                "ratings (a simulation shortcut; a deployment takes it from public metadata)"
                              : "");
    double user_eps = priv != NULL ? fleet_json_num(priv, "user_epsilon", NAN) : NAN;
    if (g->unit == DPREC_UNIT_RATING && !isnan(user_eps)) {
        char ue[32], ud[32];
        fleet_fmt_eps(ue, sizeof ue, user_eps);
        fleet_fmt_eps(ud, sizeof ud, fleet_json_num(priv, "user_delta", g->delta));
        printf("guarantee at user level: epsilon = %s, delta = %s (what each device counts against its user cap)\n",
               ue, ud);
    }
}

/* ---- after the jobs -------------------------------------------------------------------------------------- */

void fleet_print_base(const options *o, const job_result *base_res) {
    char be[32], bd[32];
    fleet_fmt_eps(be, sizeof be, base_res->epsilon);
    fleet_fmt_eps(bd, sizeof bd, base_res->delta);
    printf("base: job %llu, the private bias model at d = %u (%s), %u rounds, test RMSE %.4f, epsilon = %s, "
           "delta = %s (user level, %s)\n", (unsigned long long)o->base_job, o->c.rank, fleet_proto_base_model()->name,
           base_res->rounds, base_res->rmse, be, bd, dprec_model_name(base_res->model));
}

void fleet_print_with_base(const job_result *main_res) {
    char be[32], bd[32];
    fleet_fmt_eps(be, sizeof be, main_res->epsilon);
    fleet_fmt_eps(bd, sizeof bd, main_res->delta);
    printf("guarantee with the base job: epsilon = %s, delta = %s at user level (the two jobs' sum, basic "
           "composition); it holds with the aggregator trusted, as the base job's joint DP needs%s\n", be, bd,
           main_res->model == DPREC_MODEL_LOCAL ? " (an untrusted one sees that job's reports: the local job's "
                                                  "epsilon alone covers only its own)" : "");
}

void fleet_print_baselines(const fleet_baselines *b, double wall_s) {
    printf("baselines: global mean %.4f, item mean %.4f; user mean %.4f; wall time %.1f s\n", b->global_rmse,
           b->item_rmse, b->user_rmse, wall_s);
}

void fleet_print_final(const options *o, const job_result *main_res) {
    char es[32], ds[32];
    fleet_fmt_eps(es, sizeof es, main_res->epsilon);
    fleet_fmt_eps(ds, sizeof ds, main_res->delta);
    printf("final: protocol=%s rounds=%u test_rmse=%.4f epsilon=%s delta=%s%s\n", o->proto->name, main_res->rounds,
           main_res->rmse, es, ds,
           main_res->model == DPREC_MODEL_POSTERIOR_HEURISTIC
               ? " (posterior-sampling heuristic: exact for an exact posterior sample only, the chain's delta' unknown)"
               : "");
}
