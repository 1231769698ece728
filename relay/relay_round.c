/* dprec relay — what one operation does inside the writer's transaction (relay_state.c): a device's registration, a
 * job's creation, and on a job's open round: its opening (the seeds it draws), a share added to its sums, its close
 * with the signed sum.
 *
 * Static mode ("relay"): a round closes once exactly K shares (K = the job's cohort) arrived; more are refused. Dynamic
 * mode: each share carries a gradient vector Phi and a noise vector tau; the first K shares to commit make the round's
 * noise total (their tau), every share's Phi goes into the gradient sum, and at close the relay adds alpha (its own
 * mask, from a seed it keeps) to the noise sum and takes it off the gradient sum, as the paper's Scenario 3 does.
 * Closing signs the round's sums with the relay's key (common/protocols/dpmf.h has the layout).
 *
 * Nothing here changes the state in memory: an operation changes the batch's view of its round (scratch) and the
 * database, and the writer makes the view the state once the transaction committed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include "base/agg_base.h"
#include "rounds/agg_sign.h"
#include "bytes.h"
#include "dpmf.h"
#include "relay.h"
#include "relay_priv.h"

static scratch *scratch_of(scratch *sc, size_t *nsc, size_t cap, rjob *j) {
    for (size_t i = 0; i < *nsc; i++)
        if (sc[i].job == j) return &sc[i];
    if (*nsc == cap) return NULL;
    scratch *s = &sc[(*nsc)++];
    memset(s, 0, sizeof *s);
    s->job = j;
    s->n_grad = j->n_grad;
    s->n_noise = j->n_noise;
    return s;
}

static int scratch_vectors(scratch *s) {
    rjob *j = s->job;
    if (s->grad != NULL) return 0;
    s->grad = malloc(relay_cells(j) * sizeof(uint64_t));
    s->noise = j->noise != NULL ? malloc(relay_cells(j) * sizeof(uint64_t)) : NULL;
    if (s->grad == NULL || (j->noise != NULL && s->noise == NULL)) return -1;
    memcpy(s->grad, j->grad, relay_cells(j) * sizeof(uint64_t));
    if (j->noise != NULL) memcpy(s->noise, j->noise, relay_cells(j) * sizeof(uint64_t));
    return 0;
}

static int reply_share(relay_op *op, int status, const char *code, const char *msg, int duplicate, int64_t round) {
    if (code != NULL) return agg_respond_error(op->resp, status, code, msg);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "accepted", 1);
    cJSON_AddBoolToObject(o, "duplicate", duplicate);
    cJSON_AddNumberToObject(o, "round", (double)round);
    return agg_respond_json(op->resp, 200, o);
}

/* The signed sum of a closed round (common/protocols/dpmf.h: DPREC_DPMF_MAGIC_SUM), malloc'd. */
static unsigned char *build_sum(dprec_relay *r, rjob *j, const scratch *s, size_t *len) {
    sqlite3_stmt *st = NULL;
    uint32_t ng = s->n_grad, nn = j->mode == DPREC_DPMF_DYNAMIC ? s->n_noise : s->n_grad;
    size_t total = dprec_dpmf_sum_size(j->mode, j->m, j->coords, ng, nn, DPREC_DPMF_SIG_MAX);
    unsigned char *b = malloc(total);
    if (b == NULL) return NULL;
    memcpy(b, DPREC_DPMF_MAGIC_SUM, 4);
    dprec_st32(b + 4, 1u);
    dprec_st32(b + 8, (uint32_t)j->mode);
    dprec_st32(b + 12, j->coords);
    dprec_st64(b + 16, (uint64_t)j->id);
    dprec_st64(b + 24, (uint64_t)j->round);
    dprec_st32(b + 32, j->m);
    dprec_st32(b + 36, ng);
    dprec_st32(b + 40, nn);
    unsigned char *p = b + DPREC_DPMF_SUM_HEADER;
    dprec_dpmf_prg alpha;
    int dyn = j->mode == DPREC_DPMF_DYNAMIC;
    if (dyn && dprec_dpmf_prg_init(&alpha, s->alpha_seed, DPREC_DPMF_DOMAIN_ALPHA) != 0) {
        free(b);
        return NULL;
    }
    for (size_t c = 0; c < relay_cells(j); c++) { /* dynamic: Phi - alpha, then alpha + tau (the paper's Scenario 3) */
        uint64_t a = 0;
        if (dyn && dprec_dpmf_prg_u64(&alpha, c, &a) != 0) a = 0;
        dprec_st64(p + 8 * c, s->grad[c] - a);
        if (dyn) dprec_st64(p + 8 * (relay_cells(j) + c), s->noise[c] + a);
    }
    if (dyn) dprec_dpmf_prg_free(&alpha);
    p += 8u * relay_cells(j) * (dyn ? 2u : 1u);
    for (int pass = 0; pass < (dyn ? 2 : 1); pass++) {
        const char *sql = pass == 0 ? "SELECT report_id FROM shares WHERE job = ? AND round = ? ORDER BY seq"
                                    : "SELECT report_id FROM shares WHERE job = ? AND round = ? AND noise = 1 ORDER BY seq";
        uint32_t want = pass == 0 ? ng : nn, got = 0;
        if (sqlite3_prepare_v2(r->db, sql, -1, &st, NULL) != SQLITE_OK) goto fail;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        while (sqlite3_step(st) == SQLITE_ROW && got < want) {
            if (sqlite3_column_bytes(st, 0) != 16) goto fail;
            memcpy(p, sqlite3_column_blob(st, 0), 16);
            p += 16;
            got++;
        }
        sqlite3_finalize(st);
        st = NULL;
        if (got != want) goto fail;
    }
    /* the signature covers its own length field: sign until the length written is the length signed */
    unsigned char digest[32];
    size_t signed_len = (size_t)(p - b), sig_len = 0, want = DPREC_DPMF_SIG_MAX;
    for (int pass = 0; pass < 64; pass++) {
        dprec_st32(b + 44, (uint32_t)want);
        if (dprec_sha256(b, signed_len, digest) != 0 ||
            agg_sign_digest(&r->key, &r->sign_mu, relay_random, r, digest, p, DPREC_DPMF_SIG_MAX, &sig_len) != 0)
            goto fail;
        if (sig_len == want) {
            *len = signed_len + sig_len;
            return b;
        }
        want = sig_len;
    }
fail:
    if (st != NULL) sqlite3_finalize(st);
    free(b);
    return NULL;
}

