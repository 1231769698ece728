/* dprec internal — the device side of a training protocol, as one table of functions (like curl's TLS
 * backends): sync.c fetches the job and fits the user vector on the round's release, then asks the job's
 * protocol what the report costs and how to build it. Adding a protocol adds a protocol_<name>.c with one
 * `const dprec_proto` and a line in sync.c's table; nothing else changes. */
#ifndef DPREC_PROTOCOL_H
#define DPREC_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/privacy.h"
#include "json.h"

typedef struct dprec_client dprec_client;

#define DPREC_SYNC_PROTOCOL_NAME_MAX 24

/* A job as GET /v1/jobs/{job} describes it (docs/protocol.md), already checked against the client. */
typedef struct dprec_sync_job {
    uint64_t job_id;
    char protocol[DPREC_SYNC_PROTOCOL_NAME_MAX];
    uint32_t d, m;
    double rating_min, rating_max;
    int done;                 /* state "done" */
    uint64_t round;           /* the open round */
    uint64_t release_version; /* the release the open round is computed on */
    int64_t deadline;         /* unix seconds */
    double participation;     /* in [0, 1] */
    /* The job's published guarantee ("privacy": docs/protocol.md): its total epsilon and delta over all its
     * rounds (NaN when absent or "inf"), and, for protocols whose rounds are pure epsilon-DP (the local ones),
     * the epsilon of one round (NaN otherwise). The device's ledger cap bounds whatever the aggregator says. */
    double epsilon, delta, round_epsilon;
    const dprec_json_doc *doc; /* the whole job object (token 0), for protocol parameters ("params.*") */
} dprec_sync_job;

typedef struct dprec_proto {
    const char *name;  /* as in the job's "protocol" field */
    uint16_t wire_id;  /* the envelope's protocol id (report.h) */
    dprec_unit unit;   /* what the report's guarantee protects */
    dprec_model model;
    /* Fills the charge's guarantee fields (job_epsilon, job_delta: the job's cumulative guarantee after this
     * report) from the job; job_id, round, unit and model are set by the caller (from the fields above) before
     * the call, and a protocol whose unit depends on the job's params (gauss-gd) overwrites unit. Refuses a job whose
     * parameters it does not accept (DPREC_ERR_PROTOCOL). */
    int (*charge)(const dprec_sync_job *job, dprec_charge *out);
    /* Builds the whole report (envelope header included) into out[0 .. cap) from the client's freshly
     * fitted user vector and ratings; *len gets its size. DPREC_ERR_REPORT_TOO_LARGE if cap is too small.
     * Called from inside dprec_report_prepare, after the charge was found to fit: the only place a
     * protocol randomizes. */
    int (*build)(dprec_client *c, const dprec_sync_job *job, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                 unsigned char *out, size_t cap, size_t *len);
    /* The unit when it depends on the job's params (ldp-rr's rr_unit); NULL: always `unit`. */
    dprec_unit (*unit_of)(const dprec_sync_job *job);
} dprec_proto;

/* Writes the envelope header of a report for this job's open round (protocol id, job, round, report id,
 * release version, payload length) at out[0 .. DPREC_ENVELOPE_HEADER). Every protocol's build starts so. */
void dprec_proto_write_header(const dprec_sync_job *job, uint16_t protocol, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                              uint32_t payload_len, unsigned char *out);

/* The `plain` reference protocol (protocol_plain.c): no privacy; the exact per-user statistics. */
extern const dprec_proto dprec_proto_plain;
/* The local-DP protocols of seed 000 (protocol_ldp.c). */
extern const dprec_proto dprec_proto_ldp_gd, dprec_proto_ldp_gddr, dprec_proto_ldp_rr;
/* `gauss-gd` (protocol_gauss.c): seed 001's clipped gradient, Gaussian noise added by the aggregator. */
extern const dprec_proto dprec_proto_gauss_gd;
/* `private-fw` (protocol_fw.c): seed 002's Private Frank-Wolfe, the device's local step (joint DP). */
extern const dprec_proto dprec_proto_private_fw;

#endif /* DPREC_PROTOCOL_H */
