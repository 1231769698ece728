/* Tests of dprec_client_sync against a fake aggregator served in-process: register, fetch the job, stream a
 * release signed with a real ECDSA P-256 key, report, acknowledge; pending reports re-sent byte for byte
 * after a crash; tampered and foreign signatures refused with nothing charged; Retry-After and backoff;
 * participation decided once per round; refusals that must not leak a report. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dprec/dprec.h"
#include "dprec/sync.h"
#include "fake_agg.h"
#include "fake_port.h"
#include "report.h"

#define JOB 7u
#define M 20u
#define D 4u

/* A release of job JOB, version `version`, with V and the item biases from seed, signed by the fake's key. */
static unsigned char *signed_release(fake_signer *s, uint64_t version, uint64_t seed, size_t *len) {
    float v[M * D], b[M];
    uint64_t r = seed;
    for (size_t i = 0; i < M * D; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(r >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    for (size_t j = 0; j < M; j++) b[j] = (float)j / 40.0f - 0.25f;
    unsigned char *buf = fake_signed_release(s, JOB, version, M, D, v, b, 3.5f, len);
    /* the SDK's own checks agree that this is a well-formed release */
    dprec_release_info check;
    assert_int_equal(dprec_release_check(buf, *len, &check), DPREC_OK);
    return buf;
}

/* ---- fixture --------------------------------------------------------------------------------------------- */

typedef struct fixture {
    fake_port fake;
    dprec_port port;
    dprec_config cfg;
    void *mem;
    dprec_client *c;
    fake_signer key;
    fake_agg srv;
    dprec_transport t;
    dprec_sync_config sc;
} fixture;

static void reopen(fixture *f) {
    if (f->c) dprec_client_free(f->c);
    free(f->mem);
    f->c = NULL;
    size_t need = dprec_client_required_size(&f->cfg);
    assert_true(need > 0);
    f->mem = malloc(need);
    assert_int_equal(dprec_client_init(&f->c, &f->cfg, &f->port, f->mem, need), DPREC_OK);
    assert_int_equal(dprec_store_load(f->c), DPREC_OK);
}

static void use_round(fixture *f, uint64_t round) {
    size_t len = 0;
    f->srv.round = round;
    unsigned char *rel = signed_release(&f->key, round, 1000 + round, &len);
    fake_agg_use_release(&f->srv, rel, len);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    fake_port_init(&f->fake, &f->port);
    dprec_config_default(&f->cfg);
    f->cfg.num_items = M;
    f->cfg.dim = D;
    f->cfg.rating_capacity = 50;
    f->cfg.allow_non_private = 1;
    f->cfg.max_report_bytes = 1024;
    reopen(f);
    static const uint32_t items[] = {1, 3, 4, 8, 11, 15, 19};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        assert_int_equal(dprec_store_put(f->c, items[i], (float)(1 + (i * 3) % 5), 100), DPREC_OK);

    fake_signer_init(&f->key, 42);
    fake_agg_init(&f->srv, &f->key, JOB, M, D);
    f->srv.deadline = f->fake.wall + 30;
    use_round(f, 3);
    fake_agg_transport(&f->srv, &f->t);
    f->sc.job_id = JOB;
    f->sc.release_key = f->key.pub;
    f->sc.release_key_len = f->key.pub_len;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dprec_client_free(f->c);
    free(f->mem);
    fake_agg_free(&f->srv);
    fake_signer_free(&f->key);
    fake_port_free(&f->fake);
    free(f);
    return 0;
}

static int sync_once(fixture *f, dprec_sync_result *r) {
    return dprec_client_sync(f->c, &f->t, &f->sc, r);
}

/* ---- tests ----------------------------------------------------------------------------------------------- */

static void test_sync_registers_fits_reports_and_acknowledges(void **state) {
    fixture *f = *state;
    f->srv.chunk = 7; /* odd chunks: header, rows and signature all straddle chunk boundaries */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 3);
    assert_int_equal(r.release_version, 3);
    assert_int_equal(r.job_done, 0);
    assert_true(r.retry_after_ms >= 1000 && r.retry_after_ms <= 30000);
    assert_int_equal(f->srv.registrations, 1);
    assert_int_equal(f->srv.accepted, 1);
    assert_int_equal(dprec_report_pending_count(f->c), 0);

    /* the report: the plain payload of docs/protocol.md, carrying the fitted vector and every rating */
    dprec_envelope e;
    assert_int_equal(dprec_envelope_parse(f->srv.last_post, f->srv.last_post_len, &e), DPREC_OK);
    assert_int_equal(e.protocol, DPREC_PROTO_PLAIN);
    assert_int_equal(e.job_id, JOB);
    assert_int_equal(e.round, 3);
    assert_int_equal(e.release_version, 3);
    uint32_t n = dprec_store_count(f->c);
    assert_int_equal(e.payload_len, 8 + 4 * D + 8 * n);
    uint32_t dd, nn;
    memcpy(&dd, e.payload, 4);
    memcpy(&nn, e.payload + 4, 4);
    assert_int_equal(dd, D);
    assert_int_equal(nn, n);
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_OK);
    assert_memory_equal(e.payload + 8, u, sizeof u);
    for (uint32_t i = 0; i < n; i++) {
        dprec_rating rt;
        assert_int_equal(dprec_store_at(f->c, i, &rt), DPREC_OK);
        uint32_t item;
        float value;
        memcpy(&item, e.payload + 8 + 4 * D + 8 * i, 4);
        memcpy(&value, e.payload + 8 + 4 * D + 8 * i + 4, 4);
        assert_int_equal(item, rt.item);
        assert_true(value == rt.value);
    }
    /* the user vector is the one dprec_fit computes on the same release, once the app verified it */
    float ref[D];
    assert_int_equal(dprec_fit(f->c, f->srv.release, f->srv.release_len), DPREC_ERR_RELEASE_UNVERIFIED);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = f->key.pub;
    vc.release_key_len = f->key.pub_len;
    assert_int_equal(dprec_release_verify(f->c, f->srv.release, f->srv.release_len, &vc, NULL), DPREC_OK);
    assert_int_equal(dprec_fit(f->c, f->srv.release, f->srv.release_len), DPREC_OK);
    assert_int_equal(dprec_user_vector(f->c, ref, D), DPREC_OK);
    assert_memory_equal(ref, u, sizeof u);

    /* the ledger: one non-private report, recorded with an infinite epsilon */
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1);
    assert_int_equal(line.last_round, 3);
    assert_int_equal(line.model, DPREC_MODEL_NONE);
    assert_true(line.epsilon > 1e308);

    /* the token is durable: a restarted device does not register again, and has nothing to do this round */
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(f->srv.registrations, 1);
    assert_int_equal(f->srv.accepted, 1);

    /* the next round gets the next report */
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 4);
    assert_int_equal(f->srv.accepted, 2);
}

