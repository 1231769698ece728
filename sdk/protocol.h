/* dprec internal — the device side of a training protocol, as one table of functions (like curl's TLS
 * backends). sync.c fetches the job, asks the job's protocol for its *policy* — what one round costs and what
 * the job may do, computed by the device itself from the job's public parameters — checks it against the
 * device's own ledger and caps, then fits the user vector on the round's release and asks the protocol to
 * build the report. Adding a protocol adds a sdk/protocols/<name>.c with one `const dprec_proto` and a line in
 * sdk/protocols/table.c; nothing else changes (the store and the client take the protocol's state section, if it
 * has one, from its descriptor). */
#ifndef DPREC_PROTOCOL_H
#define DPREC_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "accountant.h"
#include "ddg.h"
#include "dprec/dprec.h"
#include "dprec/privacy.h"
#include "json.h"

typedef struct dprec_client dprec_client;

#define DPREC_SYNC_PROTOCOL_NAME_MAX 24

/* What a relay says of a job's open round (GET /v1/jobs/{job}/rounds/{round} on the relay, docs/protocol.md): the
 * public randomness it drew for the round (the seed its devices expand, never shown to the aggregator) and the number
 * of shares whose noise makes the round's total. Fetched by sync_relay.c, over the app's relay transport, for a job
 * whose policy says its reports go through a relay. */
typedef struct dprec_relay_round {
    uint64_t round;
    int mode;                  /* the protocol's mode as the relay runs the job (dpmf: common/protocols/dpmf.h) */
    uint32_t shares;           /* K */
    unsigned char seed[32];
} dprec_relay_round;

/* A job as GET /v1/jobs/{job} describes it (docs/protocol.md). Every field comes from the aggregator: the
 * device believes none of those its guarantee depends on until its protocol's policy checked them. */
typedef struct dprec_sync_job {
    uint64_t job_id;
    char protocol[DPREC_SYNC_PROTOCOL_NAME_MAX];
    uint32_t d, m;
    double rating_min, rating_max;
    int done;                 /* state "done" */
    uint64_t round;           /* the open round */
    uint64_t release_version; /* the release the open round is computed on */
    uint64_t rounds;          /* the job's declared number of rounds (0 if absent: refused by every policy) */
    int64_t deadline;         /* unix seconds */
    double participation;     /* in [0, 1] */
    /* The job's published guarantee ("privacy": docs/protocol.md): its total epsilon and delta over all its
     * rounds at the job's unit, the user-level total (privacy.user_epsilon / user_delta; NaN when absent), and
     * for the local protocols the epsilon of one round (NaN otherwise). NaN when absent or "inf". A policy
     * only ever uses these to refuse a job whose published figures understate what the device computes. */
    double epsilon, delta, user_epsilon, user_delta, round_epsilon;
    const dprec_json_doc *doc; /* the whole job object (token 0), for protocol parameters ("params.*") */
    const dprec_relay_round *relay; /* the relay's view of the open round (policy relay = 1; NULL in the policy) */
} dprec_sync_job;

/* What a secure-aggregation job asks of the device, as its policy checked it (sdk/secure.h). */
typedef struct dprec_secure_job {
    uint32_t k, threshold;                   /* neighbours, Shamir threshold */
    dprec_ddg_plan plan;                     /* the published plan, checked (derived fields recomputed by the device) */
    unsigned char seed[DPREC_DDG_SEED_SIZE]; /* the rotation's public seed */
} dprec_secure_job;

