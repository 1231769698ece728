/* dprec — the device's privacy ledger, pending reports, and guarantee summaries.
 *
 * Before a randomized report may leave the device, the device charges its own ledger, durably, and stores
 * the report; a retry re-sends the stored bytes (re-randomizing would spend privacy twice). A report that
 * would take the user past the cap the app configured is refused before it is built.
 *
 * Units and models: every epsilon here says which unit it protects (one rating, or one user) and under
 * which model (local, central, joint, posterior-sampling heuristic). Caps are per unit: a rating-level
 * epsilon is not comparable with a user-level one, so they are never added together. Across jobs the ledger
 * adds epsilons and deltas (basic composition); within a job the protocol's accountant supplies the job's
 * cumulative (epsilon, delta) after each report, and the ledger charges the increase. */
#ifndef DPREC_PRIVACY_H
#define DPREC_PRIVACY_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/status.h"

DPREC_BEGIN_DECLS

typedef struct dprec_client dprec_client;

typedef enum dprec_unit {
    DPREC_UNIT_RATING = 1, /* neighbouring datasets differ in one rating of one user */
    DPREC_UNIT_USER = 2    /* ... in all the ratings of one user */
} dprec_unit;

typedef enum dprec_model {
    DPREC_MODEL_NONE = 0,    /* no privacy (the `plain` reference protocol): epsilon is infinite */
    DPREC_MODEL_LOCAL = 1,   /* local DP: the aggregator is not trusted */
    DPREC_MODEL_CENTRAL = 2, /* central DP: a trusted aggregator adds the noise */
    DPREC_MODEL_JOINT = 3,   /* joint DP: each user's own output may depend on their data */
    DPREC_MODEL_POSTERIOR_HEURISTIC = 4, /* one posterior sample; exact only for an exact sample */
    DPREC_MODEL_DISTRIBUTED = 5, /* distributed noise (dpmf's relay modes): an untrusted recommender sees only the noisy
                                  * sum, which a non-colluding relay forms from masked shares (docs/privacy.md) */
    DPREC_MODEL_SECURE_AGGREGATION = 6 /* distributed discrete Gaussian under secure aggregation (params.aggregation
                                        * "secure"): the aggregator sees only the sum of at least n_min devices' masked
                                        * inputs, whose shares of noise make the guarantee (docs/privacy.md) */
} dprec_model;

#define DPREC_REPORT_ID_SIZE 16
#define DPREC_JOB_PIN_SIZE 16

/* What one round of a job costs: the job's cumulative guarantee once this round is charged, from the protocol's
 * accountant (dprec_client_sync computes it on the device from the job's public parameters, never from the
 * aggregator's bookkeeping). */
typedef struct dprec_charge {
    uint64_t job_id;
    uint64_t round;       /* at most one report per job and round; rounds only go forward */
    dprec_unit unit;
    dprec_model model;
    double job_epsilon;   /* the job's total epsilon at its unit including this round (>= what was charged before) */
    double job_delta;     /* the job's total delta including this round */
    /* The same at user level, which every private job also counts against cap_user_*: for a user-level job
     * equal to job_epsilon / job_delta (which are then used), for a rating-level job its user-level equivalent,
     * so that a job cannot escape the user's cap by declaring another unit. */
    double user_epsilon;
    double user_delta;
    uint64_t max_rounds;  /* the most rounds the job may charge (0: no limit); the smallest one seen is kept */
    /* A fingerprint of the job's privacy parameters (all zero: none). The first charge of a job keeps it; a
     * later charge with another fingerprint, unit or model is refused (DPREC_ERR_JOB_CHANGED). */
    unsigned char pin[DPREC_JOB_PIN_SIZE];
} dprec_charge;

/* A job's line in the ledger. */
typedef struct dprec_ledger_entry {
    uint64_t job_id;
    dprec_unit unit;
    dprec_model model;
    uint32_t reports;     /* reports charged */
    uint32_t rounds;      /* rounds charged: the reports, and the rounds sat out of a Poisson-sampled job */
    uint64_t last_round;  /* the last round decided on (reported, sat out, or drawn to take part) */
    double epsilon;       /* the job's cumulative epsilon at its unit, charged so far */
    double delta;
    double user_epsilon;  /* the same at user level (what cap_user_epsilon bounds) */
    double user_delta;
    uint64_t max_rounds;  /* the most rounds the job may charge (0: no limit) */
} dprec_ledger_entry;

/* Builds the report into out[0 .. cap) and sets *len; called only after the charge is known to fit the cap.
 * report_id is the random id dprec_report_prepare chose for this report (the envelope carries it as the
 * idempotency key). Randomization happens here (use dprec_client_random or the SDK's samplers). Non-zero
 * aborts the report: nothing is charged or stored. */
typedef int (*dprec_report_build_fn)(void *user, const unsigned char report_id[DPREC_REPORT_ID_SIZE],
                                     unsigned char *out, size_t cap, size_t *len);

