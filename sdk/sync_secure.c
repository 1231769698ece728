/* dprec — the device's steps of a secure-aggregation round over the secagg routes (sdk/secure.h; docs/protocol.md
 * "Secure aggregation").
 *
 * One step per sync call, chosen by the phase the job shows for its open round: advertise (the round's public
 * keys), share (the encrypted key shares for the neighbours the aggregator lists), mask (the inbox of shares
 * addressed to the device: the masked input itself is then the round's report, fitted, charged and sent by
 * sync.c like any other, the protocol's build masking it) and unmask (the reveals the aggregator asks for).
 * A step's message stays in the secure area until its answer arrives and is re-sent byte for byte, while its
 * phase lasts, if the answer was lost. The round's secrets are drawn once and wiped once spent, and
 * common/secagg.c refuses any step out of order. Nothing here reads the user's ratings.
 *
 * Memory: the phase messages (at most DPREC_SECURE_IO_MAX bytes) and the round's secrets live in the client's
 * secure area (sdk/secure.c); a POST's answer goes into a 256-byte buffer on the stack and is dropped. The job's
 * JSON (c->resp, which the build still reads) is never touched.
 *
 * Its own file because the phases are a protocol of their own, over their own routes and buffer, that sync.c
 * enters through one call, dprec_sync_secure_step (sync_priv.h). */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
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

/* One phase exchange: POST body (the answer dropped; body may be s->io) or GET (the answer into s->io). *retry set
 * (with the result filled) for a transient failure or a phase the aggregator has already left (409). */
