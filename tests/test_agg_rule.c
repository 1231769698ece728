/* Tests of a job's population rule at the aggregator (spec field "population_rule", docs/protocol.md "The population
 * rule"): dpals's (aggregator/protocols/dpals_rule.c) first, gauss-gd's at the end. A dpals job created with it gets
 * the rule's d, rounds and the factors' rating_clip as ordinary parameters, and its create answer, its view (also after
 * the aggregator is reopened) and its job_created log line carry the rule's inputs, signal over noise, choice and the
 * devices' ridge; every malformed option, a protocol without a rule and a spec that also gives d or rounds are refused
 * and store nothing. Each expected choice is the rule function's own for the same inputs (tests/test_dpals_rule.c holds
 * its table). Each test works in its own mkdtemp directory, with its state there (`test_agg_rule`: SQLite) or in a
 * database of its own (`test_agg_rule postgresql`; tests/test_state.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agg.h"
#include "protocols/dpals_rule.h"
#include "protocols/gauss_rule.h"
#include "gauss.h"
#include "dprec/status.h"
#include "test_state.h"

#define ADMIN "admin-token-0123456789abcdef"

typedef struct env {
    char dir[64];
    test_state st;
    char key[128];
    dprec_agg *a;
    pthread_mutex_t mu;
    char created[8192]; /* the last job_created log line */
} env;

static void log_sink(void *user, const char *line) {
    env *e = user;
    if (strstr(line, "\"event\":\"job_created\"") == NULL) return;
    pthread_mutex_lock(&e->mu);
    snprintf(e->created, sizeof e->created, "%s", line);
    pthread_mutex_unlock(&e->mu);
}

static int open_agg(env *e) {
    dprec_agg_config cfg;
    dprec_agg_config_default(&cfg);
    cfg.state_path = e->st.path;
    cfg.signing_key_path = e->key;
    cfg.admin_token = ADMIN;
    cfg.seed = 42;
    cfg.log = log_sink;
    cfg.log_user = e;
    char err[256] = "";
    int rc = dprec_agg_open(&cfg, &e->a, err, sizeof err);
    if (rc != 0) fprintf(stderr, "open: %s\n", err);
    return rc;
}

static int setup(void **state) {
    env *e = calloc(1, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    snprintf(e->dir, sizeof e->dir, "/tmp/dprec-rule-XXXXXX");
    if (mkdtemp(e->dir) == NULL || test_state_new(&e->st, "rule") != 0) return -1;
    snprintf(e->key, sizeof e->key, "%s/key.pem", e->dir);
    if (open_agg(e) != 0) return -1;
    *state = e;
    return 0;
}

static int teardown(void **state) {
    env *e = *state;
    dprec_agg_close(e->a);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    if (system(cmd) != 0 || test_state_remove(&e->st) != 0) return -1;
    pthread_mutex_destroy(&e->mu);
    free(e);
    return 0;
}

static cJSON *call_json(dprec_agg *a, const char *method, const char *path, const char *body, int want_status) {
    dprec_agg_request q = {DPREC_LISTENER_ADMIN, method, path, "Bearer " ADMIN, (const unsigned char *)body,
                           body ? strlen(body) : 0};
    dprec_agg_response r;
    assert_int_equal(dprec_agg_handle(a, &q, &r), 0);
    if (r.status != want_status) fprintf(stderr, "%s %s -> %d %.*s\n", method, path, r.status, (int)r.body_len, r.body);
    assert_int_equal(r.status, want_status);
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    dprec_agg_response_free(&r);
    assert_non_null(o);
    return o;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) fail_msg("no number %s", key);
    return v->valuedouble;
}

/* A device registered with the aggregator (its registrations are not the rule's N: the option declares it). */
static void register_device(dprec_agg *a) {
    dprec_agg_request q = {DPREC_LISTENER_DEVICE, "POST", "/v1/register", NULL, (const unsigned char *)"{}", 2};
    dprec_agg_response r;
    assert_int_equal(dprec_agg_handle(a, &q, &r), 0);
    assert_int_equal(r.status, 201);
    dprec_agg_response_free(&r);
}

/* A dpals job spec at (m, the 0.5..5 scale, epsilon, delta 1e-6) with population_rule `rule` and `extra` fields. */
static void rule_spec(char *out, size_t cap, uint32_t m, double eps, const char *rule, const char *extra) {
    snprintf(out, cap,
             "{\"protocol\":\"dpals\",\"m\":%u,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
             "\"round_seconds\":600,%s\"params\":{\"seed\":1},\"budget\":{\"epsilon\":%g,\"delta\":1e-6},"
             "\"population_rule\":%s}",
             m, extra != NULL ? extra : "", eps, rule);
}