/* Applies one operation inside the batch's transaction. 0, or -1 on a database failure (the batch is rolled back). The
 * answer goes into op->resp either way (a database failure: 500, set by the caller). */
int relay_apply(dprec_relay *r, relay_op *op, scratch *sc, size_t *nsc, size_t sccap, int64_t *seq) {
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (op->kind == OP_REGISTER) {
        const agg_enrollment *en = &op->enroll;
        int has_token = en->has_identity && en->token_len > 0;
        if (has_token) { /* each token registers one device (the writer is the only writer: no race) */
            if (sqlite3_prepare_v2(r->db, "SELECT device FROM enrollments WHERE token_sha256 = ?", -1, &st, NULL) !=
                SQLITE_OK)
                return -1;
            sqlite3_bind_blob(st, 1, en->token_digest, 32, SQLITE_TRANSIENT);
            int step = sqlite3_step(st);
            sqlite3_finalize(st);
            if (step == SQLITE_ROW) {
                op->device = 0;
                agg_respond_error(op->resp, 409, "enrollment_used", "this enrollment token has registered a device already");
                return 0;
            }
            if (step != SQLITE_DONE) return -1;
        }
        if (sqlite3_prepare_v2(r->db, "INSERT INTO devices (token_hash, created) VALUES (?, ?)", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_blob(st, 1, op->token_hash, 32, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, (int64_t)time(NULL));
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        op->device = rc == 0 ? sqlite3_last_insert_rowid(r->db) : 0;
        if (rc != 0 || !en->has_identity) return rc;
        if (sqlite3_prepare_v2(r->db, "INSERT INTO enrollments (device, identity, token, token_sha256) VALUES (?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, op->device);
        sqlite3_bind_blob(st, 2, en->identity, sizeof en->identity, SQLITE_TRANSIENT);
        if (has_token) {
            sqlite3_bind_blob(st, 3, en->token, (int)en->token_len, SQLITE_TRANSIENT);
            sqlite3_bind_blob(st, 4, en->token_digest, 32, SQLITE_TRANSIENT);
        }
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1; /* a failure rolls the whole batch back (the caller) */
        sqlite3_finalize(st);
        if (rc != 0) op->device = 0;
        return rc;
    }
    if (op->kind == OP_JOB_CREATE) {
        const cJSON *s = op->spec;
        int64_t id = (int64_t)cJSON_GetObjectItem(s, "job")->valuedouble;
        pthread_mutex_lock(&r->mu);
        int exists = relay_job_find(r, id) != NULL;
        pthread_mutex_unlock(&r->mu);
        if (exists) {
            agg_respond_error(op->resp, 409, "job_exists", "the relay already runs a job with this id");
            return 0;
        }
        if (sqlite3_prepare_v2(r->db, "INSERT INTO jobs (id, mode, m, coords, shares, max_shares, rounds, round) VALUES "
                                      "(?, ?, ?, ?, ?, ?, ?, 1)", -1, &st, NULL) != SQLITE_OK)
            return -1;
        const char *names[] = {"job", "mode", "m", "coords", "shares", "max_shares", "rounds"};
        for (int i = 0; i < 7; i++) sqlite3_bind_int64(st, i + 1, (int64_t)cJSON_GetObjectItem(s, names[i])->valuedouble);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        if (rc == 0) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "job", (double)id);
            agg_respond_json(op->resp, 201, o);
        }
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    rjob *j = relay_job_find(r, op->job);
    pthread_mutex_unlock(&r->mu);
    scratch *s = j != NULL ? scratch_of(sc, nsc, sccap, j) : NULL;
    if (j == NULL || s == NULL) {
        agg_respond_error(op->resp, j == NULL ? 404 : 503, j == NULL ? "not_found" : "busy", "no such job, or try again");
        return 0;
    }
    int has_seed = j->has_seed || s->opened;
    if (s->closed || op->round != j->round) {
        if (op->kind == OP_CLOSE && op->round < j->round) { /* closed before: its stored sum again (idempotent) */
            if (sqlite3_prepare_v2(r->db, "SELECT body FROM sums WHERE job = ? AND round = ?", -1, &st, NULL) != SQLITE_OK)
                return -1;
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int64(st, 2, op->round);
            if (sqlite3_step(st) == SQLITE_ROW) {
                size_t n = (size_t)sqlite3_column_bytes(st, 0);
                unsigned char *b = malloc(n > 0 ? n : 1);
                if (b != NULL) memcpy(b, sqlite3_column_blob(st, 0), n);
                op->resp->status = 200;
                op->resp->content_type = "application/octet-stream";
                op->resp->body = b;
                op->resp->body_len = b != NULL ? n : 0;
            } else {
                agg_respond_error(op->resp, 404, "not_found", "no sum for that round");
            }
            sqlite3_finalize(st);
            return 0;
        }
        agg_respond_error(op->resp, 409, "round_closed", "that round is not the relay's open round for this job");
        return 0;
    }
    if (op->kind == OP_ROUND_OPEN) {
        if (!has_seed) {
            if (relay_random(r, s->seed, 32) != 0 || relay_random(r, s->alpha_seed, 32) != 0) return -1;
            if (sqlite3_prepare_v2(r->db, "INSERT INTO rounds (job, round, seed, alpha_seed, grad, noise, n_grad, n_noise) "
                                          "VALUES (?, ?, ?, ?, zeroblob(?), zeroblob(?), 0, 0)", -1, &st, NULL) != SQLITE_OK)
                return -1;
            sqlite3_bind_int64(st, 1, j->id);
            sqlite3_bind_int64(st, 2, j->round);
            sqlite3_bind_blob(st, 3, s->seed, 32, SQLITE_TRANSIENT);
            sqlite3_bind_blob(st, 4, s->alpha_seed, 32, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 5, (int64_t)(relay_cells(j) * 8u));
            sqlite3_bind_int64(st, 6, j->noise != NULL ? (int64_t)(relay_cells(j) * 8u) : 0);
            rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
            sqlite3_finalize(st);
            if (rc != 0) return -1;
            s->opened = 1;
        }
        return 0; /* answered by the caller from the committed seed */
    }
    if (op->kind == OP_SHARE) {
        if (!has_seed) {
            agg_respond_error(op->resp, 409, "round_not_open", "fetch the round (GET /v1/jobs/{job}/rounds/{round}) first");
            return 0;
        }
        /* a retry of a stored share: the same answer; another share of the device in the round: refused */
        if (sqlite3_prepare_v2(r->db, "SELECT device, round FROM shares WHERE job = ? AND report_id = ?", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_blob(st, 2, op->report_id, 16, SQLITE_TRANSIENT);
        int found = sqlite3_step(st) == SQLITE_ROW;
        int64_t dev = found ? sqlite3_column_int64(st, 0) : 0, rnd = found ? sqlite3_column_int64(st, 1) : 0;
        sqlite3_finalize(st);
        if (found) {
            if (dev == op->device) reply_share(op, 200, NULL, NULL, 1, rnd);
            else agg_respond_error(op->resp, 409, "already_reported", "that report id belongs to another device");
            if (dev == op->device) {
                pthread_mutex_lock(&r->mu);
                r->met.shares_duplicate++;
                pthread_mutex_unlock(&r->mu);
            }
            return 0;
        }
        if (sqlite3_prepare_v2(r->db, "SELECT 1 FROM shares WHERE job = ? AND round = ? AND device = ?", -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        sqlite3_bind_int64(st, 3, op->device);
        found = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
        if (found) {
            agg_respond_error(op->resp, 409, "already_reported", "this device already sent a share in this round");
            return 0;
        }
        uint32_t cap = j->mode == DPREC_DPMF_RELAY ? j->shares : j->max_shares;
        if (s->n_grad >= cap) {
            agg_respond_error(op->resp, 409, "cohort_full", "the round already has all the shares it takes");
            return 0;
        }
        if (scratch_vectors(s) != 0) return -1;
        const unsigned char *phi = op->payload + 16, *tau = phi + 8u * relay_cells(j);
        for (size_t c = 0; c < relay_cells(j); c++) s->grad[c] += dprec_ld64(phi + 8 * c);
        int noise = j->mode == DPREC_DPMF_RELAY || s->n_noise < j->shares; /* dynamic: the first K shares' noise */
        if (j->mode == DPREC_DPMF_DYNAMIC && noise)
            for (size_t c = 0; c < relay_cells(j); c++) s->noise[c] += dprec_ld64(tau + 8 * c);
        if (sqlite3_prepare_v2(r->db, "INSERT INTO shares (job, round, report_id, device, noise, seq) VALUES (?, ?, ?, ?, ?, ?)",
                               -1, &st, NULL) != SQLITE_OK)
            return -1;
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        sqlite3_bind_blob(st, 3, op->report_id, 16, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 4, op->device);
        sqlite3_bind_int(st, 5, noise);
        sqlite3_bind_int64(st, 6, ++*seq);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
        if (rc != 0) return -1;
        s->n_grad++;
        if (noise) s->n_noise++;
        reply_share(op, 200, NULL, NULL, 0, j->round);
        return 0;
    }
    /* OP_CLOSE */
    if (!has_seed) {
        agg_respond_error(op->resp, 409, "round_empty", "no device fetched this round yet: nothing to close");
        return 0;
    }
    if ((j->mode == DPREC_DPMF_RELAY && s->n_grad != j->shares) || (j->mode == DPREC_DPMF_DYNAMIC && s->n_noise < j->shares)) {
        char msg[160];
        snprintf(msg, sizeof msg, "the round has %u shares (%u with noise) and needs %u %s", s->n_grad, s->n_noise,
                 j->shares, j->mode == DPREC_DPMF_RELAY ? "(the cohort)" : "with noise");
        agg_respond_error(op->resp, 409, "round_incomplete", msg);
        return 0;
    }
    if (scratch_vectors(s) != 0) return -1;
    if (!s->opened) memcpy(s->alpha_seed, j->alpha_seed, 32); /* the round's alpha (opened in an earlier batch) */
    size_t len = 0;
    unsigned char *sum = build_sum(r, j, s, &len);
    if (sum == NULL) return -1;
    if (sqlite3_prepare_v2(r->db, "INSERT INTO sums (job, round, body) VALUES (?, ?, ?)", -1, &st, NULL) != SQLITE_OK) {
        free(sum);
        return -1;
    }
    sqlite3_bind_int64(st, 1, j->id);
    sqlite3_bind_int64(st, 2, j->round);
    sqlite3_bind_blob(st, 3, sum, (int)len, SQLITE_TRANSIENT);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(st);
    if (rc == 0 && (sqlite3_prepare_v2(r->db, "UPDATE jobs SET round = round + 1 WHERE id = ?", -1, &st, NULL) != SQLITE_OK))
        rc = -1;
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, j->id);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
    }
    if (rc == 0 && sqlite3_prepare_v2(r->db, "DELETE FROM rounds WHERE job = ? AND round = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, j->id);
        sqlite3_bind_int64(st, 2, j->round);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
        sqlite3_finalize(st);
    }
    if (rc != 0) {
        free(sum);
        return -1;
    }
    s->closed = 1;
    op->resp->status = 200;
    op->resp->content_type = "application/octet-stream";
    op->resp->body = sum;
    op->resp->body_len = len;
    return 0;
}

