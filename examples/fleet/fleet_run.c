/* dprec-fleet — one job against the aggregator, as its operator: create it, run its rounds, read its guarantee.
 *
 * A job is created from its protocol's spec (fleet_proto.h), then each round is one sync pass over the devices (four
 * with secure aggregation, one per phase), closed by the operator when it did not close by itself, followed by the
 * round's release, which the devices are evaluated on. After the last round the job's guarantee is read from the
 * aggregator and checked against every device's own ledger: a device that charged more than the published figure is
 * a failure of the run. --bias-base's job runs here too, before the main one. Its own file because this is the
 * fleet's side of the protocol with the aggregator (the admin routes, round closing, releases); the devices' side is
 * fleet_device.c, and what is printed is fleet_output.c's. */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_sim.h"

/* ---- talking to the aggregator as operator -------------------------------------------------------------- */

cJSON *fleet_call_json(fleet *f, int admin, const char *method, const char *path, const char *bearer,
                       const char *body, int want, char *err, size_t errcap) {
    unsigned char *resp;
    size_t len;
    int st = fleet_conn_call(f->conn, admin, method, path, bearer, "application/json", body,
                             body ? strlen(body) : 0, &resp, &len);
    if (st < 0) {
        snprintf(err, errcap, "%s %s: %s", method, path, dprec_strerror(st));
        return NULL;
    }
    if (st != want) {
        snprintf(err, errcap, "%s %s: HTTP %d %.300s", method, path, st, resp ? (const char *)resp : "");
        free(resp);
        return NULL;
    }
    cJSON *j = cJSON_Parse((const char *)resp);
    if (j == NULL) snprintf(err, errcap, "%s %s: the response is not JSON", method, path);
    free(resp);
    return j;
}

double fleet_json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "inf") == 0) return INFINITY;
        char *end;
        double x = strtod(v->valuestring, &end);
        if (end != v->valuestring) return x;
    }
    return dflt;
}

static int fetch_release(fleet *f, const char *token, char *err, size_t errcap) {
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%llu/releases/latest", (unsigned long long)f->job);
    free(f->release);
    f->release = NULL;
    int st = fleet_conn_call(f->conn, 0, "GET", path, token, NULL, NULL, 0, &f->release, &f->release_len);
    if (st != 200) {
        snprintf(err, errcap, "GET %s: %s %.200s", path, st < 0 ? dprec_strerror(st) : "HTTP error",
                 f->release ? (const char *)f->release : "");
        return -1;
    }
    dprec_release_info info;
    int rc = dprec_release_check(f->release, f->release_len, &info);
    f->release_info = info;
    if (rc != DPREC_OK) {
        snprintf(err, errcap, "the latest release is invalid: %s", dprec_strerror(rc));
        return -1;
    }
    return 0;
}

/* Runs one job of the selected protocol (f->o->proto, f->o->c) on the loaded devices, to its last round. The
 * main job prints its rounds, CSV, plot, guarantee and ledger lines; a comparison job only its progress. 0, or -1
 * on an error that ends the run (printed). */
