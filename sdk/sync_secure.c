/* dprec — the device's steps of a secure-aggregation round over the secagg routes (sdk/secure.h; docs/protocol.md
 * "Secure aggregation").
 *
 * One step per sync call, chosen by the phase the job shows for its open round: advertise (the round's public
 * keys, signed with the device's identity key), share (the encrypted key shares for the neighbours the aggregator
 * lists, once every neighbour's signed keys, identity and token passed), mask (the inbox of shares addressed to the
 * device: the masked input itself is then the round's report, fitted, charged and sent by sync.c like any other, the
 * protocol's build masking it and signing, in the same report, the neighbours it masked with), consistency (the
 * survivor set, signed once) and unmask (the reveals the aggregator asks for, once max(t, n_min) distinct identities
 * attested the set the device signed, a self-mask share only of a neighbour that signed it masked with this device). A
 * failed check makes the device leave the round: its secrets wiped, nothing more sent in it, the refusal logged and
 * returned.
 * A step's message stays in the secure area until its answer arrives and is re-sent byte for byte, while its
 * phase lasts, if the answer was lost. The round's secrets are drawn once and wiped once spent, and
 * common/secagg.c refuses any step out of order. Nothing here reads the user's ratings.
 *
 * Memory: the phase messages (at most DPREC_SECURE_IO_MAX bytes), the round's secrets and the reader that checks the
 * lists as they stream in (sdk/secure_check.c: one record at a time, whatever the list's length) live in the client's
 * secure area (sdk/secure.c); a POST's answer goes into a 256-byte buffer on the stack and is dropped. The job's
 * JSON (c->resp, which the build still reads) is never touched.
 *
 * Its own file because the phases are a protocol of their own, over their own routes and buffer, that sync.c
 * enters through one call, dprec_sync_secure_step (sync_priv.h). */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "identity.h"
#include "dprec/sync.h"
#include "json.h"
#include "secure.h"
#include "sync_priv.h"

/* ---- secure aggregation (sdk/secure.h; docs/protocol.md "Secure aggregation") --------------------------- */

/* The phase messages are binary and small (at most DPREC_SECURE_IO_MAX bytes): they go into the secure area's buffer,
 * so the job's JSON (c->resp, which the build still reads) stays intact. */
static int secure_sink(void *user, const unsigned char *chunk, size_t len) {
    dprec_secure_state *s = (dprec_secure_state *)user;
    if (len > DPREC_SECURE_IO_MAX - s->io_len) {
        s->io_overflow = 1;
        return DPREC_ERR_PROTOCOL;
    }
    memcpy(s->io + s->io_len, chunk, len);
    s->io_len += len;
    return 0;
}

/* A POST's answer is `{}` or an error: read into a small buffer of the call's and dropped. */
typedef struct small_sink {
    unsigned char b[256];
    size_t n;
} small_sink;

static int small_sink_put(void *user, const unsigned char *chunk, size_t len) {
    small_sink *k = (small_sink *)user;
    size_t room = sizeof k->b - k->n;
    if (len > room) len = room; /* the answer's body is not used: the status says it all */
    memcpy(k->b + k->n, chunk, len);
    k->n += len;
    return 0;
}

/* One phase exchange: POST body (the answer dropped; body may be s->io), or GET with the answer into s->io, or into
 * rd when it is not NULL (a list, checked as it streams: sdk/secure_check.c). *retry set (with the result filled)
 * for a transient failure or a phase the aggregator has already left (409). A GET's answer is the caller's to use
 * only when this returns DPREC_OK without *retry: a 200. */