/* cJSON prints a number with 15 significant digits when they read back within DBL_EPSILON of it (its print_number), so
 * a number that went through a JSON text is the rule's within a few ulps. */
static void near(double got, double want) {
    if (!(fabs(got - want) <= 1e-13 * fabs(want))) fail_msg("%.17g, expected %.17g", got, want);
}

/* The rule's record as the aggregator shows it, against the rule function's choice for the same inputs. */
static void check_record(const cJSON *r, const agg_dpals_rule_in *in, const agg_dpals_rule_out *want) {
    assert_true(cJSON_IsObject(r));
    assert_true(num(r, "devices") == in->devices);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(r, "devices_from")->valuestring, "declared");
    near(num(r, "ratings_per_device"), in->activity);
    assert_true(num(r, "items") == in->items);
    assert_true(num(r, "max_items") == in->max_items);
    assert_true(num(r, "scale_width") == in->scale_width);
    assert_true(num(r, "epsilon") == in->epsilon);
    assert_true(num(r, "delta") == in->delta);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(r, "unit")->valuestring, "user");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(r, "model")->valuestring, "joint");
    near(num(r, "snr3"), want->snr3);
    near(num(r, "snr5"), want->snr5);
    near(num(r, "z3"), want->z3);
    near(num(r, "z5"), want->z5);
    near(num(r, "reports_per_item"), want->reports_per_item);
    assert_true(num(r, "d") == want->rank);
    assert_true(num(r, "rounds") == want->rounds);
    const cJSON *ridge = cJSON_GetObjectItemCaseSensitive(r, "device_ridge");
    const char *choice = cJSON_GetObjectItemCaseSensitive(r, "choice")->valuestring;
    if (want->rank == 1) {
        assert_true(num(ridge, "fixed") == AGG_DPALS_RULE_BIAS_RIDGE);
        assert_null(cJSON_GetObjectItemCaseSensitive(ridge, "per_rating"));
        assert_non_null(strstr(choice, "factors cannot pay at this population and budget"));
        assert_non_null(strstr(choice, "d = 1, the bias model"));
        near(num(r, "snr_bias"), want->snr_bias);
        near(num(r, "z2"), want->z2);
        assert_true(num(r, "bias_clip_below") == AGG_DPALS_RULE_BIAS_CLIP_SNR);
        /* the bias model's clip, halved where an average item's bias is below its noise (dpals_rule.c) */
        if (want->bias_rating_clip > 0.0) {
            assert_true(num(r, "rating_clip") == want->bias_rating_clip);
            assert_non_null(strstr(choice, "the targets clipped at half the default"));
        } else {
            assert_null(cJSON_GetObjectItemCaseSensitive(r, "rating_clip"));
            assert_non_null(strstr(choice, "the default clip"));
        }
    } else {
        assert_true(num(ridge, "per_rating") == want->device_lambda_per_rating);
        assert_true(num(ridge, "floor") == want->device_lambda_floor);
        assert_null(cJSON_GetObjectItemCaseSensitive(ridge, "fixed"));
        assert_non_null(strstr(choice, "factors pay"));
        assert_true(num(r, "rating_clip") == 0.5);
    }
}

/* Creates the job with the option, checks its answer, view and log line, reopens the aggregator and checks the view
 * again. */