int fleet_run_job(fleet *f, worker *ws, unsigned nthreads, const char *token, int main_job, double gm, double im,
                  double um, job_result *res) {
    options *o = f->o;
    char err[1024] = "";
    cJSON *j = NULL;
    FILE *csv = NULL;
    char csv_tmp[PATH_MAX] = "";
    int ok = -1;
    /* --malicious poisons the main job, or with --opt-in the start: the sybils are among the opted-in devices */
    const int poisoned = o->opt_in > 0 ? f->optin_only : main_job;
    memset(res, 0, sizeof *res);
    res->rmse = NAN;
    res->epsilon = INFINITY;

    static char spec[16384];
    const fleet_job_hooks *hooks = fleet_proto_hooks(o->proto);
    if (hooks != NULL) { /* a service of the protocol's own (dpmf's relay), started as the aggregator was */
        if (hooks->job_begin(&o->c, &o->conn, nthreads, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s: %s\n", o->proto->name, err);
            goto out;
        }
        for (unsigned i = 0; i < nthreads; i++) ws[i].relay = hooks->worker_relay(i);
    }
    o->proto->spec(&o->c, &f->data, spec, sizeof spec);
    if (o->release_encoding != NULL && strcmp(o->release_encoding, "f32") != 0 && spec[0] == '{') { /* in the spec */
        static char with[sizeof spec + 64];
        snprintf(with, sizeof with, "{\"release_encoding\":\"%s\",%s", o->release_encoding, spec + 1);
        memcpy(spec, with, sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
    }
    const int unc = fleet_proto_release_uncertainty(o->proto, o->c.secure_agg);
    /* items' uncertainty; --opt-in's start carries its own (its values from few raters: docs/privacy.md) */
    if (unc > 0 && (o->uncertainty > 0 || (o->uncertainty < 0 && (unc == 2 || f->optin_only))) && spec[0] == '{') {
        static char with[sizeof spec + 64];
        snprintf(with, sizeof with, "{\"release_uncertainty\":true,%s", spec + 1);
        memcpy(spec, with, sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
    }
    if (main_job && o->base_job > 0 && spec[0] == '{') { /* --bias-base: the job starts from the base's biases */
        static char with[sizeof spec + 64];        /* --opt-in: and its factors */
        snprintf(with, sizeof with, "{\"base_job\":%llu,%s%s", (unsigned long long)o->base_job,
                 o->base_factors ? "\"base_factors\":true," : "", spec + 1);
        memcpy(spec, with, sizeof spec - 1);
        spec[sizeof spec - 1] = '\0';
    }
    j = fleet_call_json(f, 1, "POST", "/v1/admin/jobs", NULL, spec, 201, err, sizeof err);
    if (j == NULL) {
        fprintf(stderr, "dprec-fleet: creating the %s job: %s\n", o->proto->name, err);
        goto out;
    }
    f->job = (uint64_t)fleet_json_num(j, "job", 0);
    if (f->job != 0 && o->c.population_rule && fleet_proto_rule_applied(o->proto) != NULL) {
        /* d, the rounds and the devices' ridge as the aggregator's population rule chose them for the job */
        int changed = fleet_proto_rule_applied(o->proto)(&o->c, &f->data, j);
        if (changed < 0 || (changed > 0 && fleet_load_devices(f, ws, nthreads, 0) != 0)) goto out;
        if (main_job) fleet_print_devices(f);
    }
    const cJSON *jpriv = cJSON_GetObjectItemCaseSensitive(j, "privacy");
    const cJSON *jmodel = jpriv != NULL ? cJSON_GetObjectItemCaseSensitive(jpriv, "model") : NULL;
    int heuristic = cJSON_IsString(jmodel) && strcmp(jmodel->valuestring, dprec_model_name(DPREC_MODEL_POSTERIOR_HEURISTIC)) == 0;
    cJSON_Delete(j);
    j = NULL;
    if (f->job == 0) {
        fprintf(stderr, "dprec-fleet: creating the job: no job id in the response\n");
        goto out;
    }
    if (hooks != NULL && hooks->job_created(&o->c, f->job, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s: %s\n", o->proto->name, err);
        goto out;
    }
    f->scfg.job_id = f->job;
    fleet_audit_job_begin(f);
    if (poisoned && fleet_poison_job_begin(f, spec, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err);
        goto out;
    }

    const char *csv_path = main_job ? o->csv : NULL;
    if (main_job && csv_path == NULL && o->plot != NULL) {
        snprintf(csv_tmp, sizeof csv_tmp, "%s.csv", o->plot);
        csv_path = csv_tmp;
    }
    if (csv_path != NULL && (csv = fleet_csv_open(csv_path)) == NULL) goto out;

    fleet_print_job(f, nthreads, main_job);
    /* round 0: the initial release, before any report */
    double t0 = fleet_now_s();
    if (fetch_release(f, token, err, sizeof err) != 0) {
        fprintf(stderr, "dprec-fleet: %s\n", err);
        goto out;
    }
    if (main_job && f->release_info.format_version == DPREC_RELEASE_FORMAT_COLUMNS)
        printf("releases: with each item's uncertainty (release format 3); the devices shrink noisy items toward their "
               "own level (docs/privacy.md \"Release uncertainty\"; --uncertainty off: without)\n");
    if (main_job && o->release_encoding != NULL)
        printf("releases: %s (release format %u), %zu bytes each\n", o->release_encoding,
               (unsigned)f->release_info.format_version, f->release_len);
    if (main_job && heuristic)
        printf("epsilon below: a posterior-sampling heuristic (it holds for an exact posterior sample; the sampler's is "
               "approximate, at an unknown distance delta' from it: docs/privacy.md)\n");
    if (main_job && o->c.secure_agg) fleet_print_secagg_plan(f);
    if (main_job) fleet_print_round_head();
    double rmse = NAN;
    if (main_job && o->eval_every > 0) {
        atomic_store(&f->errors, 0);
        rmse = fleet_evaluate(f, ws, nthreads, 0);
        res->failures += atomic_load(&f->errors);
        if (res->failures > 0)
            fprintf(stderr, "dprec-fleet: evaluation of the initial release: %llu devices failed; first: %s\n",
                    res->failures, f->first_error);
        fleet_print_round(0u, 0u, rmse, "0", fleet_now_s() - t0);
        if (csv) fleet_csv_round(csv, 0u, 0u, rmse, "0", fleet_now_s() - t0);
    }

    char path[128];
    for (unsigned r = 1; r <= o->c.rounds; r++) {
        t0 = fleet_now_s();
        atomic_store(&f->reported, 0);
        atomic_store(&f->errors, 0);
        f->first_error[0] = '\0';
        f->round = r;
        fleet_poison_round_begin(f);
        if (fleet_audit_round_begin(f, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s\n", err);
            goto out;
        }
        if (o->c.secure_agg) {
            /* secure aggregation: five passes over the devices, one step each (advertise, share, masked input,
             * consistency, unmask); a phase that did not close by itself (devices sat out or dropped) is closed as an
             * operator would, and the last close unmasks the sum and finalizes the round */
            static const char *const steps[5] = {"advertise", "share", "mask", "consistency", "unmask"};
            for (int st = 0; st < 5; st++) {
                f->secure_step = st;
                fleet_run_phase(f, 1, steps[st], ws, nthreads);
                snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
                j = fleet_call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
                if (j == NULL) {
                    fprintf(stderr, "dprec-fleet: job status: %s\n", err);
                    goto out;
                }
                const cJSON *sa = cJSON_GetObjectItemCaseSensitive(j, "secagg");
                const cJSON *ph = sa != NULL ? cJSON_GetObjectItemCaseSensitive(sa, "phase") : NULL;
                int same = cJSON_IsString(ph) && strcmp(ph->valuestring, steps[st]) == 0;
                double rd = fleet_json_num(j, "rounds_done", -1);
                if (rd < 0) rd = fleet_json_num(j, "release_version", 1) - 1;
                cJSON_Delete(j);
                j = NULL;
                if (rd >= (double)r) break;
                if ((same || st == 4) && fleet_conn_close_round(f->conn, f->job, err, sizeof err) != 0) {
                    fprintf(stderr, "dprec-fleet: round %u, secure aggregation's %s: %s\n", r, steps[st], err);
                    goto out;
                }
            }
            f->secure_step = -1;
        } else {
            fleet_run_phase(f, 1, "syncing", ws, nthreads);
        }
        fleet_audit_round_synced(f); /* --audit-canaries, local model: the canaries' reports of the round */
        unsigned long long reported = atomic_load(&f->reported), errors = atomic_load(&f->errors);
        res->failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: round %u: %llu devices failed; first: %s\n", r, errors, f->first_error);
        if (hooks != NULL && hooks->round_end(&o->c, f->conn, token, f->job, r, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
            goto out;
        }
        /* the round closes by itself when every device has reported (min_reports); if some did not, close it */
        snprintf(path, sizeof path, "/v1/admin/jobs/%llu", (unsigned long long)f->job);
        j = fleet_call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
        if (j == NULL) {
            fprintf(stderr, "dprec-fleet: job status: %s\n", err);
            goto out;
        }
        double rounds_done = fleet_json_num(j, "rounds_done", -1);
        if (rounds_done < 0) rounds_done = fleet_json_num(j, "release_version", 1) - 1;
        cJSON_Delete(j);
        j = NULL;
        if (rounds_done < (double)r) {
            if (reported == 0) {
                fprintf(stderr, "dprec-fleet: round %u: no device reported\n", r);
                goto out;
            }
            if (fleet_conn_close_round(f->conn, f->job, err, sizeof err) != 0) {
                fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
                goto out;
            }
        }
        j = fleet_call_json(f, 1, "GET", path, NULL, NULL, 200, err, sizeof err);
        if (j == NULL) {
            fprintf(stderr, "dprec-fleet: job status: %s\n", err);
            goto out;
        }
        double eps = fleet_json_num(j, "epsilon_spent", NAN);
        cJSON_Delete(j);
        j = NULL;
        if (fetch_release(f, token, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: %s\n", err);
            goto out;
        }
        if (fleet_poison_round_end(f, r, err, sizeof err) != 0) {
            fprintf(stderr, "dprec-fleet: round %u: %s\n", r, err);
            goto out;
        }
        res->epsilon = eps;
        res->rounds = r;
        int last = r == o->c.rounds;
        if (!last && (!main_job || o->eval_every == 0 || r % o->eval_every != 0)) {
            if (!o->quiet) fprintf(stderr, "  round %u: %llu reports, %.1f s\n", r, reported, fleet_now_s() - t0);
            continue;
        }
        atomic_store(&f->errors, 0);
        f->first_error[0] = '\0';
        rmse = fleet_evaluate(f, ws, nthreads, 0);
        errors = atomic_load(&f->errors);
        res->failures += errors;
        if (errors > 0)
            fprintf(stderr, "dprec-fleet: evaluation after round %u: %llu devices failed; first: %s\n", r, errors,
                    f->first_error);
        char es[32];
        fleet_fmt_eps(es, sizeof es, eps);
        double secs = fleet_now_s() - t0;
        if (main_job) fleet_print_round(r, reported, rmse, es, secs);
        else if (!o->quiet) fprintf(stderr, "  round %u: %llu reports, test RMSE %.4f, %.1f s\n", r, reported, rmse, secs);
        if (csv) fleet_csv_round(csv, r, reported, rmse, es, secs);
        res->rmse = rmse;
    }
    if (csv) {
        fclose(csv);
        csv = NULL;
    }
    if (main_job && o->plot != NULL) fleet_draw_plot(o, csv_path, gm, im, um);
    if (main_job) printf("mae: test MAE %.4f after round %u (the mean absolute prediction error)\n", f->mae, res->rounds);
    if (main_job && o->c.secure_agg) fleet_print_secagg_stored(f);

    /* the job's guarantee, as the aggregator states it */
    snprintf(path, sizeof path, "/v1/jobs/%llu", (unsigned long long)f->job);
    j = fleet_call_json(f, 0, "GET", path, token, NULL, 200, err, sizeof err);
    dprec_guarantee g;
    memset(&g, 0, sizeof g);
    g.protocol = o->proto->name;
    g.job_id = f->job;
    g.unit = DPREC_UNIT_USER;
    g.model = DPREC_MODEL_NONE;
    g.epsilon = INFINITY;
    g.delta = 0;
    g.accountant = "none";
    const cJSON *priv = j ? cJSON_GetObjectItemCaseSensitive(j, "privacy") : NULL;
    if (priv != NULL) {
        const cJSON *unit = cJSON_GetObjectItemCaseSensitive(priv, "unit");
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(priv, "model");
        if (cJSON_IsString(unit) && strcmp(unit->valuestring, "rating") == 0) g.unit = DPREC_UNIT_RATING;
        if (cJSON_IsString(model)) {
            static const struct { const char *name; dprec_model m; } models[] = {
                {"none", DPREC_MODEL_NONE}, {"local", DPREC_MODEL_LOCAL}, {"central", DPREC_MODEL_CENTRAL},
                {"joint", DPREC_MODEL_JOINT}, {"posterior-sampling heuristic", DPREC_MODEL_POSTERIOR_HEURISTIC},
                {"distributed", DPREC_MODEL_DISTRIBUTED}, {"secure-aggregation", DPREC_MODEL_SECURE_AGGREGATION}};
            for (size_t k = 0; k < sizeof models / sizeof models[0]; k++)
                if (strcmp(model->valuestring, models[k].name) == 0) g.model = models[k].m;
        }
        g.epsilon = fleet_json_num(priv, "epsilon", INFINITY);
        g.delta = fleet_json_num(priv, "delta", 0);
        const cJSON *acc = cJSON_GetObjectItemCaseSensitive(priv, "accountant");
        if (cJSON_IsString(acc)) g.accountant = acc->valuestring;
    } else if (j == NULL) {
        fprintf(stderr, "dprec-fleet: job status: %s (guarantee from the protocol's defaults)\n", err);
    }
    if (g.model == DPREC_MODEL_NONE) g.epsilon = INFINITY;
    res->model = g.model;
    res->delta = g.delta;
    res->epsilon = g.model == DPREC_MODEL_NONE ? INFINITY : (isnan(res->epsilon) ? g.epsilon : res->epsilon);
    if (main_job) fleet_print_guarantee(o, &g, priv);
    fleet_audit_job_end(f, &g, res);
    cJSON_Delete(j);
    j = NULL;

    /* the devices' own ledgers: what each charged for this job, from its own accountant, must not exceed the
     * aggregator's figure for the rounds run (else the published guarantee understates what they spent) */
    if (g.model != DPREC_MODEL_NONE) {
        double dev_eps = 0.0, dev_least = INFINITY;
        uint32_t charged = 0;
        for (uint32_t u = 0; u < f->data.num_users; u++) {
            dprec_ledger_entry e;
            if (f->dev[u].client == NULL || dprec_ledger_job(f->dev[u].client, f->job, &e) != DPREC_OK) continue;
            charged++;
            if (e.epsilon > dev_eps) dev_eps = e.epsilon;
            if (e.epsilon < dev_least) dev_least = e.epsilon;
        }
        char de[32], dl[32], ae[32];
        fleet_fmt_eps(de, sizeof de, dev_eps);
        fleet_fmt_eps(dl, sizeof dl, charged > 0 ? dev_least : 0.0);
        fleet_fmt_eps(ae, sizeof ae, res->epsilon);
        /* the least too: with every device in every round (sampling rate 1) each ledger equals the figure */
        if (main_job)
            printf("ledgers: %u devices charged this job, at most epsilon = %s each (%s level%s; the least %s); the "
                   "aggregator's accountant for the rounds run: %s\n", charged, de, dprec_unit_name(g.unit),
                   g.model == DPREC_MODEL_POSTERIOR_HEURISTIC ? ", posterior-sampling heuristic" : "", dl, ae);
        if (!(dev_eps <= res->epsilon * (1.0 + 1e-9))) {
            fprintf(stderr, "dprec-fleet: job %llu: a device charged more than the job's published guarantee: it "
                            "understates (%s > %s)\n", (unsigned long long)f->job, de, ae);
            res->failures++;
        }
    }
    ok = 0;
out:
    cJSON_Delete(j);
    if (csv) fclose(csv);
    if (poisoned) fleet_poison_job_end(f);
    if (hooks != NULL) hooks->job_end();
    for (unsigned i = 0; i < nthreads; i++) ws[i].relay = NULL;
    return ok;
}

/* --opt-in: the plain job among the devices that opted in (their apps set allow_non_private; every other device
 * sends nothing to it), at the main job's d with the users' own bias in column 0 (plain's spec); the main job then
 * names it as base_job with base_factors. *res gets its outcome, its RMSE the other devices' on its release; 0, or -1
 * (printed). */
int fleet_run_optin(fleet *f, worker *ws, unsigned nthreads, const char *token, job_result *res) {
    options *o = f->o;
    const fleet_proto *main_proto = o->proto, *pp = fleet_proto_find("plain");
    fleet_common main_c = o->c;
    o->proto = pp;
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rounds_set = 0;
    o->c.lambda = -1;
    o->c.start_job = 1; /* its spec bounds what a sybil among the opted-in devices moves (plain's tighter clips) */
    int rc = fleet_finish_proto(pp, &o->c);
    o->c.rank = main_c.rank;
    f->optin_only = 1;
    if (rc == 0) rc = fleet_run_job(f, ws, nthreads, token, 0, 0, 0, 0, res);
    else fprintf(stderr, "dprec-fleet: --opt-in: the plain job's defaults do not fit this run\n");
    f->optin_only = 0;
    if (rc == 0) {
        o->base_job = f->job;
        o->base_factors = 1;
        f->optin_spent = 1;
    }
    o->proto = main_proto;
    o->c = main_c;
    return rc == 0 ? 0 : -1;
}

/* --bias-base: the private bias model at the main job's d (the base model's job with params.factors false) on the
 * same devices, at its share of the budget; the main job then names it as base_job. *res gets its outcome; 0, or
 * -1 (printed). */
int fleet_run_base(fleet *f, worker *ws, unsigned nthreads, const char *token, job_result *res) {
    options *o = f->o;
    const fleet_proto *main_proto = o->proto, *bp = fleet_proto_base_model();
    fleet_common main_c = o->c;
    o->proto = bp;
    o->c.rounds = FLEET_DEFAULT_ROUNDS;
    o->c.rounds_set = o->c.rank_set = 0;
    o->c.lambda = -1;
    o->c.epsilon = o->base_epsilon;
    o->c.delta = o->base_delta;
    o->c.base_model = 1;
    o->c.population_rule = 0; /* the main job's rule (gauss-gd's) is not the base's: its d is the main job's */
    int rc = fleet_finish_proto(bp, &o->c);
    o->c.rank = main_c.rank; /* the bias model at the devices' own d (a device takes part only at its d) */
    if (rc == 0) rc = fleet_run_job(f, ws, nthreads, token, 0, 0, 0, 0, res);
    else fprintf(stderr, "dprec-fleet: --bias-base: the %s job's defaults do not fit this run\n", bp->name);
    if (rc == 0) o->base_job = f->job;
    o->proto = main_proto;
    o->c = main_c;
    return rc == 0 ? 0 : -1;
}
