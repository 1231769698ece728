/* dprec-fleet: `dpmf` (seed 004, Hua, Xia, Zhong, IJCAI 2015; docs/privacy.md "dpmf"). --dpmf-mode trusted: the
 * aggregator minimizes the perturbed objective (central DP). relay and dynamic: the fleet starts a relay beside the
 * aggregator (in-process with --in-process, else `dprec-relay serve` over HTTPS, as the aggregator), the devices
 * register with it and send it their masked shares, and at the end of each round the fleet, as the recommender's
 * operator, closes the relay's round and posts its signed sum to the aggregator as the round's report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bytes.h"
#include "dpmf.h"
#include "fleet_proto.h"
#include "report.h"

static struct {
    int mode; /* 0: trusted (default) */
    unsigned max_items, noise_shares;
    double u_clip, huber, item_lambda, lr, init_scale;
    /* the job's relay (relay modes) */
    fleet_conn *relay;
    dprec_transport *t;
    unsigned nt;
    char relay_key_hex[2 * 512 + 1];
    uint32_t users, items;
} dm;

static int dpmf_arg(fleet_common *o, const char *flag, const char *value, int *takes_value) {
    (void)o;
    *takes_value = 1;
    if (strcmp(flag, "--dpmf-mode") == 0) {
        if (value == NULL || (dm.mode = dprec_dpmf_mode_of(value)) == 0)
            return fleet_flag_error("--dpmf-mode must be trusted, relay or dynamic:", value), -1;
        return 1;
    }
    if (strcmp(flag, "--max-items") == 0 || strcmp(flag, "--noise-shares") == 0) {
        unsigned *dst = flag[2] == 'm' ? &dm.max_items : &dm.noise_shares;
        if (value == NULL || fleet_parse_uint(value, 1, flag[2] == 'm' ? 65535 : (1u << 20), dst))
            return fleet_flag_error("bad value for", flag), -1;
        return 1;
    }
    double *dst = NULL;
    if (strcmp(flag, "--u-clip") == 0) dst = &dm.u_clip;
    else if (strcmp(flag, "--huber") == 0) dst = &dm.huber;
    else if (strcmp(flag, "--item-lambda") == 0) dst = &dm.item_lambda;
    else if (strcmp(flag, "--lr") == 0) dst = &dm.lr;
    else if (strcmp(flag, "--init-scale") == 0) dst = &dm.init_scale;
    else return 0;
    if (value == NULL || fleet_parse_double(value, dst) || !(*dst > 0)) return fleet_flag_error("bad value for", flag), -1;
    return 1;
}

static int dpmf_finish(fleet_common *o) {
    if (dm.mode == 0) dm.mode = DPREC_DPMF_TRUSTED;
    if (o->lambda < 0) o->lambda = 10.0; /* the devices' ridge (--device-lambda-per-rating overrides it) */
    /* 2 rounds for the trusted mode (each an exact minimization; every round splits the budget further), 3 for the
     * relay modes (gradient steps): docs/results.md, "dpmf" */
    if (!o->rounds_set) o->rounds = dm.mode == DPREC_DPMF_TRUSTED ? 2 : 3;
    if (!o->rank_set) o->rank = 3; /* the Laplace noise grows with sqrt(d): a small rank (2 factors and the bias) */
    if (dm.max_items == 0) dm.max_items = DPREC_DPMF_DEFAULT_MAX_ITEMS;
    if (dm.u_clip == 0) dm.u_clip = DPREC_DPMF_DEFAULT_U_CLIP;
    if (dm.huber == 0) dm.huber = DPREC_DPMF_DEFAULT_HUBER;
    if (dm.lr == 0) dm.lr = 1.0;
    if (dm.init_scale == 0) dm.init_scale = 0.1;
    if (o->rank < 1 || o->rank > DPREC_DPMF_MAX_D) return fleet_flag_error("dpmf needs --rank in 1..64 (column 0 is the user bias)", NULL);
    return 0;
}