static void create_and_check(env *e, const agg_dpals_rule_in *in, unsigned want_rank) {
    agg_dpals_rule_out want;
    assert_int_equal(agg_dpals_rule_choose(in, &want), 0);
    assert_int_equal(want.rank, want_rank); /* the case is the one it is meant to be */
    char rule[128], spec[1024];
    snprintf(rule, sizeof rule, "{\"devices\":%u,\"ratings_per_device\":%.17g}", in->devices, in->activity);
    rule_spec(spec, sizeof spec, in->items, in->epsilon, rule, NULL);
    cJSON *c = call_json(e->a, "POST", "/v1/admin/jobs", spec, 201);
    int64_t job = (int64_t)num(c, "job");
    assert_true(num(c, "d") == want.rank);
    assert_true(num(c, "rounds") == want.rounds);
    check_record(cJSON_GetObjectItemCaseSensitive(c, "population_rule"), in, &want);
    cJSON_Delete(c);
    pthread_mutex_lock(&e->mu);
    cJSON *logged = cJSON_Parse(e->created);
    pthread_mutex_unlock(&e->mu);
    assert_non_null(logged);
    assert_true(num(logged, "job") == job);
    assert_true(num(logged, "d") == want.rank);
    check_record(cJSON_GetObjectItemCaseSensitive(logged, "population_rule"), in, &want);
    cJSON_Delete(logged);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
    for (int reopened = 0; reopened < 2; reopened++) {
        if (reopened) {
            dprec_agg_close(e->a);
            assert_int_equal(open_agg(e), 0);
        }
        cJSON *v = call_json(e->a, "GET", path, NULL, 200);
        /* ordinary parameters: what a device reads */
        assert_true(num(v, "d") == want.rank);
        assert_true(num(v, "rounds") == want.rounds);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(v, "params");
        const cJSON *clip = cJSON_GetObjectItemCaseSensitive(params, "rating_clip");
        if (want.rank > 1) assert_true(cJSON_IsNumber(clip) && clip->valuedouble == 0.5);
        else if (want.bias_rating_clip > 0.0) assert_true(cJSON_IsNumber(clip) && clip->valuedouble == want.bias_rating_clip);
        else assert_null(clip);
        check_record(cJSON_GetObjectItemCaseSensitive(v, "population_rule"), in, &want);
        cJSON_Delete(v);
    }
}

static void test_agg_a_population_rule_job_takes_factors_where_they_pay(void **state) {
    env *e = *state;
    for (int i = 0; i < 3; i++) register_device(e->a);
    /* the MovieLens-10M shape at a tenth (7,000 devices, 1,000 items, 0.9 of 1,004,963 ratings over the devices) at
     * epsilon 5: d = 10, 5 rounds, 0.02 per rating at least 3 */
    agg_dpals_rule_in in = {7000, 1000, 5.0, 1e-6, 4.5, 400, 0.9 * 1004963.0 / 7000.0};
    create_and_check(e, &in, AGG_DPALS_RULE_FACTOR_RANK);
    /* the same at epsilon 2: factors pay no more, d = 1 */
    in.epsilon = 2.0;
    create_and_check(e, &in, 1);
}

static void test_agg_a_population_rule_job_takes_the_bias_model_for_a_small_app(void **state) {
    env *e = *state;
    register_device(e->a);
    /* the small app (600 devices, 9,700 items, 150 ratings a device) at epsilon 1: d = 1, the bias model, 2 rounds */
    agg_dpals_rule_in in = {600, 9700, 1.0, 1e-6, 4.5, 400, 150.0};
    create_and_check(e, &in, 1);
}