static void test_sync_second_call_in_the_same_round_sends_nothing(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    int posts = f->srv.report_posts, releases = f->srv.release_gets;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
        /* come back around the deadline (30 s away), never sooner than 1 s */
        assert_true(r.retry_after_ms >= 1000 && r.retry_after_ms <= 30000);
    }
    assert_int_equal(f->srv.report_posts, posts);
    assert_int_equal(f->srv.release_gets, releases);
    /* past the deadline, still open: poll again in a second */
    f->fake.wall = f->srv.deadline + 5;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.retry_after_ms, 1000);
}

static void test_sync_resends_the_same_bytes_after_a_crash(void **state) {
    fixture *f = *state;
    f->srv.fail_report_posts = 1;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
    assert_int_equal(f->srv.accepted, 0);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1); /* charged before it left */

    /* the process dies; a new one loads the store and syncs */
    reopen(f);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.accepted, 1);
    assert_int_equal(f->srv.report_posts, 2);
    assert_int_equal(f->srv.first_post_len, f->srv.last_post_len);
    assert_memory_equal(f->srv.first_post, f->srv.last_post, f->srv.last_post_len); /* byte for byte */
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 1); /* never charged twice */
    assert_int_equal(f->srv.release_gets, 1); /* nor recomputed */
}

static void test_sync_refuses_a_tampered_signature_and_charges_nothing(void **state) {
    fixture *f = *state;
    f->srv.release[f->srv.release_len - 5] ^= 0x01; /* inside the DER signature */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_ERR_NOT_FOUND);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(f->srv.report_posts, 0);
    float u[D];
    assert_int_equal(dprec_user_vector(f->c, u, D), DPREC_ERR_STATE); /* the fit was not accepted */
    /* the client is usable afterwards */
    assert_int_equal(dprec_store_put(f->c, 2, 4.0f, 100), DPREC_OK);
}