static int secure_exchange(dprec_client *c, const dprec_transport *t, uint64_t job, const char *what,
                           const unsigned char *body, size_t body_len, dprec_secure_reader *rd,
                           dprec_sync_result *result, int *retry) {
    dprec_secure_state *s = dprec_secure_of(c);
    path_buf path;
    dprec_sync_path_job(&path, job, "/secagg/");
    dprec_sync_path_str(&path, what);
    dprec_http_request req = {body != NULL ? "POST" : "GET", path.s, c->token,
                              body != NULL ? "application/octet-stream" : NULL, body, body_len};
    dprec_http_response resp;
    memset(&resp, 0, sizeof resp);
    small_sink drop;
    drop.n = 0;
    s->io_overflow = 0;
    if (body == NULL && rd == NULL) s->io_len = 0;
    *retry = 0;
    int rc = body != NULL ? dprec_sync_request(c, t, &req, small_sink_put, &drop, &resp, 0)
           : rd != NULL   ? dprec_sync_request(c, t, &req, dprec_secure_reader_feed, rd, &resp, 0)
                          : dprec_sync_request(c, t, &req, secure_sink, s, &resp, 0);
    if (s->io_overflow) return DPREC_ERR_PROTOCOL;
    if (rd != NULL && rd->stopped) return rd->status; /* an answer past its largest size: whatever its status */
    if (rc != DPREC_OK) {
        *retry = 1;
        return dprec_sync_transport_failure(c, result, rc);
    }
    if (dprec_sync_transient_status(resp.status) || resp.status == 409) {
        *retry = 1;
        return dprec_sync_retry_later(c, result, resp.status == 409 ? DPREC_ERR_PROTOCOL : DPREC_ERR_NETWORK, resp.retry_after);
    }
    if (resp.status == 401) {
        *retry = 1;
        return dprec_sync_token_refused(c, result);
    }
    return resp.status == 200 ? DPREC_OK : DPREC_ERR_PROTOCOL;
}

/* Sends the step message in s->io[0 .. io_len) (code: 1 keys, 2 shares, 3 reveals, 4 the survivor set's signature);
 * kept for a re-send until answered. */
static int secure_post(dprec_client *c, const dprec_transport *t, uint64_t job, int code, dprec_sync_result *result,
                       int *retry, int *in_progress) {
    static const char *const what[5] = {"", "keys", "shares", "reveals", "consistency"};
    dprec_secure_state *s = dprec_secure_of(c);
    s->unsent = code;
    int rc = secure_exchange(c, t, job, what[code], s->io, s->io_len, NULL, result, retry);
    if (rc == DPREC_OK && !*retry) {
        s->unsent = 0;
        dprec_wipe(s->io, sizeof s->io);
        s->io_len = 0;
        *in_progress = 1;
    } else if (rc != DPREC_OK) {
        s->unsent = 0; /* refused for good: the device leaves this step */
    }
    return rc;
}

static void put_envelope(unsigned char *p, const dprec_secagg_envelope *e) {
    dprec_st32(p, e->from);
    dprec_st32(p + 4, e->to);
    memcpy(p + 8, e->iv, DPREC_GCM_IV_SIZE);
    memcpy(p + 8 + DPREC_GCM_IV_SIZE, e->sealed, DPREC_SECAGG_SEALED_BYTES);
    memcpy(p + 8 + DPREC_GCM_IV_SIZE + DPREC_SECAGG_SEALED_BYTES, e->tag, DPREC_GCM_TAG_SIZE);
}

static void get_envelope(const unsigned char *p, dprec_secagg_envelope *e) {
    e->from = dprec_ld32(p);
    e->to = dprec_ld32(p + 4);
    memcpy(e->iv, p + 8, DPREC_GCM_IV_SIZE);
    memcpy(e->sealed, p + 8 + DPREC_GCM_IV_SIZE, DPREC_SECAGG_SEALED_BYTES);
    memcpy(e->tag, p + 8 + DPREC_GCM_IV_SIZE + DPREC_SECAGG_SEALED_BYTES, DPREC_GCM_TAG_SIZE);
}

/* An answer's head: [round u64][count u32]; the count bounded by cap and the answer's length by count * item. */
static int secure_head(const dprec_secure_state *s, uint64_t round, size_t extra, size_t item, uint32_t cap,
                       uint32_t *count) {
    if (s->io_len < 12u + extra || dprec_ld64(s->io) != round) return DPREC_ERR_PROTOCOL;
    uint32_t n = dprec_ld32(s->io + 8 + extra);
    if (n > cap || s->io_len != 12u + extra + (size_t)n * item) return DPREC_ERR_PROTOCOL;
    *count = n;
    return DPREC_OK;
}

/* The device leaves the round (a check failed): nothing of its secrets remains, nothing more is sent in it. */
static int leave_round(dprec_client *c, int rc, const char *why) {
    dprec_secure_state *s = dprec_secure_of(c);
    dprec_client_log(c, DPREC_LOG_WARN, "sync: secure aggregation: the device leaves the round: ", why);
    dprec_secagg_wipe(&s->dev);
    s->dev.state = DPREC_SECAGG_ABORTED;
    s->unsent = 0;
    dprec_wipe(s->io, sizeof s->io);
    s->io_len = 0;
    return rc;
}