static void test_agg_refuses_a_malformed_population_rule_and_stores_nothing(void **state) {
    env *e = *state;
    static const char *const bad_rules[] = {
        "{\"devices\":600}",                                   /* no ratings_per_device */
        "{\"ratings_per_device\":150}",                        /* no devices */
        "{\"devices\":600,\"ratings_per_device\":0}",
        "{\"devices\":600,\"ratings_per_device\":-150}",
        "{\"devices\":600,\"ratings_per_device\":1e300}",      /* more than the catalogue's m */
        "{\"devices\":600,\"ratings_per_device\":1001}",       /* m = 1000 */
        "{\"devices\":600,\"ratings_per_device\":\"150\"}",
        "{\"devices\":0,\"ratings_per_device\":150}",
        "{\"devices\":-5,\"ratings_per_device\":150}",
        "{\"devices\":600.5,\"ratings_per_device\":150}",
        "{\"devices\":1e12,\"ratings_per_device\":150}",
        "{\"devices\":600,\"ratings_per_device\":150,\"users\":3}", /* not an input */
        "150",
        "[600,150]",
        "null",
    };
    char spec[1024];
    for (size_t i = 0; i < sizeof bad_rules / sizeof bad_rules[0]; i++) {
        rule_spec(spec, sizeof spec, 1000, 1.0, bad_rules[i], NULL);
        cJSON *o = call_json(e->a, "POST", "/v1/admin/jobs", spec, 400);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "error")->valuestring, "bad_field");
        if (strstr(cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring, "population_rule") == NULL)
            fail_msg("%s: %s", bad_rules[i], cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring);
        cJSON_Delete(o);
    }
    const char *good = "{\"devices\":600,\"ratings_per_device\":150}";
    /* d or rounds beside the rule: a conflict, refused (not silently overridden either way) */
    static const char *const conflicts[] = {"\"d\":10,", "\"rounds\":3,", "\"d\":1,\"rounds\":2,"};
    for (size_t i = 0; i < sizeof conflicts / sizeof conflicts[0]; i++) {
        rule_spec(spec, sizeof spec, 1000, 1.0, good, conflicts[i]);
        cJSON *o = call_json(e->a, "POST", "/v1/admin/jobs", spec, 400);
        assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring, "not both"));
        cJSON_Delete(o);
    }
    /* the noise from params, or the model fixed by params: the rule cannot choose */
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpals\",\"m\":1000,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
             "\"round_seconds\":600,\"params\":{\"noise_multiplier\":2},\"budget\":{\"epsilon\":1,\"delta\":1e-6},"
             "\"population_rule\":%s}", good);
    cJSON_Delete(call_json(e->a, "POST", "/v1/admin/jobs", spec, 400));
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpals\",\"m\":1000,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
             "\"round_seconds\":600,\"params\":{\"factors\":false},\"budget\":{\"epsilon\":1,\"delta\":1e-6},"
             "\"population_rule\":%s}", good);
    cJSON_Delete(call_json(e->a, "POST", "/v1/admin/jobs", spec, 400));
    /* a budget without delta: the rule inverts the accountant at (epsilon, delta) */
    snprintf(spec, sizeof spec,
             "{\"protocol\":\"dpals\",\"m\":1000,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
             "\"round_seconds\":600,\"budget\":{\"epsilon\":1,\"delta\":0},\"population_rule\":%s}", good);
    cJSON_Delete(call_json(e->a, "POST", "/v1/admin/jobs", spec, 400));
    /* protocols the rule does not apply to */
    static const char *const others[] = {
        "{\"protocol\":\"plain\",\"m\":1000,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
        "\"round_seconds\":600,\"population_rule\":{\"devices\":600,\"ratings_per_device\":150}}",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        cJSON *o = call_json(e->a, "POST", "/v1/admin/jobs", others[i], 400);
        const char *msg = cJSON_GetObjectItemCaseSensitive(o, "message")->valuestring;
        assert_non_null(strstr(msg, "has no population rule"));
        /* and it names the protocols that have one, from the protocol table */
        assert_non_null(strstr(msg, "(population_rule: gauss-gd, dpals)"));
        cJSON_Delete(o);
    }
    cJSON *list = call_json(e->a, "GET", "/v1/admin/jobs", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(list, "jobs")), 0);
    cJSON_Delete(list);
}

/* gauss-gd's rule (aggregator/protocols/gauss_rule.c): the job gets d and rounds 10, params.lr the rule's step for
 * the noise the accountant gives its budget, and a record with the devices' ridge; lr or noise_multiplier beside the
 * option, unit rating, and secure aggregation without its survivors are refused and store nothing. The small app
 * (600 devices, 9,700 items, 150 ratings a device) at epsilon 1: the Wiener step and the fixed ridge; the
 * MovieLens-10M shape at a tenth at epsilon 10: the measured steps and the ridge per rating (tests/test_gauss_rule.c
 * holds the table). */