static void test_sync_refuses_a_release_signed_by_another_key(void **state) {
    fixture *f = *state;
    fake_signer other;
    fake_signer_init(&other, 4242);
    f->sc.release_key = other.pub; /* the app pinned another aggregator */
    f->sc.release_key_len = other.pub_len;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(f->srv.report_posts, 0);
    fake_signer_free(&other);
}

static void test_sync_refuses_a_release_whose_body_was_changed(void **state) {
    fixture *f = *state;
    f->srv.release[DPREC_RELEASE_HEADER_SIZE + 9] ^= 0x01; /* a body byte: the digest no longer matches */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_DIGEST);
    assert_int_equal(f->srv.report_posts, 0);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_ERR_NOT_FOUND);
}

static void test_sync_refuses_an_unsigned_release(void **state) {
    fixture *f = *state;
    float v[M * D], b[M];
    for (size_t i = 0; i < M * D; i++) v[i] = 0.1f;
    for (size_t j = 0; j < M; j++) b[j] = 0.0f;
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.release_version = 3;
    info.job_id = JOB;
    info.num_items = M;
    info.dim = D;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    info.global_mean = 3.0f;
    size_t cap = (size_t)dprec_release_size(M, D, DPREC_RELEASE_HAS_BIASES, 0), written = 0;
    unsigned char *rel = malloc(cap);
    assert_int_equal(dprec_release_write(rel, cap, &info, v, b, &written), DPREC_OK);
    fake_agg_use_release(&f->srv, rel, written);
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_refuses_a_signed_release_of_another_round(void **state) {
    fixture *f = *state;
    /* a genuine release, replayed for the wrong round */
    size_t len = 0;
    unsigned char *old = signed_release(&f->key, 2, 77, &len);
    fake_agg_use_release(&f->srv, old, len);
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_honours_retry_after_on_503(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK); /* registered, reported round 3 */
    use_round(f, 4);
    f->srv.override_prefix = "/v1/jobs/";
    f->srv.override_count = 1;
    f->srv.override_status = 503;
    f->srv.override_retry_after = 120;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
    assert_true(r.retry_after_ms >= 120000);
    /* 429 on the report POST: the report stays pending and is sent on the next call */
    f->srv.override_prefix = "/v1/jobs/7/reports";
    f->srv.override_count = 1;
    f->srv.override_status = 429;
    f->srv.override_retry_after = 7;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_true(r.retry_after_ms >= 7000);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.accepted, 2);
}

static void test_sync_backs_off_exponentially_up_to_fifteen_minutes(void **state) {
    fixture *f = *state;
    f->srv.override_prefix = "/v1/";
    f->srv.override_count = 1000;
    f->srv.override_status = 0; /* no response at all */
    uint64_t sum_late = 0;
    for (int k = 1; k <= 24; k++) {
        dprec_sync_result r;
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
        assert_int_equal(r.last_error, DPREC_ERR_NETWORK);
        uint64_t cap = k <= 10 ? 1000ull << (k - 1) : 900000ull;
        if (cap > 900000ull) cap = 900000ull;
        assert_true(r.retry_after_ms <= cap);
        if (k > 14) sum_late += r.retry_after_ms;
    }
    /* full jitter: the mean of the last 10 waits is near 450 s; below 200 s with probability < 1e-9 */
    assert_true(sum_late / 10 > 200000);
    /* a success resets the backoff */
    f->srv.override_count = 0;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    f->srv.override_count = 1;
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_true(r.retry_after_ms <= 1000);
}