static void dpmf_spec(const fleet_common *o, const fleet_data *d, char *out, size_t cap) {
    char extra[2 * 512 + 256] = "";
    size_t n = 0;
    dm.users = d->num_users;
    dm.items = d->num_items;
    if (dm.item_lambda > 0) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"lambda\":%.17g", dm.item_lambda);
    if (dm.mode == DPREC_DPMF_RELAY) n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"cohort\":%u", d->num_users);
    if (dm.mode == DPREC_DPMF_DYNAMIC) {
        unsigned k = dm.noise_shares > 0 ? dm.noise_shares : (d->num_users + 1) / 2;
        n += (size_t)snprintf(extra + n, sizeof extra - n, ",\"noise_shares\":%u", k);
    }
    if (dm.mode != DPREC_DPMF_TRUSTED)
        snprintf(extra + n, sizeof extra - n, ",\"lr\":%.17g,\"relay_key\":\"%s\"", dm.lr, dm.relay_key_hex);
    snprintf(out, cap,
             "{\"protocol\":\"dpmf\",\"d\":%u,\"m\":%u,\"rating_min\":%g,\"rating_max\":%g,\"rounds\":%u,"
             "\"min_reports\":%u,\"round_seconds\":3600,\"participation\":1,"
             "\"params\":{\"mode\":\"%s\",\"max_items\":%u,\"u_clip\":%.17g,\"huber\":%.17g,\"init_scale\":%.17g,"
             "\"seed\":%llu%s},\"budget\":{\"epsilon\":%.17g,\"delta\":0}}",
             o->rank, d->num_items, (double)d->rating_min, (double)d->rating_max, o->rounds,
             dm.mode == DPREC_DPMF_TRUSTED ? d->num_users : 1u, dprec_dpmf_mode_name(dm.mode), dm.max_items, dm.u_clip,
             dm.huber, dm.init_scale, (unsigned long long)o->seed, extra, o->epsilon);
}

/* every report has one size: trusted, the envelope and k pairs; relay modes, the head and the masked share */
static void dpmf_device(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg) {
    (void)ntrain;
    size_t n = dm.mode == DPREC_DPMF_TRUSTED ? DPREC_ENVELOPE_HEADER + dprec_dpmf_trusted_size(o->rank, dm.max_items)
                                             : 2u * DPREC_ENVELOPE_HEADER + DPREC_DPMF_HEAD_SIZE +
                                                   dprec_dpmf_share_size(dm.mode, d->num_items, o->rank + 1u);
    cfg->max_report_bytes = (uint32_t)n;
}

static void dpmf_describe(const fleet_common *o, const fleet_data *d) {
    (void)o;
    (void)d;
    if (dm.mode == DPREC_DPMF_TRUSTED)
        printf("dpmf (seed 004), trusted recommender: each device reports x = [w; 1] (w clipped to %g) and up to %u "
               "targets a round; the aggregator minimizes the pseudo-Huber objective (c = %g) perturbed by eta_j . theta\n",
               dm.u_clip, dm.max_items, dm.huber);
    else
        printf("dpmf (seed 004), untrusted recommender, %s users: each device masks its gradient and count over every "
               "item (up to %u rated, w clipped to %g, pseudo-Huber c = %g) with its noise share; the relay (%s) sums "
               "them; the fleet posts the relay's signed sum to the aggregator each round\n",
               dm.mode == DPREC_DPMF_RELAY ? "static" : "dynamic", dm.max_items, dm.u_clip, dm.huber,
               dm.relay != NULL ? fleet_conn_describe(dm.relay) : "?");
}

static void dpmf_job_end(void) {
    for (unsigned i = 0; dm.t != NULL && i < dm.nt; i++)
        if (dm.t[i].request != NULL) fleet_conn_transport_free(dm.relay, &dm.t[i]);
    free(dm.t);
    dm.t = NULL;
    dm.nt = 0;
    fleet_conn_close(dm.relay);
    dm.relay = NULL;
}

