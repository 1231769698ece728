/* Tests of the device's privacy ledger and pending reports: charged durably before a report can leave,
 * capped per unit (a rating-level job also at user level), never charged twice for one report, a job's
 * fingerprint and rounds held to its first charge, participation decisions recorded once and never redrawn,
 * surviving crashes and a damaged generation, stores of SDK 0.1.0 converted; the store's refusal to write
 * before a load; and guarantee summaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include <cmocka.h>

#include "bytes.h"
#include "client_priv.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "fake_port.h"
#include "test_util.h"

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
} fixture;

static int reopen(fixture *f) {
    if (f->c) dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    assert_true(need > 0);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    return dprec_store_load(f->c);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = 100;
    f->cfg.dim = 4;
    f->cfg.rating_capacity = 10;
    f->cfg.cap_user_epsilon = 2.0;
    f->cfg.cap_user_delta = 1e-5;
    f->cfg.cap_rating_epsilon = 5.0;
    f->cfg.cap_rating_delta = 1e-4;
    f->cfg.pending_slots = 2;
    f->cfg.ledger_jobs = 3;
    f->cfg.max_report_bytes = 64;
    assert_int_equal(reopen(f), DPREC_OK);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

/* A report builder that "randomizes" with the client's CSPRNG and counts its calls. */
typedef struct builder {
    dprec_client *c;
    int calls;
    size_t len;
    int fail;
} builder;

/* The report id dprec_report_prepare handed to the last build. */
static unsigned char seen_id[DPREC_REPORT_ID_SIZE];

static int build(void *user, const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap,
                 size_t *len) {
    builder *b = user;
    assert_non_null(report_id);
    memcpy(seen_id, report_id, DPREC_REPORT_ID_SIZE);
    b->calls++;
    if (b->fail) return DPREC_ERR_INTERNAL;
    size_t n = b->len ? b->len : 20;
    if (n <= cap) assert_int_equal(dprec_client_random(b->c, out, n), DPREC_OK);
    *len = n;
    return DPREC_OK;
}

static dprec_charge charge_of(uint64_t job, uint64_t round, dprec_unit unit, dprec_model model, double eps,
                              double delta, double user_eps, double user_delta) {
    dprec_charge ch;
    memset(&ch, 0, sizeof ch);
    ch.job_id = job;
    ch.round = round;
    ch.unit = unit;
    ch.model = model;
    ch.job_epsilon = eps;
    ch.job_delta = delta;
    ch.user_epsilon = user_eps;
    ch.user_delta = user_delta;
    return ch;
}

/* A user-level local charge (its user-level figures are its own). */
static dprec_charge charge(uint64_t job, uint64_t round, double eps, double delta) {
    return charge_of(job, round, DPREC_UNIT_USER, DPREC_MODEL_LOCAL, eps, delta, 0, 0);
}