static void test_agg_a_gauss_gd_population_rule_job_takes_the_rule_s_step(void **state) {
    env *e = *state;
    register_device(e->a);
    static const struct {
        uint32_t devices, items;
        double epsilon, activity;
        int fixed;
    } cases[] = {{600, 9700, 1.0, 150.0, 1}, {7000, 1000, 10.0, 0.9 * 1004963.0 / 7000.0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double z = 0;
        assert_int_equal(dprec_gauss_noise_multiplier(cases[i].epsilon, 1e-6, AGG_GAUSS_RULE_ROUNDS, 1.0, &z),
                         DPREC_OK);
        agg_gauss_rule_in in = {cases[i].devices, cases[i].items, 4.5, AGG_GAUSS_RULE_ROUNDS, z, 1.0, 1000,
                                cases[i].activity, AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING};
        agg_gauss_rule_out want;
        assert_int_equal(agg_gauss_rule_choose(&in, &want), 0);
        assert_int_equal(want.fixed_ridge, cases[i].fixed);
        char spec[1024];
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"gauss-gd\",\"m\":%u,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,"
                 "\"round_seconds\":600,\"budget\":{\"epsilon\":%g,\"delta\":1e-6},\"population_rule\":"
                 "{\"devices\":%u,\"ratings_per_device\":%.17g}}",
                 cases[i].items, cases[i].epsilon, cases[i].devices, cases[i].activity);
        cJSON *c = call_json(e->a, "POST", "/v1/admin/jobs", spec, 201);
        int64_t job = (int64_t)num(c, "job");
        assert_true(num(c, "d") == AGG_GAUSS_RULE_RANK);
        assert_true(num(c, "rounds") == AGG_GAUSS_RULE_ROUNDS);
        cJSON_Delete(c);
        char path[64];
        snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
        for (int reopened = 0; reopened < 2; reopened++) {
            if (reopened) {
                dprec_agg_close(e->a);
                assert_int_equal(open_agg(e), 0);
            }
            cJSON *v = call_json(e->a, "GET", path, NULL, 200);
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(v, "params");
            assert_true(fabs(num(params, "lr") - want.lr) <= 1e-12 * want.lr); /* what a device and the step read */
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "population_rule");
            assert_true(num(r, "devices") == cases[i].devices);
            assert_true(fabs(num(r, "sigma") - z) <= 1e-12 * z);
            assert_true(fabs(num(r, "snr") - want.snr) <= 1e-9 * want.snr);
            const cJSON *ridge = cJSON_GetObjectItemCaseSensitive(r, "device_ridge");
            if (cases[i].fixed) {
                assert_true(num(ridge, "fixed") == AGG_GAUSS_RULE_FIXED_RIDGE);
                assert_null(cJSON_GetObjectItemCaseSensitive(ridge, "per_rating"));
            } else {
                assert_true(num(ridge, "per_rating") == AGG_GAUSS_RULE_DEVICE_RIDGE_PER_RATING);
                assert_null(cJSON_GetObjectItemCaseSensitive(ridge, "fixed"));
            }
            cJSON_Delete(v);
        }
    }
    static const char *const refused[] = {
        "\"params\":{\"lr\":0.01},", "\"params\":{\"noise_multiplier\":2},",
        "\"params\":{\"unit\":\"rating\",\"eps_i\":0.5},",
        "\"params\":{\"aggregation\":\"secure\"},", "\"d\":5,", "\"rounds\":3,",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec,
                 "{\"protocol\":\"gauss-gd\",\"m\":1000,\"rating_min\":0.5,\"rating_max\":5,\"min_reports\":10,%s"
                 "\"round_seconds\":600,\"budget\":{\"epsilon\":1,\"delta\":1e-6},\"population_rule\":"
                 "{\"devices\":600,\"ratings_per_device\":150}}",
                 refused[i]);
        cJSON_Delete(call_json(e->a, "POST", "/v1/admin/jobs", spec, 400));
    }
    cJSON *list = call_json(e->a, "GET", "/v1/admin/jobs", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(list, "jobs")), 2);
    cJSON_Delete(list);
}

/* Without the option a job is as before: its d and rounds as given, no record. */
static void test_agg_a_job_without_the_rule_keeps_its_given_shape(void **state) {
    env *e = *state;
    const char *spec = "{\"protocol\":\"dpals\",\"d\":4,\"rounds\":3,\"m\":50,\"rating_min\":0.5,\"rating_max\":5,"
                       "\"min_reports\":10,\"round_seconds\":600,\"budget\":{\"epsilon\":1,\"delta\":1e-6}}";
    cJSON *c = call_json(e->a, "POST", "/v1/admin/jobs", spec, 201);
    assert_null(cJSON_GetObjectItemCaseSensitive(c, "population_rule"));
    int64_t job = (int64_t)num(c, "job");
    cJSON_Delete(c);
    char path[64];
    snprintf(path, sizeof path, "/v1/admin/jobs/%lld", (long long)job);
    cJSON *v = call_json(e->a, "GET", path, NULL, 200);
    assert_true(num(v, "d") == 4);
    assert_true(num(v, "rounds") == 3);
    assert_null(cJSON_GetObjectItemCaseSensitive(v, "population_rule"));
    cJSON_Delete(v);
}

int main(int argc, char **argv) {
    test_state_engine_from_args(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_agg_a_population_rule_job_takes_factors_where_they_pay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_population_rule_job_takes_the_bias_model_for_a_small_app, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_agg_refuses_a_malformed_population_rule_and_stores_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_gauss_gd_population_rule_job_takes_the_rule_s_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agg_a_job_without_the_rule_keeps_its_given_shape, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