static int dpmf_job_begin(const fleet_common *o, const fleet_conn_options *agg, unsigned workers, char *err,
                          size_t errcap) {
    (void)o;
    if (dm.mode == DPREC_DPMF_TRUSTED) return 0;
    if (agg->url != NULL) {
        snprintf(err, errcap, "the relay modes need a relay: with --aggregator URL the fleet does not start one (use "
                              "the default or --in-process)");
        return -1;
    }
    fleet_conn_options ro = *agg;
    ro.relay = 1;
    if (fleet_conn_open(&ro, &dm.relay, err, errcap) != 0) return -1;
    size_t len = 0;
    const unsigned char *key = fleet_conn_release_key(dm.relay, &len);
    for (size_t i = 0; i < len && i < 512; i++) snprintf(dm.relay_key_hex + 2 * i, 3, "%02x", key[i]);
    dm.t = calloc(workers, sizeof *dm.t);
    if (dm.t == NULL) {
        snprintf(err, errcap, "out of memory");
        dpmf_job_end();
        return -1;
    }
    dm.nt = workers;
    for (unsigned i = 0; i < workers; i++)
        if (fleet_conn_transport(dm.relay, &dm.t[i], err, errcap) != 0) {
            dpmf_job_end();
            return -1;
        }
    return 0;
}

static int dpmf_job_created(const fleet_common *o, uint64_t job, char *err, size_t errcap) {
    if (dm.mode == DPREC_DPMF_TRUSTED) return 0;
    char body[512];
    unsigned k = dm.mode == DPREC_DPMF_RELAY ? dm.users : (dm.noise_shares > 0 ? dm.noise_shares : (dm.users + 1) / 2);
    snprintf(body, sizeof body, "{\"job\":%llu,\"mode\":\"%s\",\"m\":%u,\"d\":%u,\"shares\":%u,\"max_shares\":%u,\"rounds\":%u}",
             (unsigned long long)job, dprec_dpmf_mode_name(dm.mode), dm.items, o->rank, k, dm.users, o->rounds);
    unsigned char *resp = NULL;
    size_t len = 0;
    int st = fleet_conn_call(dm.relay, 1, "POST", "/v1/admin/jobs", NULL, "application/json", body, strlen(body), &resp, &len);
    if (st != 201) snprintf(err, errcap, "creating the job on the relay: %d %.300s", st, resp ? (const char *)resp : "");
    free(resp);
    return st == 201 ? 0 : -1;
}

static const dprec_transport *dpmf_worker_relay(unsigned w) {
    return dm.t != NULL && w < dm.nt ? &dm.t[w] : NULL;
}