static void test_report_is_charged_and_stored_before_it_can_be_sent(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    dprec_charge ch = charge(7, 1, 0.5, 0);
    unsigned char id[DPREC_REPORT_ID_SIZE];
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    assert_int_equal(b.calls, 1);
    assert_memory_equal(seen_id, id, sizeof id); /* the builder saw the id the report is stored under */
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    dprec_pending_report p;
    assert_int_equal(dprec_report_pending_at(f->c, 0, &p), DPREC_OK);
    assert_memory_equal(p.report_id, id, sizeof id);
    assert_int_equal(p.job_id, 7);
    assert_int_equal(p.round, 1);
    assert_int_equal(p.len, 20);
    unsigned char sent[20];
    memcpy(sent, p.bytes, 20);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 7, &e), DPREC_OK);
    assert_true(e.epsilon == 0.5);
    assert_int_equal(e.reports, 1);

    /* Crash before sending: after a restart the same bytes are pending and the charge is there once. */
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    assert_int_equal(dprec_report_pending_at(f->c, 0, &p), DPREC_OK);
    assert_memory_equal(p.bytes, sent, 20);
    assert_memory_equal(p.report_id, id, sizeof id);
    assert_int_equal(dprec_ledger_job(f->c, 7, &e), DPREC_OK);
    assert_true(e.epsilon == 0.5);
    assert_int_equal(e.reports, 1);
    /* A retry of the same round is refused: never re-randomized, never charged twice. */
    b.c = f->c;
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_ALREADY_REPORTED);
    assert_int_equal(b.calls, 1);
    /* Acknowledged: the report goes, the charge stays, durably. */
    assert_int_equal(dprec_report_ack(f->c, p.report_id), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_report_ack(f->c, p.report_id), DPREC_ERR_NOT_FOUND);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_ledger_job(f->c, 7, &e), DPREC_OK);
    assert_true(e.epsilon == 0.5);
    double eps, delta;
    assert_int_equal(dprec_ledger_total(f->c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    assert_true(eps == 0.5 && delta == 0.0);
}

static void test_report_past_the_cap_is_refused_and_never_built(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(1, 1, 1.5, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    ch = charge(2, 1, 0.6, 0); /* 1.5 + 0.6 > 2 */
    int writes = f->fake.writes;
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_BUDGET_EXCEEDED);
    assert_int_equal(b.calls, 1);
    assert_int_equal(f->fake.writes, writes);
    ch = charge(1, 2, 2.01, 0); /* the same job's cumulative epsilon past the cap */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_BUDGET_EXCEEDED);
    ch = charge(1, 2, 1.5, 2e-5); /* delta past its cap */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_BUDGET_EXCEEDED);
    ch = charge(1, 2, 2.0, 1e-5); /* exactly at the cap is allowed */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    assert_int_equal(b.calls, 2);
    /* A rating-level job counts against the rating cap with its own figures AND against the user cap with its
     * user-level equivalent: declaring another unit does not escape the user's cap (an aggregator that switches
     * units). The user cap is spent here, so even a rating job well within the rating cap is refused. */
    dprec_charge r = charge_of(3, 1, DPREC_UNIT_RATING, DPREC_MODEL_CENTRAL, 4.0, 1e-5, 0.5, 1e-6);
    assert_int_equal(dprec_report_prepare(f->c, &r, build, &b, id), DPREC_ERR_BUDGET_EXCEEDED);
    f->cfg.cap_user_epsilon = 2.5;
    f->cfg.cap_user_delta = 2e-5;
    assert_int_equal(reopen(f), DPREC_OK);
    b.c = f->c;
    assert_int_equal(dprec_report_pending_count(f->c), 2);
    assert_int_equal(dprec_report_prepare(f->c, &r, build, &b, id), DPREC_ERR_PENDING_FULL);
    dprec_pending_report p;
    assert_int_equal(dprec_report_pending_at(f->c, 0, &p), DPREC_OK);
    assert_int_equal(dprec_report_ack(f->c, p.report_id), DPREC_OK);
    assert_int_equal(dprec_report_prepare(f->c, &r, build, &b, id), DPREC_OK);
    double eps, delta;
    assert_int_equal(dprec_ledger_total(f->c, DPREC_UNIT_USER, &eps, &delta), DPREC_OK);
    assert_true(eps == 2.5 && fabs(delta - 1.1e-5) < 1e-18);
    assert_int_equal(dprec_ledger_total(f->c, DPREC_UNIT_RATING, &eps, &delta), DPREC_OK);
    assert_true(eps == 4.0 && delta == 1e-5);
    /* a rating-level charge without a user-level figure is refused */
    r = charge_of(4, 1, DPREC_UNIT_RATING, DPREC_MODEL_CENTRAL, 0.1, 1e-6, NAN, 0);
    assert_int_equal(dprec_report_prepare(f->c, &r, build, &b, id), DPREC_ERR_INVALID_ARGUMENT);
}

static void test_default_caps_allow_no_private_report(void **state) {
    fixture *f = *state;
    dprec_config_default(&f->cfg);
    f->cfg.num_items = 100;
    assert_int_equal(reopen(f), DPREC_OK);
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(1, 1, 0.01, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_BUDGET_EXCEEDED);
    dprec_charge none = charge_of(1, 1, DPREC_UNIT_USER, DPREC_MODEL_NONE, 0, 0, 0, 0);
    assert_int_equal(dprec_report_prepare(f->c, &none, build, &b, id), DPREC_ERR_NON_PRIVATE);
    assert_int_equal(b.calls, 0);
    f->cfg.allow_non_private = 1;
    assert_int_equal(reopen(f), DPREC_OK);
    b.c = f->c;
    assert_int_equal(dprec_report_prepare(f->c, &none, build, &b, id), DPREC_OK);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 1, &e), DPREC_OK);
    assert_true(e.epsilon > 1e308); /* infinite: recorded as no privacy */
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_ledger_job(f->c, 1, &e), DPREC_OK);
    assert_int_equal(e.model, DPREC_MODEL_NONE);
}