/* Charges the ledger and stores the report built by `build`, as one durable change written to both store
 * generations (so a later damaged file cannot lose the charge), and returns its random report id.
 * Refused, without calling build: DPREC_ERR_BUDGET_EXCEEDED (a cap would be passed: the job's unit cap, and
 * the user cap with the charge's user-level figures), DPREC_ERR_ALREADY_REPORTED (this job already has a
 * report for this round, sat it out, or is past it), DPREC_ERR_JOB_CHANGED (the job's fingerprint, unit or
 * model differ from its first charge), DPREC_ERR_JOB_ROUNDS (the job already charged max_rounds rounds),
 * DPREC_ERR_NON_PRIVATE (a model-NONE report while cfg.allow_non_private is 0),
 * DPREC_ERR_PENDING_FULL, DPREC_ERR_LEDGER_FULL, DPREC_ERR_LEDGER_LOST (see dprec_store_load).
 * On any error nothing is charged and nothing is stored. */
DPREC_API int dprec_report_prepare(dprec_client *c, const dprec_charge *charge, dprec_report_build_fn build,
                                   void *user, unsigned char report_id[DPREC_REPORT_ID_SIZE]);

typedef struct dprec_pending_report {
    unsigned char report_id[DPREC_REPORT_ID_SIZE];
    uint64_t job_id;
    uint64_t round;
    const unsigned char *bytes; /* valid until the next call that changes the store */
    size_t len;
} dprec_pending_report;

/* Reports stored and not yet acknowledged by the aggregator, oldest first: send (and re-send) these bytes. */
DPREC_API uint32_t dprec_report_pending_count(const dprec_client *c);
DPREC_API int dprec_report_pending_at(const dprec_client *c, uint32_t index, dprec_pending_report *out);

/* Removes a pending report once the aggregator has acknowledged it (durable on DPREC_OK; the charge stays).
 * DPREC_ERR_NOT_FOUND if no pending report has this id. */
DPREC_API int dprec_report_ack(dprec_client *c, const unsigned char report_id[DPREC_REPORT_ID_SIZE]);

/* The ledger line of a job (DPREC_ERR_NOT_FOUND if the job never charged). */
DPREC_API int dprec_ledger_job(const dprec_client *c, uint64_t job_id, dprec_ledger_entry *out);
/* The number of jobs in the ledger, and the index-th one. */
DPREC_API uint32_t dprec_ledger_count(const dprec_client *c);
DPREC_API int dprec_ledger_at(const dprec_client *c, uint32_t index, dprec_ledger_entry *out);
/* Total epsilon and delta charged for a unit, over all jobs (basic composition): for DPREC_UNIT_USER every
 * job's user-level figures, for DPREC_UNIT_RATING the rating-level jobs' own. */
DPREC_API int dprec_ledger_total(const dprec_client *c, dprec_unit unit, double *epsilon, double *delta);

/* After a store whose every generation was damaged, the ledger is unknown and reports are refused with
 * DPREC_ERR_LEDGER_LOST. This starts a fresh, empty ledger: only for an app that has decided, with the user,
 * that past spending may be forgotten. */
DPREC_API int dprec_ledger_reset_after_loss(dprec_client *c);

/* ---- guarantee summaries ----------------------------------------------------------------------------- */

typedef struct dprec_guarantee {
    const char *protocol;   /* e.g. "ldp-gd" */
    uint64_t job_id;
    dprec_unit unit;
    dprec_model model;
    double epsilon;         /* +infinity for DPREC_MODEL_NONE */
    double delta;
    const char *accountant; /* e.g. "pure composition", "RDP, CKS conversion, best order 12" */
} dprec_guarantee;

/* One line of text, e.g.
 *   "job 7 (ldp-gd): user-level local DP, epsilon = 1.6, delta = 0 (accountant: pure composition)"
 * and, for the posterior-sampling heuristic, the caveat that the epsilon holds only for an exact sample.
 * Numbers are printed rounded UP (never understating epsilon or delta). NUL-terminated; returns
 * DPREC_ERR_BUFFER_TOO_SMALL (with a truncated, terminated string) if cap is too small. */
DPREC_API int dprec_guarantee_text(const dprec_guarantee *g, char *out, size_t cap);

/* The same as one JSON object:
 *   {"protocol":"ldp-gd","job_id":7,"unit":"user","model":"local","epsilon":1.6,"delta":0,
 *    "accountant":"pure composition","caveat":null}
 * epsilon is the string "inf" for DPREC_MODEL_NONE (JSON has no infinity). */
DPREC_API int dprec_guarantee_json(const dprec_guarantee *g, char *out, size_t cap);

/* A privacy figure as the summaries print it: v >= 0 rounded UP to 4 significant digits ("1.6", "0.1235",
 * "1e-05"), "inf" for +infinity. NUL-terminated; DPREC_ERR_BUFFER_TOO_SMALL (truncated) if cap is too small,
 * DPREC_ERR_INVALID_ARGUMENT for a NaN or negative v. */
DPREC_API int dprec_format_up(double v, char *out, size_t cap);

/* The lowercase names used in text and JSON: "rating"/"user", "none"/"local"/"central"/"joint"/
 * "posterior-sampling heuristic". */
DPREC_API const char *dprec_unit_name(dprec_unit unit);
DPREC_API const char *dprec_model_name(dprec_model model);

DPREC_END_DECLS

#endif /* DPREC_PRIVACY_H */