static int dpmf_round_end(const fleet_common *o, fleet_conn *agg, const char *token, uint64_t job, unsigned round,
                          char *err, size_t errcap) {
    (void)o;
    if (dm.mode == DPREC_DPMF_TRUSTED) return 0;
    char path[128];
    snprintf(path, sizeof path, "/v1/admin/jobs/%llu/rounds/%u/close", (unsigned long long)job, round);
    unsigned char *sum = NULL;
    size_t sum_len = 0;
    int st = fleet_conn_call(dm.relay, 1, "POST", path, NULL, "application/json", "{}", 2, &sum, &sum_len);
    if (st != 200) {
        snprintf(err, errcap, "the relay did not close round %u: %d %.300s", round, st, sum ? (const char *)sum : "");
        free(sum);
        return -1;
    }
    unsigned char *env = malloc(DPREC_ENVELOPE_HEADER + sum_len);
    if (env == NULL) {
        free(sum);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    dprec_envelope e;
    memset(&e, 0, sizeof e);
    e.protocol = DPREC_PROTO_DPMF;
    e.job_id = job;
    e.round = round;
    e.release_version = round;
    if (getrandom(e.report_id, sizeof e.report_id, 0) != (ssize_t)sizeof e.report_id) memset(e.report_id, (int)(round & 0xffu), 16);
    e.payload_len = (uint32_t)sum_len;
    dprec_envelope_write_header(env, &e);
    memcpy(env + DPREC_ENVELOPE_HEADER, sum, sum_len);
    free(sum);
    snprintf(path, sizeof path, "/v1/jobs/%llu/reports", (unsigned long long)job);
    unsigned char *resp = NULL;
    size_t rlen = 0;
    st = fleet_conn_call(agg, 0, "POST", path, token, "application/octet-stream", env, DPREC_ENVELOPE_HEADER + sum_len,
                         &resp, &rlen);
    free(env);
    if (st != 200) {
        snprintf(err, errcap, "the aggregator refused the relay's sum of round %u: %d %.300s", round, st,
                 resp ? (const char *)resp : "");
        free(resp);
        return -1;
    }
    free(resp);
    return 0;
}

/* --audit-canaries (mode trusted: in the relay modes a round closes only with its whole cohort, which a canary left out
 * of the run would never complete): a canary rates its own item at the top of the scale with u = 0, so x = [0; 1] and
 * the loss's bounded derivative all on that item's bias; the adversary reads that bias in the last release. */
static int dpmf_audit_check(const fleet_common *o) {
    (void)o;
    if (dm.mode != DPREC_DPMF_TRUSTED)
        return fleet_flag_error("--audit-canaries: dpmf's audit is in mode trusted (a relay round needs its whole cohort)", NULL);
    return 0;
}

static const fleet_audit_hooks dpmf_audit = {
    0, 1, 0, dpmf_audit_check, fleet_audit_config_zero_u, fleet_audit_data_own_item_top, NULL, fleet_audit_score_own_bias,
    "a device with u = 0 rating its own item at the top of the scale (the Huber loss's whole derivative on that item's "
    "bias)",
    "the canary item's bias in the last signed release",
};

static const char *const dpmf_flags[] = {"--dpmf-mode", "--max-items", "--noise-shares", "--u-clip", "--huber",
                                         "--item-lambda", "--lr", "--init-scale", NULL};

const fleet_proto fleet_proto_dpmf = {
    "dpmf",
    "dpmf (seed 004, Hua, Xia, Zhong 2015: objective perturbation; user level, pure epsilon; docs/privacy.md):\n"
    "  --dpmf-mode MODE         trusted (default: the aggregator holds and minimizes the perturbed objective,\n"
    "                           central DP), relay (untrusted recommender, static users: masked shares through\n"
    "                           a relay the fleet starts, every device's noise share in every round) or dynamic\n"
    "                           (untrusted recommender, dynamic users: the first K shares make the noise)\n"
    "  --max-items K            the ratings a device uses each round, a uniform sample (default 20)\n"
    "  --noise-shares K         dynamic: the shares whose noise makes a round's total (default: half the fleet)\n"
    "  --u-clip G               norm bound of the reported user factor (default 1)\n"
    "  --huber C                threshold of the pseudo-Huber loss, in rating units (default 1)\n"
    "  --item-lambda L          trusted: the ridge of the item objectives (default: the one whose Jacobian term\n"
    "                           is half the round's epsilon, or 8 b if more); relay modes: the step's damping\n"
    "                           (default 20 b, b the noise scale)\n"
    "  --lr R                   relay modes: the step size (default 1)\n"
    "  --init-scale S           release 1's factors uniform in [-S, S] (default 0.1)\n"
    "  (defaults: --rank 3, --rounds 2 trusted and 3 in the relay modes; the budget is pure: delta 0)\n",
    dpmf_flags, dpmf_arg, dpmf_finish, dpmf_spec, dpmf_device, NULL, dpmf_describe, "bias",
    "objective perturbation (Hua et al. 2015)",
    NULL, /* no worst report: --malicious is refused (docs/privacy.md "Poisoning": no bound in the relay modes) */
    &dpmf_audit, NULL,
};

const fleet_job_hooks fleet_dpmf_hooks = {dpmf_job_begin, dpmf_job_created, dpmf_worker_relay, dpmf_round_end,
                                          dpmf_job_end};