static void test_cumulative_job_epsilon_never_decreases(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(1, 1, 0.8, 1e-6);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    assert_int_equal(dprec_report_ack(f->c, id), DPREC_OK);
    ch = charge(1, 2, 0.3, 0); /* smaller than already charged: kept at the old values */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 1, &e), DPREC_OK);
    assert_true(e.epsilon == 0.8 && e.delta == 1e-6);
    assert_int_equal(e.reports, 2);
    assert_int_equal(e.last_round, 2);
    /* Invalid charges */
    ch = charge(1, 3, NAN, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_INVALID_ARGUMENT);
    ch = charge(1, 3, 0.0, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_INVALID_ARGUMENT);
    ch = charge(1, 3, 1.0, 1.0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_INVALID_ARGUMENT);
    dprec_charge other_model = charge_of(1, 3, DPREC_UNIT_USER, DPREC_MODEL_CENTRAL, 1.0, 0, 0, 0);
    assert_int_equal(dprec_report_prepare(f->c, &other_model, build, &b, id), DPREC_ERR_JOB_CHANGED);
    dprec_charge other_unit = charge_of(1, 3, DPREC_UNIT_RATING, DPREC_MODEL_LOCAL, 1.0, 0, 1.0, 0);
    assert_int_equal(dprec_report_prepare(f->c, &other_unit, build, &b, id), DPREC_ERR_JOB_CHANGED);
    assert_int_equal(dprec_report_prepare(f->c, NULL, build, &b, id), DPREC_ERR_INVALID_ARGUMENT);
}

static void test_ledger_full_and_builder_failures_charge_nothing(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    for (uint64_t j = 1; j <= 3; j++) {
        dprec_charge ch = charge(j, 1, 0.1, 0);
        assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
        assert_int_equal(dprec_report_ack(f->c, id), DPREC_OK);
    }
    dprec_charge ch = charge(4, 1, 0.1, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_LEDGER_FULL);
    ch = charge(3, 2, 0.2, 0);
    b.fail = 1;
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_INTERNAL);
    b.fail = 0;
    b.len = 65; /* more than max_report_bytes */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_REPORT_TOO_LARGE);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 3, &e), DPREC_OK);
    assert_true(e.epsilon == 0.1);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
}

/* Failing each storage call of the first write charges nothing; failing the mirror write keeps the charge
 * and withholds the report until a flush succeeds. */
static void test_a_failed_write_charges_nothing_and_a_failed_mirror_withholds_the_report(void **state) {
    fixture *f = *state;
    unsigned char id[DPREC_REPORT_ID_SIZE];
    for (int kind = 0; kind < 4; kind++) {
        builder b = {f->c, 0, 0, 0};
        dprec_charge ch = charge(9, 1, 0.5, 0);
        fake_port_arm(&f->fake, kind == 0, kind == 1, kind == 2, kind == 3);
        assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_IO);
        fake_port_arm(&f->fake, 0, 0, 0, 0);
        dprec_ledger_entry e;
        assert_int_equal(dprec_ledger_job(f->c, 9, &e), DPREC_ERR_NOT_FOUND);
        assert_int_equal(dprec_report_pending_count(f->c), 0);
        assert_int_equal(reopen(f), DPREC_OK);
        assert_int_equal(dprec_ledger_job(f->c, 9, &e), DPREC_ERR_NOT_FOUND);
    }
    builder b = {f->c, 0, 0, 0};
    dprec_charge ch = charge(9, 1, 0.5, 0);
    fake_port_arm(&f->fake, 0, 2, 0, 0); /* the second (mirror) write fails */
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    dprec_pending_report p;
    assert_int_equal(dprec_report_pending_at(f->c, 0, &p), DPREC_ERR_STATE);
    assert_int_equal(dprec_store_flush(f->c), DPREC_OK);
    assert_int_equal(dprec_report_pending_at(f->c, 0, &p), DPREC_OK);
    assert_memory_equal(p.report_id, id, sizeof id);
}