static void test_sync_with_participation_zero_never_reports(void **state) {
    fixture *f = *state;
    f->srv.participation = 0.0;
    for (uint64_t round = 3; round < 8; round++) {
        use_round(f, round);
        for (int i = 0; i < 3; i++) {
            dprec_sync_result r;
            assert_int_equal(sync_once(f, &r), DPREC_OK);
            assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
        }
    }
    assert_int_equal(f->srv.release_gets, 0);
    assert_int_equal(f->srv.report_posts, 0);
    assert_int_equal(dprec_ledger_count(f->c), 0);
}

static void test_sync_decides_participation_once_per_round_even_across_restarts(void **state) {
    fixture *f = *state;
    f->srv.participation = 0.5;
    int sat_out = 0, took_part = 0;
    for (uint64_t round = 3; round < 40 && (!sat_out || !took_part); round++) {
        use_round(f, round);
        int gets = f->srv.release_gets;
        dprec_sync_result r;
        assert_int_equal(sync_once(f, &r), DPREC_OK);
        int participated = f->srv.release_gets > gets;
        if (participated) {
            took_part++;
            assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
        } else {
            sat_out++;
            assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
            /* asking again, or after a restart, never re-rolls the decision */
            for (int i = 0; i < 5; i++) {
                if (i == 2) reopen(f);
                assert_int_equal(sync_once(f, &r), DPREC_OK);
                assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
            }
            assert_int_equal(f->srv.release_gets, gets);
        }
    }
    /* with p = 1/2 and a fixed seed both happen (else: probability 2^-36 at an unlucky seed) */
    assert_true(sat_out > 0 && took_part > 0);
}

static void test_sync_refuses_plain_unless_the_app_allows_non_private_reports(void **state) {
    fixture *f = *state;
    f->cfg.allow_non_private = 0;
    reopen(f);
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_NON_PRIVATE);
    assert_int_equal(f->srv.report_posts, 0);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    assert_int_equal(dprec_ledger_count(f->c), 0);
}

static void test_sync_reports_a_finished_job(void **state) {
    fixture *f = *state;
    f->srv.state = "done";
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_NOTHING_TO_DO);
    assert_int_equal(r.job_done, 1);
    assert_int_equal(f->srv.release_gets, 0);
}

static void test_sync_refuses_an_unknown_protocol_and_a_mismatched_job(void **state) {
    fixture *f = *state;
    f->srv.protocol = "quantum-gd";
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_UNSUPPORTED);
    f->srv.protocol = "plain";
    f->cfg.dim = D + 1; /* the job's d is not the client's */
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(f->srv.report_posts, 0);
}

static void test_sync_drops_a_pending_report_whose_round_closed(void **state) {
    fixture *f = *state;
    f->srv.fail_report_posts = 1;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(dprec_report_pending_count(f->c), 1);
    /* the round closed meanwhile: the stored report can never be accepted */
    use_round(f, 4);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(dprec_report_pending_count(f->c), 0);
    /* the dead report's charge stays; the device takes part in the new round */
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(r.round, 4);
    dprec_ledger_entry line;
    assert_int_equal(dprec_ledger_job(f->c, JOB, &line), DPREC_OK);
    assert_int_equal(line.reports, 2);
    assert_int_equal(f->srv.accepted, 1);
}

static void test_sync_registers_again_when_the_token_is_refused(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    use_round(f, 4);
    memcpy(f->srv.token, "ffffffff", 8); /* the aggregator lost its devices */
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.registrations, 2);
}

static void test_sync_rejects_bad_arguments_and_state(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    assert_int_equal(dprec_client_sync(NULL, &f->t, &f->sc, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, NULL, &f->sc, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, &f->t, NULL, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_client_sync(f->c, &f->t, &f->sc, NULL), DPREC_ERR_INVALID_ARGUMENT);
    dprec_sync_config nokey = f->sc;
    nokey.release_key = NULL;
    assert_int_equal(dprec_client_sync(f->c, &f->t, &nokey, &r), DPREC_ERR_INVALID_ARGUMENT);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK); /* a stream in progress */
    assert_int_equal(dprec_client_sync(f->c, &f->t, &f->sc, &r), DPREC_ERR_STATE);
    assert_int_equal(dprec_fit_end(f->c), DPREC_ERR_RELEASE_TRUNCATED);
}

