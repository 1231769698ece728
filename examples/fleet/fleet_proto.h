/* dprec-fleet internals: a protocol's side of the simulator, one descriptor per protocol (fleet_proto_*.c) and
 * one line in examples/fleet/protocols/table.c. The shared code (fleet_main.c and the pieces fleet_sim.h lists)
 * parses the common flags, loads the data, runs the devices and the rounds, and never names a protocol: everything
 * that depends on one — its flags and their defaults, its job spec, the device configuration it needs, how a device
 * predicts — is here. */
#ifndef DPREC_FLEET_PROTO_H
#define DPREC_FLEET_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dprec/dprec.h"
#include "fleet.h"

#define FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING 0.1

/* --opt-in's start (fleet_common.start_job): plain's clips on the user vectors and the bias step's residuals, in
 * scale widths tau = rating_max - rating_min. plain's own defaults (16 tau, 2 tau) never bind on an honest report and
 * let 15 sybils among 150 opted-in devices move every item bias by up to 8 on a 1..5 scale; these bound the move by
 * tau / 2 and cost the honest start nothing we could measure (docs/privacy.md "An opt-in start"). */
#define FLEET_START_U_CLIP 1.0
#define FLEET_START_RESIDUAL_CLIP 0.5

/* The options every protocol may read (set from the common flags before a protocol's finish runs). */
typedef struct fleet_common {
    unsigned rounds, rank;
    int rounds_set, rank_set; /* given on the command line (else a protocol's finish may set its own default) */
    int factor_start; /* --opt-in: the job starts from another job's factors, so no population rule (it plans from zero);
                       * dpals applies the rule's test to the start instead (start_biases_only) */
    double factor_start_share; /* with factor_start: the share of the devices that made the start (they sit the job out) */
    /* set by dpals's population hook with factor_start: the population rule finds that the job cannot measure a factor,
     * so it keeps the start's factors and corrects its item biases only (params.factors false with base_factors) */
    int start_biases_only;
    double lambda;          /* --lambda, or -1: the protocol's default (its finish sets it) */
    /* --device-lambda-per-rating W (a device with n ratings uses cfg.lambda = W n; 0: off), or -1: the protocol's
     * default (its finish may set it; else FLEET_DEFAULT_DEVICE_LAMBDA_PER_RATING, or 0 with device_lambda_fixed) */
    double device_lambda_per_rating;
    /* --device-lambda-floor L: with a per-rating ridge, a device uses max(W n, L); or -1: the protocol's default (its
     * finish may set it; else 0) */
    double device_lambda_floor;
    int device_lambda_set, device_lambda_floor_set; /* the two above given on the command line */
    int lambda_set;         /* --lambda given on the command line */
    int device_lambda_fixed;/* set by a protocol's finish: its devices' default ridge is the fixed --device-lambda or
                             * lambda, not --device-lambda-per-rating's default (given on the command line, that wins) */
    double epsilon, delta;  /* --epsilon / --delta (the job's budget; the devices' caps) */
    int epsilon_set, delta_set;
    uint64_t seed;
    unsigned items_top;     /* --items-top N (0: every item) */
    const char *item_subset;/* with --items-top: the kept items as a hex bitmap of m bits (bit j % 8 of byte j / 8) */
    /* --secure-agg: the job's params.aggregation "secure" (an untrusted aggregator; docs/privacy.md "Secure
     * aggregation"), for a protocol whose descriptor has secure_agg; --dropout: the share of devices that drop out of
     * each round's secure aggregation (half of them after sharing their keys and before their masked input, half
     * after their masked input), so that the recovery paths run */
    int secure_agg;
    double dropout;
    /* set by the shared code while it runs --bias-base's job: the private bias model at this rank (the base model's
     * spec asks params.factors false and its own defaults for the bias, not the factors') */
    int base_model;
    /* set by the shared code while it runs --opt-in's start: the few opted-in devices make every other device's start,
     * so its spec asks clips that bound what a sybil among them moves (plain: FLEET_START_U_CLIP and
     * FLEET_START_RESIDUAL_CLIP scale widths; docs/privacy.md "An opt-in start") */
    int start_job;
    /* --malicious F: the share of the devices (chosen by the seed) that send the protocol's worst report instead of
     * their own in the main job (fleet_proto.worst_report; docs/privacy.md "Poisoning"); 0: none */
    double malicious;
    /* set by a protocol's population hook: its job spec asks the aggregator's population rule (docs/protocol.md, "The
     * population rule") for d and the rounds, and fleet_proto_rule_applied's function takes them from the created
     * job */
    int population_rule;
    unsigned rule_devices;          /* with population_rule: the devices N it declares */
    double rule_ratings_per_device; /* and the ratings a device typically holds, a */
} fleet_common;