/* After a charge, both generations hold it: damaging the newest file cannot make the device forget. */
static void test_a_charge_survives_damage_to_the_newest_generation(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    assert_int_equal(dprec_store_put(f->c, 4, 3.0f, 1), DPREC_OK);
    dprec_charge ch = charge(5, 1, 0.7, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    for (int slot = 0; slot < 2; slot++) {
        const char *name = slot ? "dprec-ratings.1" : "dprec-ratings.0";
        fake_file *file = fake_port_file(&f->fake, name);
        file->data[60] ^= 0x20;
        assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
        dprec_ledger_entry e;
        assert_int_equal(dprec_ledger_job(f->c, 5, &e), DPREC_OK);
        assert_true(e.epsilon == 0.7);
        assert_int_equal(dprec_report_pending_count(f->c), 1);
        file = fake_port_file(&f->fake, name);
        file->data[60] ^= 0x20;
    }
}

static void test_reports_are_blocked_when_every_generation_is_lost(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(5, 1, 0.7, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    fake_port_file(&f->fake, "dprec-ratings.0")->data[60] ^= 1;
    fake_port_file(&f->fake, "dprec-ratings.1")->data[60] ^= 1;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    b.c = f->c;
    ch = charge(6, 1, 0.1, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_LEDGER_LOST);
    assert_int_equal(b.calls, 1);
    assert_int_equal(dprec_store_put(f->c, 1, 2.0f, 1), DPREC_OK); /* ratings may be rebuilt */
    assert_int_equal(dprec_ledger_reset_after_loss(f->c), DPREC_OK);
    assert_int_equal(dprec_ledger_reset_after_loss(f->c), DPREC_ERR_STATE);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
}

static void test_store_refuses_writes_until_a_load_establishes_what_storage_holds(void **state) {
    fixture *f = *state;
    for (uint32_t i = 0; i < 3; i++) assert_int_equal(dprec_store_put(f->c, i, 3.0f, 1), DPREC_OK);
    /* A client that never loaded must not write: it would save generation 1 over a newer one. */
    dprec_client_free(f->c);
    size_t need = dprec_client_required_size(&f->cfg);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_put(f->c, 50, 3.0f, 1), DPREC_ERR_STATE);
    assert_int_equal(dprec_store_flush(f->c), DPREC_ERR_STATE);
    /* A load that failed to read storage (the second read of the winning slot) leaves writes refused. */
    fake_port_arm(&f->fake, 3, 0, 0, 0);
    assert_int_equal(dprec_store_load(f->c), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(dprec_store_put(f->c, 50, 3.0f, 1), DPREC_ERR_STATE);
    /* A clean load allows writes again, numbered above the newest generation. */
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 3);
    assert_int_equal(dprec_store_put(f->c, 50, 3.0f, 1), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 4);
}

static void test_a_rename_reported_failed_but_applied_forces_a_reload(void **state) {
    fixture *f = *state;
    assert_int_equal(dprec_store_put(f->c, 1, 3.0f, 1), DPREC_OK);
    f->fake.rename_applies = 1;
    fake_port_arm(&f->fake, 0, 0, 0, 1);
    assert_int_equal(dprec_store_put(f->c, 2, 3.0f, 1), DPREC_ERR_IO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    f->fake.rename_applies = 0;
    assert_int_equal(dprec_store_count(f->c), 1);
    assert_int_equal(dprec_store_put(f->c, 3, 3.0f, 1), DPREC_ERR_STATE);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
    assert_int_equal(dprec_store_count(f->c), 2); /* the change was applied after all */
    assert_int_equal(dprec_store_put(f->c, 3, 3.0f, 1), DPREC_OK);
}

static void test_encrypted_store_tells_a_wrong_key_from_damage(void **state) {
    fixture *f = *state;
    f->fake.has_key = 1;
    memset(f->fake.key, 3, 32);
    f->cfg.encrypt_at_rest = 1;
    f->cfg.store_name = "enc";
    assert_int_equal(reopen(f), DPREC_OK);
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(5, 1, 0.7, 0);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    fake_port_file(&f->fake, "enc.0")->data[70] ^= 1; /* ciphertext damage in one generation */
    assert_int_equal(reopen(f), DPREC_ERR_STORE_CORRUPT);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    f->fake.key[5] ^= 1;
    assert_int_equal(reopen(f), DPREC_ERR_STORE_KEY);
    assert_int_equal(dprec_store_put(f->c, 1, 1.0f, 1), DPREC_ERR_STATE); /* never write under a wrong key */
}

/* The first charge of a job keeps its fingerprint: a later charge under another one (the aggregator changed
 * a privacy parameter, say the noise or the unit, under the same job id) is refused, and so are unit and
 * model changes. */
static void test_a_job_whose_fingerprint_changes_is_refused(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(4, 1, 0.2, 0);
    memset(ch.pin, 0xa1, sizeof ch.pin);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    assert_int_equal(dprec_report_ack(f->c, id), DPREC_OK);
    dprec_charge other = charge(4, 2, 0.4, 0);
    memset(other.pin, 0xa2, sizeof other.pin);
    assert_int_equal(dprec_report_prepare(f->c, &other, build, &b, id), DPREC_ERR_JOB_CHANGED);
    assert_int_equal(dprec_ledger_check(f->c, &other), DPREC_ERR_JOB_CHANGED);
    assert_int_equal(b.calls, 1);
    ch = charge(4, 2, 0.4, 0);
    memset(ch.pin, 0xa1, sizeof ch.pin);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK);
    /* kept across a restart */
    assert_int_equal(reopen(f), DPREC_OK);
    other.round = 3;
    assert_int_equal(dprec_ledger_check(f->c, &other), DPREC_ERR_JOB_CHANGED);
}

/* A job never charges more rounds than the smallest number it declared: an aggregator that declares few
 * rounds (a small total) and then opens more gets nothing past the device's own count. Closing a job early
 * (fewer rounds) is taken; a later larger figure is not. */
static void test_a_job_never_charges_more_rounds_than_it_declared(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    for (uint64_t r = 1; r <= 4; r++) {
        dprec_charge ch = charge(2, r, 0.1 * (double)r, 0);
        ch.max_rounds = r == 1 ? 3 : (r == 2 ? 2 : 9);
        int want = r <= 2 ? DPREC_OK : DPREC_ERR_JOB_ROUNDS;
        assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), want);
        if (want == DPREC_OK) assert_int_equal(dprec_report_ack(f->c, id), DPREC_OK);
    }
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 2, &e), DPREC_OK);
    assert_int_equal(e.rounds, 2);
    assert_int_equal(e.reports, 2);
    assert_int_equal(e.max_rounds, 2);
    assert_true(e.epsilon == 0.2);
}