/* What a job is allowed to cost, computed on the device (docs/privacy.md, "The device's policy"). */
typedef struct dprec_job_policy {
    dprec_unit unit;       /* what the job's guarantee protects */
    dprec_model model;
    /* The privacy mechanism of one round at the job's unit, and the same round at user level (for a user-level
     * job the same step): the ledger composes them over the rounds the device is charged for. steps = 1. */
    dprec_step round, user_round;
    double delta;          /* the delta at which RDP/zCDP rounds are converted (0 for pure-epsilon rounds) */
    uint64_t rounds;       /* the most rounds the device will ever be charged for in this job */
    /* 1 when the rounds are accounted with amplification by Poisson sampling (the device draws whether it takes
     * part): a round the device sits out is charged as well, since the accounting spreads the cost over every
     * draw. 0: a round costs only when a report is sent. */
    int charge_sit_outs;
    size_t report_bytes;   /* every report's exact size (envelope included); 0 for `plain`, whose size varies */
    /* 1: the report goes partly through the relay (dprec_sync_config.relay): build writes two envelopes back to
     * back, the head for the aggregator and the tail for the relay, and sync_relay.c fetches the relay's round
     * (job->relay) before the build. Not part of the fingerprint (report_bytes and the model differ anyway). */
    int relay;
    /* 1: params.aggregation "secure" (sdk/secure.h): sync_secure.c runs the round's secure-aggregation steps and the
     * report is the masked, encoded vector; secure_job is what the policy checked. */
    int secure;
    dprec_secure_job secure_job;
} dprec_job_policy;

/* A protocol's durable state on the device (private-fw's sample and row coefficients), if it has one: the
 * client gives it memory(cfg) bytes of its arena, the store a section of this type. */