/* What a malicious device's worst report is built from (fleet_proto.worst_report): the payload its SDK built for the
 * round (its sizes are the job's: a padded length, a rank) and the release it fitted on, as the device holds them. */
typedef struct fleet_worst_in {
    const unsigned char *honest;
    size_t honest_len;
    const unsigned char *release;
    size_t release_len;
    const dprec_release_info *info;
} fleet_worst_in;

/* ---- the empirical privacy audit (--audit-canaries; fleet_audit.c, docs/privacy.md "Empirical audit") ------------ */

/* One canary as a protocol's audit hooks see it. */
typedef struct fleet_canary {
    uint32_t index; /* 0 .. N - 1 */
    uint32_t item;  /* its own item, which no other user rates (fleet_audit_hooks.own_items), else UINT32_MAX */
    int in;         /* the data set asked for: 1 the canary's ("in"), 0 the other one (the local model's replacement) */
    /* the release: the one the round's reports are computed on (per_round data, report_score), or the job's last
     * (release_score); NULL where the data does not depend on it */
    const unsigned char *release;
    size_t release_len;
    const dprec_release_info *info;
} fleet_canary;

/* A protocol's part of the audit: what its canaries hold and what its adversary reads. The shared code draws the
 * coins, adds the canaries to the fleet, runs the job and computes the bound; everything here is the protocol's. */
typedef struct fleet_audit_hooks {
    /* 1: the adversary reads each device's reports (the local model): a canary whose coin is "out" is still a device
     * and reports, from its other data set (local DP holds for any two data sets of one device; whether a device
     * reports is not protected, docs/privacy.md). 0: it reads the releases: a canary "out" is not in the run at all
     * (add or remove one user, the central, joint and posterior-sampling guarantees) */
    int local;
    int own_items; /* 1: each canary gets an item of its own, appended to the catalogue */
    int per_round; /* 1: its data depends on the round's release and is set again before each round */
    /* After every flag: 0 if this run of the protocol can be audited, else an exit status with a message printed
     * (NULL: always). */
    int (*check)(const fleet_common *o);
    /* The canary device's configuration, after the common one and the protocol's `device` (its capacity, its ridge). */
    void (*config)(const fleet_common *o, const fleet_data *d, dprec_config *cfg);
    /* Its ratings in the data set c->in (at most cap of them). 0, or -1 (it cannot be built: printed). */
    int (*data)(const fleet_common *o, const fleet_data *d, const fleet_canary *c, dprec_rating *out, uint32_t cap,
                uint32_t *n);
    /* local: the score in favour of "in" of one report's payload, computed on c->release (added over the rounds) */
    double (*report_score)(const fleet_common *o, const fleet_data *d, const fleet_canary *c, const unsigned char *payload,
                           size_t len);
    /* otherwise: the score in favour of "in" read off the job's last release (c->release) */
    double (*release_score)(const fleet_common *o, const fleet_data *d, const fleet_canary *c);
    const char *canary;    /* what a canary holds, in a few words (printed) */
    const char *adversary; /* what its score reads (printed) */
} fleet_audit_hooks;

/* The central protocols' canary, for their hooks (fleet_audit.c): a device whose own ridge is so large that its u is 0
 * (x = [0; 1]: every report spends its whole clip on the bias coordinate), rating its own item at the top of the
 * scale; scored by that item's bias in the last release. */
void fleet_audit_config_zero_u(const fleet_common *o, const fleet_data *d, dprec_config *cfg);
int fleet_audit_data_own_item_top(const fleet_common *o, const fleet_data *d, const fleet_canary *c, dprec_rating *out,
                                  uint32_t cap, uint32_t *n);