/* Participation draws live in the ledger: "take part" costs nothing until the report, a sit-out of a
 * Poisson-sampled job is charged, a decided round is never redrawn or reported again, rounds only go forward,
 * and all of it survives a restart. */
static void test_decisions_are_recorded_once_and_rounds_only_go_forward(void **state) {
    fixture *f = *state;
    builder b = {f->c, 0, 0, 0};
    unsigned char id[DPREC_REPORT_ID_SIZE];
    dprec_charge ch = charge(6, 1, 0.3, 0);
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_TAKE_PART, 1), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_TAKE_PART, 0), DPREC_OK);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 6, &e), DPREC_OK);
    assert_true(e.rounds == 0 && e.epsilon == 0.0 && e.last_round == 1);
    assert_int_equal(reopen(f), DPREC_OK);
    b.c = f->c;
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_OK); /* the drawn round's report */
    assert_int_equal(dprec_report_ack(f->c, id), DPREC_OK);
    ch = charge(6, 2, 0.6, 0);
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_SAT_OUT, 1), DPREC_OK);
    assert_int_equal(dprec_ledger_job(f->c, 6, &e), DPREC_OK);
    assert_true(e.rounds == 2 && e.reports == 1 && e.epsilon == 0.6 && e.last_round == 2);
    assert_int_equal(dprec_report_prepare(f->c, &ch, build, &b, id), DPREC_ERR_ALREADY_REPORTED);
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_TAKE_PART, 0), DPREC_ERR_ALREADY_REPORTED);
    ch = charge(6, 1, 0.6, 0); /* an older round */
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_TAKE_PART, 0), DPREC_ERR_ALREADY_REPORTED);
    ch = charge(6, 3, 0.9, 0); /* a sit-out that costs nothing (no amplification claimed) */
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_SAT_OUT, 0), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_ledger_job(f->c, 6, &e), DPREC_OK);
    assert_true(e.rounds == 2 && e.epsilon == 0.6 && e.last_round == 3);
    assert_int_equal(dprec_ledger_check(f->c, &ch), DPREC_ERR_ALREADY_REPORTED);
    assert_int_equal(b.calls, 1);
    /* a sit-out charge past the cap is refused like a report */
    ch = charge(6, 4, 2.5, 0);
    assert_int_equal(dprec_ledger_decide(f->c, &ch, DPREC_LINE_SAT_OUT, 1), DPREC_ERR_BUDGET_EXCEEDED);
}

/* ---- stores written by SDK 0.1.0 -------------------------------------------------------------------- */

static size_t put_section(unsigned char *p, uint16_t type, uint16_t flags, const unsigned char *data, uint32_t len) {
    dprec_st16(p, type);
    dprec_st16(p + 2, flags);
    dprec_st32(p + 4, len);
    memcpy(p + 8, data, len);
    return 8u + len;
}

static void put_f64(unsigned char *p, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    dprec_st64(p, u);
}

/* A store of SDK 0.1.0: the 48-byte ledger lines (format 0) and the sync section with its memo of four
 * participation decisions. It loads: the lines are converted (a rating-level line gets the group bound over
 * the device's capacity at user level), and a decision newer than its job's line moves into the line, so the
 * device cannot draw that round again. */