void dprec_sync_secure_abandon(dprec_client *c, uint64_t job, uint64_t round, int rc) {
    dprec_secure_state *s = dprec_secure_of(c);
    if (s->job == job && s->round == round && s->dev.state != DPREC_SECAGG_ABORTED)
        (void)leave_round(c, rc, dprec_status_name(rc));
}

/* GETs a list answer through the checking reader (sdk/secure_check.c). DPREC_OK with *retry clear: a 200 whose
 * every record passed; a 200 that failed a check: the device leaves the round and the refusal is returned. */
static int secure_read(dprec_client *c, const dprec_transport *t, const dprec_sync_job *job, const char *what, int kind,
                       const dprec_job_policy *pol, dprec_sync_result *result, int *retry) {
    dprec_secure_state *s = dprec_secure_of(c);
    const dprec_secure_job *sj = &pol->secure_job;
    int rc = dprec_identity_ensure(c); /* its own identity, to refuse a neighbour that claims it */
    if (rc != DPREC_OK) return rc;
    const dprec_sync_config *cfg = c->sync_cfg;
    dprec_secure_check ck = {job->job_id, job->round, (uint32_t)c->device_id, c->identity_pk, cfg->enrollment_key,
                             cfg->enrollment_key_len, sj->threshold > sj->plan.n_min ? sj->threshold : sj->plan.n_min,
                             sj->plan.n_max, sj->k, NULL, NULL, NULL};
    if (cfg->verified_seen != NULL && cfg->verified_remember != NULL) {
        ck.seen = cfg->verified_seen;
        ck.remember = cfg->verified_remember;
        ck.memo = cfg->verified_ctx;
    }
    dprec_secure_reader_start(&s->rd, s, kind, &ck);
    rc = secure_exchange(c, t, job->job_id, what, NULL, 0, &s->rd, result, retry);
    int checked = dprec_secure_reader_finish(&s->rd);
    if (s->rd.stopped || (rc == DPREC_OK && !*retry && checked != DPREC_OK)) {
        *retry = 0;
        return leave_round(c, checked, s->rd.why);
    }
    return rc;
}

/* The device's step of the open round's secure aggregation, by the phase the job shows (secagg.phase, for
 * secagg.round = the open round). One step per call; *report_now set when the phase is the masked input's and the
 * inbox arrived: the caller then fits, charges and stores the report as for any protocol (the build masks it).
 * Otherwise *in_progress is set when the device did (or had done) its part of the phase. Each step is taken once:
 * the secrets of a round are drawn once (a round shown again from its start finds the device past it and gets
 * nothing new), and common/secagg.c refuses any step out of order. A check that fails makes the device leave the
 * round (logged), revealing nothing more, and the call returns the refusal. */