typedef struct dprec_proto_state {
    uint16_t section; /* the store section type (client_priv.h lists the numbers in use) */
    int critical;     /* 1: a reader that does not know the section must refuse the file */
    size_t (*memory)(const dprec_config *cfg);      /* bytes of arena (0: this configuration keeps none) */
    size_t (*section_max)(const dprec_config *cfg); /* the largest section, header included (0: none) */
    void (*reset)(dprec_client *c);                 /* no state (before a load; called after bind) */
    /* Writes the section (header included) at p and returns its end (p itself when there is nothing to keep). */
    unsigned char *(*encode)(const dprec_client *c, unsigned char *p);
    /* Validates a section's data and, if commit, loads it. DPREC_OK or DPREC_ERR_STORE_CORRUPT. */
    int (*decode)(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
} dprec_proto_state;

typedef struct dprec_proto {
    const char *name;  /* as in the job's "protocol" field */
    uint16_t wire_id;  /* the envelope's protocol id (report.h) */
    /* Checks every job parameter the guarantee depends on against the device's public bounds and the client's
     * configuration, and fills *out. Refuses with DPREC_ERR_JOB_PARAMS (a parameter out of bounds, or the
     * published guarantee understating the device's own figure), DPREC_ERR_REPORT_TOO_LARGE (the report does
     * not fit cfg.max_report_bytes), DPREC_ERR_CONFIG (the client keeps no state for this protocol). Never
     * looks at the user's ratings: a refusal is the same for every device. */
    int (*policy)(const dprec_client *c, const dprec_sync_job *job, dprec_job_policy *out);
    /* Builds the whole report (envelope header included) into out[0 .. cap) from the client's fitted user
     * vector and ratings; *len gets its size, exactly pol->report_bytes for a private protocol. Called from
     * inside dprec_report_prepare after the charge was found to fit: the only place a protocol randomizes.
     * With c->fallback set it must build the report of a user with no ratings (u = 0, c->count = 0: sync.c
     * sets both) without touching any durable state: sync.c does so when the first build failed, so that
     * whether and how much a device sends never depends on its data. */
    int (*build)(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol,
                 const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len);
    const dprec_proto_state *state; /* NULL: the protocol keeps nothing between rounds */
} dprec_proto;

/* The protocols this SDK can take part in (sdk/protocols/table.c), and the one named `name` (NULL if none). */
extern const dprec_proto *const dprec_protocols[];
extern const size_t dprec_protocol_count;
const dprec_proto *dprec_proto_find(const char *name);
/* The arena memory the client gave protocol p's state (NULL if p has no state or this configuration keeps none);
 * the protocol lays it out itself. */
unsigned char *dprec_proto_state_mem(const dprec_client *c, const dprec_proto *p);

/* Writes the envelope header of a report for this job's open round (protocol id, job, round, report id,
 * release version, payload length) at out[0 .. DPREC_ENVELOPE_HEADER). Every protocol's build starts so. */
void dprec_proto_write_header(const dprec_sync_job *job, uint16_t protocol, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                              uint32_t payload_len, unsigned char *out);

/* ---- helpers the policies share (policy.c) ------------------------------------------------------------ */

/* The job's cumulative guarantee after `rounds` charged rounds of the policy, at the job's unit (*eps,
 * *delta) and at user level (*user_eps, *user_delta), from the device's own accountant: pure rounds add up
 * (basic composition), RDP and zCDP rounds compose at every order and convert at pol->delta (CKS). */
int dprec_policy_cost(const dprec_job_policy *pol, uint64_t rounds, double *eps, double *delta, double *user_eps,
                      double *user_delta);

/* Refuses (DPREC_ERR_JOB_PARAMS) a job whose published total (privacy.epsilon, and privacy.user_epsilon when
 * published) is below what the device computes for all of pol->rounds: an aggregator that understates what
 * the job costs. A relative slack of 1e-9 absorbs the rounding of a JSON number. */
int dprec_policy_check_published(const dprec_sync_job *job, const dprec_job_policy *pol);

/* The job's fingerprint: SHA-256 over the protocol name and every field of the policy but `rounds`, truncated.
 * A job whose fingerprint changes after the device first took part is refused (DPREC_ERR_JOB_CHANGED). The
 * number of rounds is left out because an operator may close a job early (fewer rounds cost less); the ledger
 * keeps the smallest number it has seen and never charges more rounds than that (DPREC_ERR_JOB_ROUNDS). */
void dprec_policy_pin(const char *protocol, const dprec_job_policy *pol, unsigned char pin[DPREC_JOB_PIN_SIZE]);

/* Common checks of a job's own fields: d, m and the scale match the client, rounds >= 1, the round within
 * 1 .. rounds. DPREC_ERR_RELEASE_MISMATCH or DPREC_ERR_JOB_PARAMS. */
int dprec_policy_check_job(const dprec_client *c, const dprec_sync_job *job);

/* The protocols of this SDK. */
extern const dprec_proto dprec_proto_plain;                                             /* sdk/protocols/plain.c */
extern const dprec_proto dprec_proto_ldp_gd, dprec_proto_ldp_gddr, dprec_proto_ldp_rr;  /* sdk/protocols/ldp.c */
extern const dprec_proto dprec_proto_gauss_gd;                                          /* sdk/protocols/gauss.c */
/* gauss-gd, for tests: the device's own u of params.u_update "gradient" (d floats) and the job and round of
 * its last step (job 0: none). */
const float *dprec_gauss_state_u(const dprec_client *c, uint64_t *job, uint64_t *round);
extern const dprec_proto dprec_proto_private_fw;                                        /* sdk/protocols/fw.c */
/* private-fw, for tests: sets the client's state for a job (as a report of `round` would leave it).
 * DPREC_ERR_CONFIG if the client keeps no private-fw state, DPREC_ERR_INVALID_ARGUMENT if n > fw_max_ratings. */
int dprec_fw_state_set(dprec_client *c, uint64_t job, uint64_t round, const uint32_t *items, uint32_t n,
                       const float *g);
/* ... and reads it: the job (0: none), its round, the sample (up to cap items; *n gets their number). */
int dprec_fw_state_get(const dprec_client *c, uint64_t *job, uint64_t *round, uint32_t *items, uint32_t cap,
                       uint32_t *n);

extern const dprec_proto dprec_proto_dpals;                                              /* sdk/protocols/dpals.c */
extern const dprec_proto dprec_proto_dpmf;                                               /* sdk/protocols/dpmf.c */
extern const dprec_proto dprec_proto_sgld;                                               /* sdk/protocols/sgld.c */

#endif /* DPREC_PROTOCOL_H */