static void test_a_store_of_sdk_0_1_0_loads_with_its_ledger_and_decisions_converted(void **state) {
    fixture *f = *state;
    unsigned char file[1024], data[256];
    memset(file, 0, sizeof file);
    memcpy(file, "DPRS", 4);
    dprec_st16(file + 4, 1);
    dprec_st64(file + 8, 1);          /* generation */
    dprec_st32(file + 16, f->cfg.num_items);
    size_t off = 48;
    memset(data, 0, sizeof data);     /* ratings: none */
    off += put_section(file + off, 1, 1, data, 8);
    memset(data, 0, sizeof data);     /* ledger, format 0: job 11 user/local 0.4 (3 reports, round 3), job 12 rating */
    dprec_st32(data, 2);
    unsigned char *l = data + 8;
    dprec_st64(l, 11);
    dprec_st64(l + 8, 3);
    put_f64(l + 16, 0.4);
    dprec_st32(l + 32, 3);
    l[36] = DPREC_UNIT_USER;
    l[37] = DPREC_MODEL_LOCAL;
    l += 48;
    dprec_st64(l, 12);
    dprec_st64(l + 8, 1);
    put_f64(l + 16, 0.01);
    put_f64(l + 24, 1e-9);
    dprec_st32(l + 32, 1);
    l[36] = DPREC_UNIT_RATING;
    l[37] = DPREC_MODEL_CENTRAL;
    off += put_section(file + off, 2, 1, data, 8 + 2 * 48);
    memset(data, 0, sizeof data);     /* no pending reports */
    off += put_section(file + off, 3, 1, data, 8);
    memset(data, 0, sizeof data);     /* sync: unregistered, memo: job 11 sat out round 5; job 99 (no line) */
    dprec_st32(data + 80, 4);
    dprec_st64(data + 88, 11);
    dprec_st64(data + 96, 5);
    dprec_st32(data + 104, 2);
    dprec_st64(data + 112, 99);
    dprec_st64(data + 120, 1);
    dprec_st32(data + 128, 1);
    off += put_section(file + off, 4, 1, data, 184);
    dprec_st32(file + 20, (uint32_t)(off - 48));
    assert_int_equal(dprec_sha256(file, off, file + off), 0);
    off += 32;
    dprec_client_free(f->c);
    f->c = NULL;
    fake_port_free(&f->fake);
    fake_port_init(&f->fake, &f->port);
    fake_port_set_file(&f->fake, "dprec-ratings.1", file, off);
    assert_int_equal(reopen(f), DPREC_OK);
    dprec_ledger_entry e;
    assert_int_equal(dprec_ledger_job(f->c, 11, &e), DPREC_OK);
    assert_true(e.epsilon == 0.4 && e.user_epsilon == 0.4 && e.reports == 3 && e.rounds == 3 && e.last_round == 5);
    assert_int_equal(dprec_ledger_job(f->c, 12, &e), DPREC_OK);
    double k = (double)f->cfg.rating_capacity;
    assert_true(e.user_epsilon == k * 0.01 && fabs(e.user_delta - k * exp((k - 1.0) * 0.01) * 1e-9) < 1e-18);
    assert_int_equal(dprec_ledger_job(f->c, 99, &e), DPREC_ERR_NOT_FOUND);
    dprec_charge ch = charge(11, 5, 0.5, 0);
    assert_int_equal(dprec_ledger_check(f->c, &ch), DPREC_ERR_ALREADY_REPORTED); /* sat out: never redrawn */
    ch.round = 6;
    assert_int_equal(dprec_ledger_check(f->c, &ch), DPREC_OK);
    /* saved again in the new format, and still the same */
    assert_int_equal(dprec_store_put(f->c, 1, 3.0f, 1), DPREC_OK);
    assert_int_equal(reopen(f), DPREC_OK);
    assert_int_equal(dprec_ledger_job(f->c, 11, &e), DPREC_OK);
    assert_true(e.epsilon == 0.4 && e.last_round == 5);
}

/* ---- summaries --------------------------------------------------------------------------------------- */