int dprec_sync_secure_step(dprec_client *c, const dprec_transport *t, const dprec_sync_job *job,
                           const dprec_job_policy *pol, dprec_sync_result *result, int *retry, int *report_now,
                           int *in_progress) {
    dprec_secure_state *s = dprec_secure_of(c);
    *retry = *report_now = *in_progress = 0;
    uint64_t sround = 0;
    char phase[16];
    if (dprec_json_get_u64(job->doc, 0, "secagg.round", &sround) != DPREC_OK ||
        dprec_json_get_string(job->doc, 0, "secagg.phase", phase, sizeof phase, NULL) != DPREC_OK)
        return DPREC_ERR_PROTOCOL;
    if (sround != job->round) return DPREC_ERR_PROTOCOL; /* a phase of another round than the open one */
    if (c->device_id == 0 || c->device_id > UINT32_MAX) return DPREC_ERR_PROTOCOL;
    const dprec_secure_job *sj = &pol->secure_job;
    int mine = s->job == job->job_id && s->round == job->round;
    dprec_secagg_state st = mine ? s->dev.state : DPREC_SECAGG_FRESH;
    int rc;
    if (mine && st == DPREC_SECAGG_ABORTED) return DPREC_OK; /* the device left this round: nothing more */
    if (mine && s->unsent != 0) { /* a message whose answer was lost: the same bytes again while its phase lasts */
        static const char *const of[5] = {"", "advertise", "share", "unmask", "consistency"};
        if (strcmp(phase, of[s->unsent]) == 0) return secure_post(c, t, job->job_id, s->unsent, result, retry, in_progress);
        s->unsent = 0; /* its phase closed without it: the device dropped out of that step */
        dprec_wipe(s->io, sizeof s->io);
    }
    if (strcmp(phase, "advertise") == 0) {
        if (mine) {
            *in_progress = 1;
            return DPREC_OK;
        }
        rc = dprec_identity_ensure(c); /* the keys are signed with the identity the device enrolled */
        if (rc != DPREC_OK) return rc;
        dprec_secagg_wipe(&s->dev);
        dprec_secagg_params p = {job->round, (uint32_t)c->device_id, sj->threshold, sj->plan.n_min, sj->plan.bits,
                                 sj->plan.dim};
        dprec_secagg_pub pub;
        rc = dprec_secagg_advertise(&s->dev, &p, &c->rng, &pub);
        if (rc != DPREC_OK) return rc;
        s->job = job->job_id;
        s->round = job->round;
        unsigned char stmt[DPREC_SECAGG_KEYS_STATEMENT];
        dprec_secagg_keys_statement(job->job_id, job->round, &pub, stmt);
        dprec_st64(s->io, job->round);
        dprec_st32(s->io + 8, pub.id);
        memcpy(s->io + 12, pub.c_pk, DPREC_SECAGG_KEY_SIZE);
        memcpy(s->io + 12 + DPREC_SECAGG_KEY_SIZE, pub.s_pk, DPREC_SECAGG_KEY_SIZE);
        rc = dprec_identity_sign_statement(c, DPREC_SECAGG_KEYS_LABEL, stmt, sizeof stmt,
                                           s->io + 12 + 2 * DPREC_SECAGG_KEY_SIZE);
        if (rc != DPREC_OK) return leave_round(c, rc, "its keys could not be signed");
        s->io_len = DPREC_SECURE_KEYS_WIRE;
        return secure_post(c, t, job->job_id, 1, result, retry, in_progress);
    }
    if (strcmp(phase, "share") == 0) {
        if (st != DPREC_SECAGG_ADVERTISED) { /* done already, or not in this round (it advertised nothing) */
            *in_progress = st == DPREC_SECAGG_SHARED;
            return DPREC_OK;
        }
        /* every neighbour's record checked as it streams in: a valid signature of its keys by a distinct identity that
         * is not the device's, and with the app's enrollment key a token of the app's for it (sdk/secure_check.c) */
        rc = secure_read(c, t, job, "neighbours", DPREC_SECURE_READ_NEIGHBOURS, pol, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t k = s->rd.count;
        /* Without the app's enrollment key the device cannot tell an enrolled neighbour from one of the server's own
         * identities: against an active server the tolerance below then holds nothing (docs/privacy.md "Sybils and
         * enrollment"). Said in the log each round, not refused: against a server that follows the protocol the
         * guarantee stands, and that is the caveat the ledger prints. */
        if (c->sync_cfg->enrollment_key == NULL || c->sync_cfg->enrollment_key_len == 0)
            dprec_client_log(c, DPREC_LOG_WARN, "sync: secure aggregation: ",
                             "no enrollment key configured: against an active server every neighbour may be its own "
                             "and no colluder is tolerated");
        /* the tolerance the device asks for, with the neighbours it was actually given: 2t - k - 1 colluders */
        if (2u * sj->threshold < k + 1u + c->cfg.secagg_min_colluders)
            return leave_round(c, DPREC_ERR_JOB_PARAMS, "a neighbour list that tolerates fewer colluders than asked");
        /* k within [t, 2t) and every key valid, or the device leaves the round (common/secagg.c) */
        rc = dprec_secagg_share(&s->dev, &c->rng, s->nb, k, s->inbox);
        if (rc != DPREC_OK)
            return leave_round(c, rc == DPREC_ERR_INVALID_ARGUMENT ? DPREC_ERR_PROTOCOL : rc, "its neighbours refused");
        dprec_st64(s->io, job->round);
        dprec_st32(s->io + 8, k);
        for (uint32_t j = 0; j < k; j++) put_envelope(s->io + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &s->inbox[j]);
        s->io_len = 12u + (size_t)k * DPREC_SECURE_ENVELOPE_WIRE;
        return secure_post(c, t, job->job_id, 2, result, retry, in_progress);
    }
    if (strcmp(phase, "mask") == 0) {
        if (st != DPREC_SECAGG_SHARED) {
            *in_progress = st == DPREC_SECAGG_MASKED;
            return DPREC_OK;
        }
        rc = secure_exchange(c, t, job->job_id, "inbox", NULL, 0, NULL, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t n = 0;
        rc = secure_head(s, job->round, 0, DPREC_SECURE_ENVELOPE_WIRE, DPREC_SECAGG_MAX_NEIGHBOURS, &n);
        if (rc != DPREC_OK) return rc;
        for (uint32_t j = 0; j < n; j++) get_envelope(s->io + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &s->inbox[j]);
        s->n_inbox = n;
        *report_now = 1;
        return DPREC_OK;
    }
    if (strcmp(phase, "consistency") == 0) {
        if (st != DPREC_SECAGG_MASKED) {
            *in_progress = st == DPREC_SECAGG_ATTESTED;
            return DPREC_OK;
        }
        /* the survivor set, streamed through SHA-256: strictly increasing, holding the device, max(t, n_min) to n_max
         * ids; then recorded once (common/secagg.c) and signed: one signature a round, of a set that holds it */
        rc = secure_read(c, t, job, "survivors", DPREC_SECURE_READ_SURVIVORS, pol, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        rc = dprec_secagg_consistency(&s->dev, s->rd.count, s->rd.holds_self, s->rd.in_u3, s->rd.hash);
        if (rc != DPREC_OK) return leave_round(c, rc, "a survivor set without it, or with a neighbour that never shared");
        unsigned char stmt[DPREC_SECAGG_SURVIVORS_STATEMENT];
        dprec_secagg_survivors_statement(job->job_id, job->round, s->rd.hash, (uint32_t)c->device_id, stmt);
        dprec_st64(s->io, job->round);
        dprec_st32(s->io + 8, (uint32_t)c->device_id);
        rc = dprec_identity_sign_statement(c, DPREC_SECAGG_SURVIVORS_LABEL, stmt, sizeof stmt, s->io + 12);
        if (rc != DPREC_OK) return leave_round(c, rc, "the survivor set could not be signed");
        s->io_len = DPREC_SECURE_CONSISTENCY_WIRE;
        return secure_post(c, t, job->job_id, 4, result, retry, in_progress);
    }
    if (strcmp(phase, "unmask") == 0) {
        if (st != DPREC_SECAGG_ATTESTED) {
            *in_progress = st == DPREC_SECAGG_DONE;
            return DPREC_OK;
        }
        /* the requests, with max(t, n_min) attestations of the set it signed (t of them its neighbours'), each checked as
         * it streams in */
        rc = secure_read(c, t, job, "requests", DPREC_SECURE_READ_REQUESTS, pol, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t n = s->rd.n_req;
        dprec_secagg_reveal *rv = s->rv;
        /* another set, too few attesters or too few of them its neighbours, a request that disagrees with the set or
         * asks twice, a self-mask share of a neighbour that did not sign that it masked with this device: refused, and
         * the device reveals nothing (common/secagg.c) */
        int unnamed = 0;
        for (uint32_t q = 0; q < n; q++) unnamed |= s->req[q].kind == DPREC_SECAGG_SELF_MASK && !s->rd.named[q];
        rc = dprec_secagg_unmask(&s->dev, s->rd.survivors, s->rd.hash, s->rd.attested, s->rd.nb_attested, s->req,
                                 s->rd.named, n, rv);
        if (rc != DPREC_OK)
            return leave_round(c, rc,
                               s->rd.nb_attested < sj->threshold ? "fewer than t of its neighbours attested its survivor set"
                               : unnamed ? "a self-mask share asked of a neighbour that did not mask with it"
                                         : "requests that disagree with the survivor set it signed");
        const size_t item = 16u + 4u * DPREC_SECAGG_CHUNKS;
        dprec_st64(s->io, job->round);
        dprec_st32(s->io + 8, n);
        for (uint32_t j = 0; j < n; j++) {
            unsigned char *q = s->io + 12 + (size_t)j * item;
            dprec_st32(q, rv[j].owner);
            dprec_st32(q + 4, rv[j].holder);
            dprec_st32(q + 8, (uint32_t)rv[j].kind);
            dprec_st32(q + 12, rv[j].share.x);
            for (uint32_t k = 0; k < DPREC_SECAGG_CHUNKS; k++) dprec_st32(q + 16 + 4 * k, rv[j].share.y[k]);
        }
        dprec_wipe(s->rv, sizeof s->rv);
        dprec_secagg_wipe(&s->dev); /* the round's secrets are spent: only the reveals (in s->io) remain to send */
        s->dev.state = DPREC_SECAGG_DONE;
        s->io_len = 12u + (size_t)n * item;
        return secure_post(c, t, job->job_id, 3, result, retry, in_progress);
    }
    /* any other phase (closed, aborted): the round's secrets are no longer needed */
    if (mine) {
        dprec_secagg_wipe(&s->dev);
        s->dev.state = DPREC_SECAGG_ABORTED;
    }
    return DPREC_OK;
}