double fleet_audit_score_own_bias(const fleet_common *o, const fleet_data *d, const fleet_canary *c);

typedef struct fleet_proto {
    const char *name;
    const char *help; /* its flags, for --help (NULL: none) */
    const char *const *flags; /* its flags' names, NULL-terminated (to tell a user which protocol takes one) */
    /* One of its flags: 1 if `flag` is one (its value, when it takes one, is `value`: the caller skips it),
     * 0 if not, -1 on a bad value (a message printed). *takes_value gets whether it consumed value. */
    int (*arg)(fleet_common *o, const char *flag, const char *value, int *takes_value);
    /* After every flag: the protocol's defaults (o->lambda among them) and checks. 0, or an exit status with a
     * message printed. */
    int (*finish)(fleet_common *o);
    /* The job spec for POST /v1/admin/jobs: m and the rating scale from d, min_reports = the number of devices. */
    void (*spec)(const fleet_common *o, const fleet_data *d, char *out, size_t cap);
    /* The device configuration this protocol needs (its report size, its state); called after the common
     * configuration (scale, capacity, caps) is set. ntrain: the device's training ratings. */
    void (*device)(const fleet_common *o, const fleet_data *d, uint32_t ntrain, dprec_config *cfg);
    /* A device whose predictions are its own (private-fw's row Y_i): writes its coefficients u (dim floats) and
     * the base of a prediction, score = base + u . v_j, with no item bias. DPREC_ERR_NOT_FOUND: no state yet
     * (u = 0). NULL: predictions come from the least-squares fit on the release, mu + b_j + u . v_j. */
    int (*own_vector)(const fleet_common *o, const fleet_data *d, dprec_client *c, uint64_t job, float *u,
                      uint32_t dim, double *base);
    /* Printed after the job line (NULL: nothing); d: the fleet's data. */
    void (*describe)(const fleet_common *o, const fleet_data *d);
    /* The protocols a run of this one is compared with by default (--compare: each on a fresh copy of the fleet at
     * the same budget, with its own defaults), comma-separated; NULL: none. */
    const char *compare;
    /* What this protocol is, in a few words, for the comparison lines (NULL: its name). */
    const char *summary;
    /* --malicious (docs/privacy.md "Poisoning"): writes into out (cap bytes) the payload of the worst report this
     * protocol's aggregator accepts, which a malicious device sends in place of its own (its envelope, token and
     * route stay the device's): every value as large as the payload check lets through (finite, up to FLT_MAX), so
     * that only the aggregator's own clip bounds it, and aligned to push the release one way. *len gets its length.
     * NULL: the protocol refuses --malicious. 0, or -1 (cap too small, or an honest payload of another shape). */
    int (*worst_report)(const fleet_common *o, const fleet_data *d, const fleet_worst_in *in, unsigned char *out,
                        size_t cap, size_t *len);
    /* --audit-canaries: the protocol's canaries and its adversary's score (NULL: the protocol refuses the audit) */
    const fleet_audit_hooks *audit;
    /* After the data is loaded and split, before the devices and the job: the defaults that follow the population (the
     * devices, the catalogue, the budget), for every setting not given on the command line: either the protocol's own
     * (and a line that says what they are and why), or it sets o->population_rule and its spec asks the aggregator's
     * rule (aggregator/protocols/dpals_rule.h). NULL: the protocol's defaults do not depend on it. */
    void (*population)(fleet_common *o, const fleet_data *d);
} fleet_proto;

/* --bias-base: 1 if protocol p takes it (its aggregator starts from a base job's item biases and its devices predict
 * with the release's biases: one line of examples/fleet/protocols/table.c's list), and the protocol whose job makes the base (the
 * private bias model, run at p's d with fleet_common.base_model set). */
int fleet_proto_takes_bias_base(const fleet_proto *p);
const fleet_proto *fleet_proto_base_model(void);

/* bias's population hook (protocols/dpals.c): the bias model's device ridge and the population rule's clip for it
 * (each unless given; the clip printed). */
void fleet_dpals_population_print(fleet_common *o, const fleet_data *d);

