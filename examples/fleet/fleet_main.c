/* dprec-fleet — a simulated fleet of devices: one real SDK client per user (its own store), syncing with a
 * real aggregator round after round, and the test RMSE each user would get from each release.
 *
 * main() is the run's outline: the options (fleet_options.c), the data and its baselines, the aggregator
 * (fleet_conn.c), the devices (fleet_device.c), --bias-base's job then the job itself (fleet_run.c), the comparisons
 * and the verdict (fleet_compare.c), and the closing lines, the final line last (fleet_output.c). fleet_sim.h is
 * what these pieces share.
 *
 * Host program code: it uses stdio, malloc and pthreads freely (the SDK underneath does not). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fleet_sim.h"

/* The threads' device transports, the devices' release key and signature memo, and the fleet's own registration
 * (*token: it fetches one copy of each release for the evaluation). 0, or -1 (printed). */
static int start(fleet *f, worker *ws, unsigned nthreads, char **token) {
    char err[1024] = "";
    for (unsigned i = 0; i < nthreads; i++) {
        ws[i].f = f;
        ws[i].index = (int)i;
        if (fleet_conn_transport(f->conn, &ws[i].t, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: transport: %s\n", err);
            return -1;
        }
    }
    DPREC_STRUCT_INIT(&f->scfg); /* this build's layout: a zero struct_size would mean 0.2.0's, without its newer fields */
    f->scfg.release_key = fleet_conn_release_key(f->conn, &f->scfg.release_key_len);
    if (f->o->enroll) { /* the app configured its enrollment key: secure rounds check their devices' tokens */
        f->scfg.enrollment_key = f->o->conn.enrollment_key;
        f->scfg.enrollment_key_len = f->o->conn.enrollment_key_len;
    }
    if (!f->o->verify_each) {
        f->scfg.verified_seen = fleet_sig_memo_seen;
        f->scfg.verified_remember = fleet_sig_memo_remember;
    }
    char reg[1024] = "{\"platform\":\"dprec-fleet\"}";
    if (f->o->enroll && fleet_enroll_register_body(reg, sizeof reg) != DPREC_OK) {
        fprintf(stderr, "dprec-fleet: cannot enroll the fleet's evaluator\n");
        return -1;
    }
    cJSON *j = fleet_call_json(f, 0, "POST", "/v1/register", NULL, reg, 201, err, sizeof err);
    const cJSON *tok = j ? cJSON_GetObjectItemCaseSensitive(j, "token") : NULL;
    if (!cJSON_IsString(tok)) {
        fprintf(stderr, "dprec-fleet: registering the fleet's evaluator: %s\n", j ? "no token" : err);
        cJSON_Delete(j);
        return -1;
    }
    *token = strdup(tok->valuestring);
    cJSON_Delete(j);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int prc = fleet_parse_args(argc, argv, &o);
    if (prc != 0) return prc == 1 ? 0 : prc;
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef DPREC_AUDIT_WEAKEN
    printf("WARNING: a weakened test build (DPREC_AUDIT_WEAKEN): the central Gaussian noise is a tenth of the claims' and "
           "the local sign randomizer runs at ten times its epsilon; no figure of this build is a guarantee\n");
#endif
    double t_start = fleet_now_s();
    char err[1024] = "";
    static fleet f;
    memset(&f, 0, sizeof f);
    f.o = &o;
    f.secure_step = -1;
    pthread_mutex_init(&f.lock, NULL);
    if (fleet_load_data(&o, &f.data, err, sizeof err) != 0 || fleet_filter_items(&o, &f.data) != 0 ||
        fleet_data_split(&f.data, o.test_fraction, o.c.seed) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    fleet_baselines base;
    fleet_data_baselines(&f.data, &base.global_rmse, &base.item_rmse, &base.user_rmse, &base.mean, &base.ntest);
    fleet_print_data(&o, &f.data, &base);
    if (o.proto->population != NULL) o.proto->population(&o.c, &f.data); /* the defaults that follow the population */
    if (fleet_audit_setup(&f) != 0) return 1; /* --audit-canaries: the canaries join the data (after its baselines) */

    if (o.store_dir != NULL && mkdir(o.store_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "dprec-fleet: cannot create %s: %s\n", o.store_dir, strerror(errno));
        return 1;
    }
    if (o.enroll) { /* the fleet as the app's backend: the services enroll with its key */
        if (fleet_enroll_init(&o.conn.enrollment_key, &o.conn.enrollment_key_len, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s\n", err);
            return 1;
        }
        o.conn.app_id = fleet_app_id;
    }
    if (fleet_conn_open(&o.conn, &f.conn, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: aggregator: %s\n", err);
        return 1;
    }
    printf("aggregator: %s\n", fleet_conn_describe(f.conn));
    int exit_code = 1;
    unsigned nthreads = o.threads;
    worker *ws = calloc(nthreads, sizeof *ws);
    f.dev = calloc(f.data.num_users, sizeof *f.dev);
    char *fleet_token = NULL;
    job_result main_res, base_res;
    fleet_comparisons cmp;
    memset(&main_res, 0, sizeof main_res);
    memset(&base_res, 0, sizeof base_res);
    memset(&cmp, 0, sizeof cmp);
    if (ws == NULL || f.dev == NULL) {
        fprintf(stderr, "dprec-fleet: out of memory\n");
        goto out;
    }
    if (start(&f, ws, nthreads, &fleet_token) != 0) goto out;
    if (fleet_audit_start(&f, ws, nthreads) != 0) goto out;
    if (o.audit_two_world > 0) { /* the multi-run audit instead of one job (fleet_audit.c) */
        int exceeded = 0;
        if (fleet_audit_two_world(&f, ws, nthreads, fleet_token, &exceeded) != 0) goto out;
        exit_code = exceeded ? 1 : 0;
        goto out;
    }

    /* the devices and the job (after --bias-base's job, on the same devices) */
    /* with the aggregator's population rule the devices' line waits for the job's choice (fleet_run_job) */
    if (fleet_load_devices(&f, ws, nthreads, !o.c.population_rule) != 0) goto out;
    if (fleet_poison_start(&f, ws, nthreads) != 0) goto out;
    if (o.bias_base > 0) {
        if (fleet_run_base(&f, ws, nthreads, fleet_token, &base_res) != 0) goto out;
        fleet_print_base(&o, &base_res);
    }
    if (o.opt_in > 0) { /* the opt-in devices' plain job first: the main job's start */
        for (uint32_t u = 0; u < f.data.num_users; u++) f.opted_in += f.dev[u].opted_in != 0;
        if (f.opted_in == 0) {
            fprintf(stderr, "dprec-fleet: --opt-in %g: no device of %u opted in; a larger share, or more devices\n",
                    o.opt_in, f.data.num_users);
            goto out;
        }
        if (fleet_run_optin(&f, ws, nthreads, fleet_token, &base_res) != 0) goto out;
        printf("opt-in: %u of %u devices opted in (each by a coin of probability %g from the seed) and shared their "
               "ratings in job %llu (plain, %u rounds, its clips ||u|| <= %g and |residual| <= %g bounding what any of "
               "them moves; no privacy for them; they sit out the private job, whose reports their ledgers' unbounded "
               "charge now refuses); the %u others sent it nothing: their test RMSE on its release %.4f (over every "
               "device %.4f)\n", f.opted_in, f.data.num_users, o.opt_in, (unsigned long long)o.base_job, base_res.rounds,
               FLEET_START_U_CLIP * (f.data.rating_max - f.data.rating_min),
               FLEET_START_RESIDUAL_CLIP * (f.data.rating_max - f.data.rating_min), f.data.num_users - f.opted_in,
               base_res.rmse, f.rmse_all);
    }
    if (fleet_run_job(&f, ws, nthreads, fleet_token, 1, base.global_rmse, base.item_rmse, base.user_rmse,
                      &main_res) != 0) goto out;
    unsigned long long failures = main_res.failures + base_res.failures;
    if (o.opt_in > 0)
        printf("opt-in: every test RMSE of the jobs (their rounds, the comparisons, the final line) is the %u devices' "
               "that did not opt in, whose guarantee is job %llu's alone (its start does not depend on their data); "
               "over every device %.4f; the baselines are every device's; the %u opt-in devices have no guarantee "
               "(they sent their ratings in job %llu)\n", f.data.num_users - f.opted_in, (unsigned long long)f.job,
               f.rmse_all, f.opted_in, (unsigned long long)o.base_job);
    if (o.bias_base > 0) { /* the user's guarantee is both jobs' (basic composition, as each device's ledger adds them) */
        main_res.epsilon += base_res.epsilon;
        main_res.delta += base_res.delta;
        fleet_print_with_base(&main_res);
    }

    /* the comparisons (--compare), each on a fresh copy of the fleet at the same budget */
    if (fleet_compare_run(&f, ws, nthreads, fleet_token, &cmp, &failures) != 0) goto out;

    int poison_failed = fleet_poison_print(&f); /* --malicious: how far they moved the job, against its bounds */
    fleet_print_baselines(&base, fleet_now_s() - t_start);
    fleet_compare_print(&o, &main_res, base.user_rmse, &cmp);
    fleet_print_final(&o, &main_res);
    int audit_failed = fleet_audit_print(&f); /* --audit-canaries: the bound beside the claim, its line last */
    /* a figure over part of the fleet is not the figure asked for: say so, and fail */
    if (failures > 0)
        fprintf(stderr, "dprec-fleet: %llu device failures over the run (see above); exit status 1\n", failures);
    if (poison_failed)
        fprintf(stderr, "dprec-fleet: --malicious: a bound was exceeded or none could be checked; exit status 1\n");
    if (audit_failed)
        fprintf(stderr, "dprec-fleet: --audit-canaries: the lower bound exceeds the claimed epsilon, or no bound could be "
                        "computed; exit status 1\n");
    exit_code = isfinite(main_res.rmse) && failures == 0 && !poison_failed && !audit_failed ? 0 : 1;

out:
    free(fleet_token);
    fleet_poison_free(&f);
    fleet_audit_free(&f);
    free(f.release);
    free(o.item_subset);
    if (f.dev != NULL) {
        fleet_free_devices(&f);
        free(f.dev);
    }
    if (ws != NULL)
        for (unsigned i = 0; i < nthreads; i++)
            if (ws[i].t.request != NULL) fleet_conn_transport_free(f.conn, &ws[i].t);
    free(ws);
    fleet_conn_close(f.conn);
    fleet_data_free(&f.data);
    pthread_mutex_destroy(&f.lock);
    return exit_code;
}