static void test_guarantee_text_says_unit_model_and_rounds_up(void **state) {
    (void)state;
    char buf[400];
    dprec_guarantee g = {"ldp-gd", 7, DPREC_UNIT_USER, DPREC_MODEL_LOCAL, 1.6, 0, "pure composition"};
    assert_int_equal(dprec_guarantee_text(&g, buf, sizeof buf), DPREC_OK);
    assert_string_equal(buf, "job 7 (ldp-gd): user-level local DP, epsilon = 1.6, delta = 0 (accountant: pure composition)");
    dprec_guarantee h = {"gauss-gd", 2, DPREC_UNIT_RATING, DPREC_MODEL_CENTRAL, 0.12345001, 1e-5, "RDP"};
    assert_int_equal(dprec_guarantee_text(&h, buf, sizeof buf), DPREC_OK);
    assert_string_equal(buf, "job 2 (gauss-gd): rating-level central DP, epsilon = 0.1235, delta = 1e-05 (accountant: RDP)");
    const struct {
        double v;
        const char *s;
    } cases[] = {{12345.6, "12350"}, {2.0, "2"}, {0.99999, "1"}, {9999.5, "10000"}, {123456789.0, "1.235e+08"},
                 {0.0001, "0.0001"}, {3.2e-7, "3.2e-07"}, {1.0 / 3.0, "0.3334"}, {100.0, "100"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g.epsilon = cases[i].v;
        assert_int_equal(dprec_guarantee_json(&g, buf, sizeof buf), DPREC_OK);
        char expect[64];
        snprintf(expect, sizeof expect, "\"epsilon\":%s,", cases[i].s);
        if (strstr(buf, expect) == NULL) fail_msg("%g printed in %s, expected %s", cases[i].v, buf, expect);
        char alone[32]; /* the same figure on its own, as tables and the fleet's final line print it */
        assert_int_equal(dprec_format_up(cases[i].v, alone, sizeof alone), DPREC_OK);
        assert_string_equal(alone, cases[i].s);
    }
    char tiny[3];
    assert_int_equal(dprec_format_up(INFINITY, tiny, sizeof tiny), DPREC_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(dprec_format_up(NAN, tiny, sizeof tiny), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_format_up(-1.0, tiny, sizeof tiny), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_format_up(0.0, tiny, sizeof tiny), DPREC_OK);
    assert_string_equal(tiny, "0");
}

/* Issue 19, point 5: an epsilon or delta below about 1e-305 overflowed 10^(3 - e10) to +inf, printed "0e-323"
 * (understating it) and converted +inf to an integer (undefined behaviour, caught by UBSan). Every figure down to
 * the smallest subnormal must print as a number at least as large as itself, in both summaries. */
static void test_guarantee_rounds_up_the_tiniest_figures(void **state) {
    (void)state;
    const double tiny[] = {1e-300, 1e-305, 9.99e-306, 1e-306, 3.3e-308, 2.2250738585072014e-308, 1e-310, 1.5e-320,
                           4.9406564584124654e-324};
    char buf[400], alone[32];
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        dprec_guarantee g = {"gauss-gd", 1, DPREC_UNIT_USER, DPREC_MODEL_CENTRAL, tiny[i], tiny[i], "RDP"};
        assert_int_equal(dprec_format_up(tiny[i], alone, sizeof alone), DPREC_OK);
        double back = strtod(alone, NULL);
        if (!(back >= tiny[i] && back <= tiny[i] * 1.002)) fail_msg("%g printed as %s", tiny[i], alone);
        assert_int_equal(dprec_guarantee_text(&g, buf, sizeof buf), DPREC_OK);
        char expect[120];
        snprintf(expect, sizeof expect, "epsilon = %s, delta = %s ", alone, alone);
        if (strstr(buf, expect) == NULL) fail_msg("%g: %s", tiny[i], buf);
        assert_int_equal(dprec_guarantee_json(&g, buf, sizeof buf), DPREC_OK);
        snprintf(expect, sizeof expect, "\"epsilon\":%s,\"delta\":%s,", alone, alone);
        if (strstr(buf, expect) == NULL) fail_msg("%g: %s", tiny[i], buf);
    }
}

/* Issue 36, point 5: a tolerance of 1e-9 treated values just above a 4-digit figure as that figure, so
 * 1.0000000000001 printed as "1". A printed figure read back as a double must be at least the value, for every
 * value: the one just above 1 (one ulp), just above other exact decimals, and a sweep over twenty decades; and it
 * must not overstate by more than the fourth digit needs. A value that is the double of a 4-digit decimal prints
 * as that decimal. */
static void test_guarantee_never_understates_by_a_rounding_tolerance(void **state) {
    (void)state;
    char out[32];
    const struct {
        double v;
        const char *s;
    } cases[] = {{1.0000000000001, "1.001"}, {1.0 + 0x1p-52, "1.001"}, {0.1, "0.1"}, {1e-6, "1e-06"},
                 {0.30000000000000004, "0.3001"}, {2.5 + 1e-12, "2.501"}, {1e-19, "1e-19"}, {10.0, "10"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(dprec_format_up(cases[i].v, out, sizeof out), DPREC_OK);
        if (strcmp(out, cases[i].s) != 0) fail_msg("%.17g printed as %s, expected %s", cases[i].v, out, cases[i].s);
    }
    uint64_t x = 0x9e3779b97f4a7c15u; /* splitmix64: a fixed sweep, not privacy randomness */
    for (int i = 0; i < 20000; i++) {
        x += 0x9e3779b97f4a7c15u;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        z ^= z >> 31;
        double v = pow(10.0, -14.0 + 20.0 * (double)(z >> 11) * 0x1p-53);
        if (i % 4 == 1) v = nextafter(floor(v * 1000.0) / 1000.0, INFINITY); /* one ulp above a decimal */
        if (!(v > 0.0)) continue;
        assert_int_equal(dprec_format_up(v, out, sizeof out), DPREC_OK);
        double back = strtod(out, NULL);
        if (!(back >= v && back <= v * 1.0011)) fail_msg("%.17g printed as %s (read back %.17g)", v, out, back);
    }
}

static void test_guarantee_json_is_complete_and_caveats_are_shown(void **state) {
    (void)state;
    char buf[600];
    dprec_guarantee g = {"sgld", 3, DPREC_UNIT_USER, DPREC_MODEL_POSTERIOR_HEURISTIC, 1.0, 1e-6, "posterior sampling"};
    assert_int_equal(dprec_guarantee_json(&g, buf, sizeof buf), DPREC_OK);
    assert_non_null(strstr(buf, "{\"protocol\":\"sgld\",\"job_id\":3,\"unit\":\"user\",\"model\":\"posterior-sampling heuristic\","
                                "\"epsilon\":1,\"delta\":1e-06,\"accountant\":\"posterior sampling\",\"caveat\":\"holds only"));
    assert_int_equal(buf[strlen(buf) - 1], '}');
    assert_int_equal(dprec_guarantee_text(&g, buf, sizeof buf), DPREC_OK);
    assert_non_null(strstr(buf, "caveat: holds only for an exact posterior sample"));
    dprec_guarantee none = {"plain", 1, DPREC_UNIT_USER, DPREC_MODEL_NONE, 0, 0, NULL};
    assert_int_equal(dprec_guarantee_json(&none, buf, sizeof buf), DPREC_OK);
    assert_non_null(strstr(buf, "\"epsilon\":\"inf\""));
    assert_int_equal(dprec_guarantee_text(&none, buf, sizeof buf), DPREC_OK);
    assert_non_null(strstr(buf, "epsilon = inf"));
    dprec_guarantee q = {"a\"b", 1, DPREC_UNIT_USER, DPREC_MODEL_LOCAL, 1, 0, "x\ny"};
    assert_int_equal(dprec_guarantee_json(&q, buf, sizeof buf), DPREC_OK);
    assert_non_null(strstr(buf, "\"protocol\":\"a\\\"b\""));
    assert_non_null(strstr(buf, "\"accountant\":\"x\\u000ay\""));
    char small[20];
    assert_int_equal(dprec_guarantee_text(&g, small, sizeof small), DPREC_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(strlen(small), sizeof small - 1);
    g.epsilon = -1;
    assert_int_equal(dprec_guarantee_text(&g, buf, sizeof buf), DPREC_ERR_INVALID_ARGUMENT);
    g.epsilon = 1;
    g.unit = (dprec_unit)9;
    assert_int_equal(dprec_guarantee_json(&g, buf, sizeof buf), DPREC_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_report_is_charged_and_stored_before_it_can_be_sent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_past_the_cap_is_refused_and_never_built, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_caps_allow_no_private_report, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumulative_job_epsilon_never_decreases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ledger_full_and_builder_failures_charge_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_failed_write_charges_nothing_and_a_failed_mirror_withholds_the_report,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_charge_survives_damage_to_the_newest_generation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reports_are_blocked_when_every_generation_is_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_refuses_writes_until_a_load_establishes_what_storage_holds, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_rename_reported_failed_but_applied_forces_a_reload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_encrypted_store_tells_a_wrong_key_from_damage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_job_whose_fingerprint_changes_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_job_never_charges_more_rounds_than_it_declared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decisions_are_recorded_once_and_rounds_only_go_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_store_of_sdk_0_1_0_loads_with_its_ledger_and_decisions_converted, setup,
                                        teardown),
        cmocka_unit_test(test_guarantee_text_says_unit_model_and_rounds_up),
        cmocka_unit_test(test_guarantee_rounds_up_the_tiniest_figures),
        cmocka_unit_test(test_guarantee_never_understates_by_a_rounding_tolerance),
        cmocka_unit_test(test_guarantee_json_is_complete_and_caveats_are_shown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