/* With o->population_rule, once the job is created: job is the aggregator's answer, which carries the rule's choice
 * (docs/protocol.md, "The population rule"); takes the job's d, rounds and the devices' ridge the rule recommends (each
 * unless given) and prints the rule's line. 1 if the devices' configuration changed (the fleet loads them again), 0 if
 * not, -1 (printed) on an answer without the rule's record. */
typedef int (*fleet_rule_applied_fn)(fleet_common *o, const fleet_data *d, const cJSON *job);
/* The protocols whose population hook may set population_rule: one line of examples/fleet/protocols/table.c's list
 * (NULL: none). */
fleet_rule_applied_fn fleet_proto_rule_applied(const fleet_proto *p);
int fleet_dpals_rule_applied(fleet_common *o, const fleet_data *d, const cJSON *job);
int fleet_gauss_rule_applied(fleet_common *o, const fleet_data *d, const cJSON *job);

/* 1 if protocol p takes --secure-agg (its spec and device read fleet_common.secure_agg): one line of
 * examples/fleet/protocols/table.c's secure list. */
int fleet_proto_secure_agg(const fleet_proto *p);

/* Whether protocol p's aggregator publishes its items' uncertainty for a job that asks (release_uncertainty; the devices
 * then shrink noisy items, docs/privacy.md "Release uncertainty"): 0 no, 1 yes when --uncertainty on, 2 yes unless
 * --uncertainty off; for a job with secure aggregation (secure 1), 0 for a protocol whose column does not model the
 * devices' shares (gauss-gd). One line of examples/fleet/protocols/table.c's list. */
int fleet_proto_release_uncertainty(const fleet_proto *p, int secure);

/* The fewest survivors a secure round of n devices may unmask, as the fleet asks (secagg_min_survivors): 95% of the
 * devices --dropout leaves through the consistency round (a round unmasks only once that many survivors attested the
 * survivor set: the devices that drop after their masked input are in the sum but attest nothing), at least 3. The
 * devices' noise shares are sized for that many. */
unsigned fleet_secure_min_survivors(const fleet_common *o, unsigned n);

/* For a protocol whose devices also talk to a service of its own (dpmf's relay), in the order run: job_begin before
 * the job's spec (start the service as the aggregator was started: in-process or a child over HTTPS, per
 * `aggregator`; one device transport per worker), job_created once the aggregator gave the job its id, worker_relay
 * the transport worker w's devices use (dprec_sync_config.relay; NULL: none), round_end after the devices synced in a
 * round and before the fleet closes it (token: the fleet's own registration at the aggregator), job_end after the job,
 * also after a failure. 0, or -1 with a message in err. A protocol has them through one line of examples/fleet/protocols/table.c's
 * job hooks table. */
typedef struct fleet_job_hooks {
    int (*job_begin)(const fleet_common *o, const fleet_conn_options *aggregator, unsigned workers, char *err,
                     size_t errcap);
    int (*job_created)(const fleet_common *o, uint64_t job, char *err, size_t errcap);
    const dprec_transport *(*worker_relay)(unsigned w);
    int (*round_end)(const fleet_common *o, fleet_conn *aggregator, const char *token, uint64_t job, unsigned round,
                     char *err, size_t errcap);
    void (*job_end)(void);
} fleet_job_hooks;

/* The job hooks of protocol p (NULL: none). */
const fleet_job_hooks *fleet_proto_hooks(const fleet_proto *p);


/* The index of the device the shared code is working for on the calling thread (set just before a protocol's `device`
 * builds its configuration, and before it syncs): for settings that differ between devices, such as sgld's epsilon_i,
 * and for --malicious, which finds the syncing device's share by it. */
extern _Thread_local uint32_t fleet_device_index;

extern const fleet_proto *const fleet_protos[];
extern const size_t fleet_proto_count;
extern const char *const fleet_protos_planned; /* protocols named but not built yet ("": none) */
/* The protocol named `name`, or NULL. */
const fleet_proto *fleet_proto_find(const char *name);

/* Shared by the protocols' flag parsers. */
int fleet_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out);
int fleet_parse_double(const char *s, double *out);
int fleet_flag_error(const char *msg, const char *arg); /* prints "dprec-fleet: msg arg" and returns 2 */

#endif /* DPREC_FLEET_PROTO_H */