static int secure_exchange(dprec_client *c, const dprec_transport *t, uint64_t job, const char *what,
                           const unsigned char *body, size_t body_len, dprec_sync_result *result, int *retry) {
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
    if (body == NULL) s->io_len = 0;
    *retry = 0;
    int rc = body != NULL ? t->request(t->ctx, &req, small_sink_put, &drop, &resp)
                          : t->request(t->ctx, &req, secure_sink, s, &resp);
    if (s->io_overflow) return DPREC_ERR_PROTOCOL;
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

/* Sends the step message in s->io[0 .. io_len) (code: 1 keys, 2 shares, 3 reveals); kept for a re-send until answered. */
static int secure_post(dprec_client *c, const dprec_transport *t, uint64_t job, int code, dprec_sync_result *result,
                       int *retry, int *in_progress) {
    static const char *const what[4] = {"", "keys", "shares", "reveals"};
    dprec_secure_state *s = dprec_secure_of(c);
    s->unsent = code;
    int rc = secure_exchange(c, t, job, what[code], s->io, s->io_len, result, retry);
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

/* The device's step of the open round's secure aggregation, by the phase the job shows (secagg.phase, for
 * secagg.round = the open round). One step per call; *report_now set when the phase is the masked input's and the
 * inbox arrived: the caller then fits, charges and stores the report as for any protocol (the build masks it).
 * Otherwise *in_progress is set when the device did (or had done) its part of the phase. Each step is taken once:
 * the secrets of a round are drawn once (a round shown again from its start finds the device past it and gets
 * nothing new), and common/secagg.c refuses any step out of order. */
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
        static const char *const of[4] = {"", "advertise", "share", "unmask"};
        if (strcmp(phase, of[s->unsent]) == 0) return secure_post(c, t, job->job_id, s->unsent, result, retry, in_progress);
        s->unsent = 0; /* its phase closed without it: the device dropped out of that step */
        dprec_wipe(s->io, sizeof s->io);
    }
    if (strcmp(phase, "advertise") == 0) {
        if (mine) {
            *in_progress = 1;
            return DPREC_OK;
        }
        dprec_secagg_wipe(&s->dev);
        dprec_secagg_params p = {job->round, (uint32_t)c->device_id, sj->threshold, sj->plan.n_min, sj->plan.bits,
                                 sj->plan.dim};
        dprec_secagg_pub pub;
        rc = dprec_secagg_advertise(&s->dev, &p, &c->rng, &pub);
        if (rc != DPREC_OK) return rc;
        s->job = job->job_id;
        s->round = job->round;
        dprec_st64(s->io, job->round);
        dprec_st32(s->io + 8, pub.id);
        memcpy(s->io + 12, pub.c_pk, DPREC_SECAGG_KEY_SIZE);
        memcpy(s->io + 12 + DPREC_SECAGG_KEY_SIZE, pub.s_pk, DPREC_SECAGG_KEY_SIZE);
        s->io_len = 12u + 2u * DPREC_SECAGG_KEY_SIZE;
        return secure_post(c, t, job->job_id, 1, result, retry, in_progress);
    }
    if (strcmp(phase, "share") == 0) {
        if (st != DPREC_SECAGG_ADVERTISED) { /* done already, or not in this round (it advertised nothing) */
            *in_progress = st == DPREC_SECAGG_SHARED;
            return DPREC_OK;
        }
        rc = secure_exchange(c, t, job->job_id, "neighbours", NULL, 0, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t k = 0;
        const size_t item = 4u + 2u * DPREC_SECAGG_KEY_SIZE;
        rc = secure_head(s, job->round, 0, item, DPREC_SECAGG_MAX_NEIGHBOURS, &k);
        if (rc != DPREC_OK) return rc;
        dprec_secagg_pub *nb = s->nb;
        for (uint32_t j = 0; j < k; j++) {
            const unsigned char *q = s->io + 12 + (size_t)j * item;
            nb[j].id = dprec_ld32(q);
            memcpy(nb[j].c_pk, q + 4, DPREC_SECAGG_KEY_SIZE);
            memcpy(nb[j].s_pk, q + 4 + DPREC_SECAGG_KEY_SIZE, DPREC_SECAGG_KEY_SIZE);
        }
        /* k within [t, 2t) and every key valid, or the device leaves the round (common/secagg.c) */
        rc = dprec_secagg_share(&s->dev, &c->rng, nb, k, s->inbox);
        if (rc != DPREC_OK) return rc == DPREC_ERR_INVALID_ARGUMENT ? DPREC_ERR_PROTOCOL : rc;
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
        rc = secure_exchange(c, t, job->job_id, "inbox", NULL, 0, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t n = 0;
        rc = secure_head(s, job->round, 0, DPREC_SECURE_ENVELOPE_WIRE, DPREC_SECAGG_MAX_NEIGHBOURS, &n);
        if (rc != DPREC_OK) return rc;
        for (uint32_t j = 0; j < n; j++) get_envelope(s->io + 12 + (size_t)j * DPREC_SECURE_ENVELOPE_WIRE, &s->inbox[j]);
        s->n_inbox = n;
        *report_now = 1;
        return DPREC_OK;
    }
    if (strcmp(phase, "unmask") == 0) {
        if (st != DPREC_SECAGG_MASKED) {
            *in_progress = st == DPREC_SECAGG_DONE;
            return DPREC_OK;
        }
        rc = secure_exchange(c, t, job->job_id, "requests", NULL, 0, result, retry);
        if (rc != DPREC_OK || *retry) return rc;
        uint32_t n = 0;
        rc = secure_head(s, job->round, 4, 8, DPREC_SECAGG_MAX_NEIGHBOURS, &n);
        if (rc != DPREC_OK) return rc;
        uint32_t survivors = dprec_ld32(s->io + 8);
        dprec_secagg_request *req = s->req;
        for (uint32_t j = 0; j < n; j++) {
            const unsigned char *q = s->io + 16 + 8u * (size_t)j;
            uint32_t kind = dprec_ld32(q + 4);
            if (kind != DPREC_SECAGG_SELF_MASK && kind != DPREC_SECAGG_PAIR_KEY) return DPREC_ERR_PROTOCOL;
            req[j].owner = dprec_ld32(q);
            req[j].kind = (dprec_secagg_kind)kind;
        }
        dprec_secagg_reveal *rv = s->rv;
        /* too few survivors, a neighbour asked for twice: refused, and the device reveals nothing (common/secagg.c) */
        rc = dprec_secagg_unmask(&s->dev, survivors, req, n, rv);
        if (rc != DPREC_OK) {
            dprec_client_log(c, DPREC_LOG_WARN, "sync: secure aggregation: unmask refused: ", dprec_status_name(rc));
            return rc;
        }
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