static void test_sync_refuses_an_oversized_or_malformed_job(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    f->srv.state = "paused"; /* not a state of protocol v1 */
    assert_int_equal(sync_once(f, &r), DPREC_ERR_PROTOCOL);
    f->srv.state = "running";
    static char pad[6000];
    memset(pad, 'x', sizeof pad - 1);
    f->srv.extra = pad; /* a job object above the 4 KiB response buffer */
    assert_int_equal(sync_once(f, &r), DPREC_ERR_PROTOCOL);
    f->srv.extra = "\"note\": \"caf\\u00e9 \\\"quoted\\\"\", \"nested\": {\"a\": [1, 2, {\"b\": null}]}";
    assert_int_equal(sync_once(f, &r), DPREC_OK); /* unknown members are ignored */
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(f->srv.report_posts, 1);
}

/* ---- errors a developer can act on (issue 38) ------------------------------------------------------------- */

static const char *detail_of(const dprec_client *c) {
    static char buf[600];
    (void)dprec_client_last_error_detail(c, buf, sizeof buf);
    return buf;
}

static void test_sync_an_unknown_job_fails_for_good_with_the_servers_status_code_and_message(void **state) {
    fixture *f = *state;
    f->sc.job_id = 99; /* the aggregator has no job 99: 404 {"error": "not_found", "message": "test"} */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_PROTOCOL);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED); /* before: RETRY_LATER with retry_after_ms 0, a hot loop */
    assert_int_equal(r.retry_after_ms, 0);
    assert_int_equal(r.last_error, DPREC_ERR_PROTOCOL);
    dprec_error_info info;
    DPREC_STRUCT_INIT(&info);
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_OK);
    assert_int_equal(info.http_status, 404);
    assert_string_equal(info.server_code, "not_found");
    assert_string_equal(info.message, "test");
    assert_string_equal(info.request, "GET /v1/jobs/99");
    assert_int_equal(info.cause, 0); /* not a stale errno */
    assert_string_equal(detail_of(f->c), "GET /v1/jobs/99: HTTP 404 not_found: test");
    /* the right job: the call succeeds and nothing of the failure is left */
    f->sc.job_id = JOB;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_string_equal(detail_of(f->c), "");
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_OK);
    assert_int_equal(info.http_status, 0);
}

static void test_sync_permanent_refusals_say_failed_and_never_retry_at_once(void **state) {
    fixture *f = *state;
    dprec_sync_result r;
    /* a release whose signature does not verify */
    f->srv.release[f->srv.release_len - 5] ^= 0x01;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_SIGNATURE);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_int_equal(r.retry_after_ms, 0);
    assert_int_equal(r.last_error, DPREC_ERR_RELEASE_SIGNATURE);
    assert_non_null(strstr(detail_of(f->c), "signature does not verify"));
    f->srv.release[f->srv.release_len - 5] ^= 0x01;
    /* a protocol this SDK does not have */
    f->srv.protocol = "quantum-gd";
    assert_int_equal(sync_once(f, &r), DPREC_ERR_UNSUPPORTED);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_non_null(strstr(detail_of(f->c), "\"quantum-gd\" is not built into this SDK"));
    f->srv.protocol = "plain";
    /* a non-private report the app does not allow (as a budget refusal: the device's own policy) */
    f->cfg.allow_non_private = 0;
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_ERR_NON_PRIVATE);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_int_equal(r.last_error, DPREC_ERR_NON_PRIVATE);
    assert_int_equal(r.retry_after_ms, 0);
    assert_true(strlen(detail_of(f->c)) > 0);
    /* a job of another d */
    f->cfg.allow_non_private = 1;
    f->cfg.dim = D + 1;
    reopen(f);
    assert_int_equal(sync_once(f, &r), DPREC_ERR_RELEASE_MISMATCH);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_non_null(strstr(detail_of(f->c), "d, m or rating scale"));
    /* a client inside a stream: FAILED, and the text says which stream */
    f->cfg.dim = D;
    reopen(f);
    assert_int_equal(dprec_fit_begin(f->c), DPREC_OK);
    assert_int_equal(sync_once(f, &r), DPREC_ERR_STATE);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_non_null(strstr(detail_of(f->c), "a fit stream is open"));
}

static void test_sync_a_failure_of_the_devices_storage_retries_later(void **state) {
    fixture *f = *state;
    fake_port_arm(&f->fake, 0, 1, 0, 0); /* the registration's save fails */
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_ERR_IO);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER); /* with a backoff, not a hot loop at 0 */
    assert_int_equal(r.last_error, DPREC_ERR_IO);
    assert_true(r.retry_after_ms <= 1000);
    assert_int_equal(dprec_client_last_cause(f->c), EIO);
    fake_port_arm(&f->fake, 0, 0, 0, 0);
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_REPORTED);
    assert_int_equal(dprec_client_last_cause(f->c), 0);
}

static void test_sync_a_transient_refusal_keeps_its_detail_with_retry_later(void **state) {
    fixture *f = *state;
    f->srv.override_prefix = "/v1/jobs/";
    f->srv.override_count = 1;
    f->srv.override_status = 503;
    dprec_sync_result r;
    assert_int_equal(sync_once(f, &r), DPREC_OK);
    assert_int_equal(r.outcome, DPREC_SYNC_RETRY_LATER);
    assert_string_equal(detail_of(f->c), "GET /v1/jobs/7: HTTP 503 busy: test");
}

/* A transport that fails every request the way a pinned TLS connection to the wrong key does, with its text. */
static int tls_refused(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *user,
                       dprec_http_response *resp) {
    (void)ctx, (void)req, (void)sink, (void)user, (void)resp;
    return DPREC_ERR_TLS;
}
static const char *tls_text(void *ctx) {
    (void)ctx;
    return "the server's public key matches no pinned key\n\x1b[2J"; /* a control sequence never reaches the app */
}
static const char *must_not_be_called(void *ctx) {
    (void)ctx;
    fail_msg("the SDK read last_error past a 0.2 transport's struct_size");
    return "";
}

static void test_sync_a_tls_failure_carries_the_transports_text_and_fails_for_good(void **state) {
    fixture *f = *state;
    dprec_transport t;
    DPREC_STRUCT_INIT(&t);
    t.request = tls_refused;
    t.last_error = tls_text;
    dprec_sync_result r;
    assert_int_equal(dprec_client_sync(f->c, &t, &f->sc, &r), DPREC_ERR_TLS);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_int_equal(r.retry_after_ms, 0);
    dprec_error_info info;
    DPREC_STRUCT_INIT(&info);
    assert_int_equal(dprec_client_last_error_info(f->c, &info), DPREC_OK);
    assert_int_equal(info.http_status, 0);
    assert_string_equal(info.request, "POST /v1/register");
    assert_string_equal(info.message, "the server's public key matches no pinned key??[2J");
    /* a transport of 0.2's headers has no last_error: nothing past its size is read */
    t.struct_size = (uint32_t)offsetof(dprec_transport, last_error);
    t.last_error = must_not_be_called;
    assert_int_equal(dprec_client_sync(f->c, &t, &f->sc, &r), DPREC_ERR_TLS);
    assert_int_equal(r.outcome, DPREC_SYNC_FAILED);
    assert_string_equal(detail_of(f->c), "POST /v1/register");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sync_registers_fits_reports_and_acknowledges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_second_call_in_the_same_round_sends_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_resends_the_same_bytes_after_a_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_tampered_signature_and_charges_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_release_signed_by_another_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_release_whose_body_was_changed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_unsigned_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_a_signed_release_of_another_round, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_honours_retry_after_on_503, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_backs_off_exponentially_up_to_fifteen_minutes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_with_participation_zero_never_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_decides_participation_once_per_round_even_across_restarts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_plain_unless_the_app_allows_non_private_reports, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sync_reports_a_finished_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_unknown_protocol_and_a_mismatched_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_drops_a_pending_report_whose_round_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_registers_again_when_the_token_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_rejects_bad_arguments_and_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_refuses_an_oversized_or_malformed_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_an_unknown_job_fails_for_good_with_the_servers_status_code_and_message,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_permanent_refusals_say_failed_and_never_retry_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_a_failure_of_the_devices_storage_retries_later, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_a_transient_refusal_keeps_its_detail_with_retry_later, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_a_tls_failure_carries_the_transports_text_and_fails_for_good, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
