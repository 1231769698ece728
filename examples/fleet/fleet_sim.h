/* dprec-fleet internals: what the pieces of the program share. fleet_options.c reads the command line (and the data
 * set it names), fleet_device.c runs the simulated devices on a pool of threads, fleet_run.c runs one job round by
 * round against the aggregator, fleet_compare.c runs the comparisons and says whether the job beats them,
 * fleet_output.c prints (the lines, the CSV, the plot), and main() in fleet_main.c strings them together. Host
 * program code, not API. */
#ifndef DPREC_FLEET_SIM_H
#define DPREC_FLEET_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/privacy.h"
#include "dprec/sync.h"
#include "fleet.h"
#include "fleet_proto.h"

/* With no arguments the fleet demonstrates privacy: the best private protocol at epsilon = 1 on the leaderboard's
 * MovieLens-10M-shaped fleet (docs/results.md), at a scale that runs in a few minutes (its raters per item, which
 * set what privacy costs, do not depend on the scale), beside `gauss-gd`, the next best there, and `plain`. Since the
 * Gram weight of dpals (docs/results.md "Defaults") the private bias model is that protocol at epsilon = 1
 * (ml10m:0.1, with reweighting: bias 0.8444, gauss-gd 0.8552, dpals 0.8572). */
#define FLEET_DEFAULT_SYNTHETIC "ml10m:0.03"
#define FLEET_DEFAULT_PROTOCOL "bias"
#define FLEET_DEFAULT_COMPARE "gauss-gd,plain"
#define FLEET_MAX_SYNC_ATTEMPTS 40
#define FLEET_DEFAULT_ROUNDS 12
#define FLEET_DEFAULT_RANK 10
#define FLEET_MAX_COMPARE 4

/* ---- fleet_enroll.c: --registration token, the fleet as the app's backend ----------------------------------- */

#define FLEET_TOKEN_MAX 256u /* room for an enrollment token (common/identity.h: at most 231 bytes) */
extern const char fleet_app_id[];
/* The run's enrollment key pair (drawn once): its public half (DER) for the services. 0, or -1 with a message. */
int fleet_enroll_init(const unsigned char **pub, size_t *pub_len, char *err, size_t errcap);
/* A token for the client's identity key (drawn and stored by the SDK if it has none), signed as a backend signs it. */
int fleet_enroll_token(dprec_client *c, unsigned char *out, size_t cap, size_t *len);
/* The registration body (JSON, cap >= 1024) of the fleet's evaluator, enrolled with an identity of its own. */
int fleet_enroll_register_body(char *out, size_t cap);

typedef struct options {
    fleet_common c;          /* what every protocol may read */
    const fleet_proto *proto;
    const char *data, *synthetic, *csv, *plot, *store_dir;
    const char *compare; /* --compare LIST (NULL: the protocol's default list) */
    unsigned threads, eval_every;
    double device_lambda, test_fraction;
    double device_lambda_floor_given; /* --device-lambda-floor, or -1: the protocol's default */
    double device_lambda_per_rating_given; /* --device-lambda-per-rating, or -1: the protocol's default */
    char *item_subset; /* --items-top: the subset's hex bitmap (malloc'd; c.item_subset points here) */
    int subset_from_data; /* --items-top kept fewer items than there are: a subset counted in the data itself */
    int quiet, verbose, verify_each;
    int enroll; /* --registration token (fleet_enroll.c) */
    const char *release_encoding; /* --release-encoding: "f32", "q16" or "q8", asked of every job (NULL: not given) */
    int uncertainty; /* --uncertainty: 1 on, 0 off, -1 not given (the protocol's default, fleet_proto_release_uncertainty):
                      * the jobs' releases carry their items' uncertainty */
    /* --bias-base F (0: none): the share of the budget the base job (the private bias model) spends first; its
     * budget; and the whole budget, which the devices' caps and the comparisons get (c.epsilon and c.delta are the
     * main job's share) */
    double bias_base, base_epsilon, base_delta, total_epsilon, total_delta;
    uint64_t base_job; /* the finished base job the main job names as base_job (0: none) */
    int base_factors;  /* the main job takes the base's factors too ("base_factors": --opt-in's start) */
    /* --opt-in F (0: none): the share of devices that opt in to sharing their ratings (a plain job among them alone,
     * the main job's start); fleet_device.c draws each device's choice from the seed, never from its data */
    double opt_in;
    /* --audit-canaries N (0: no audit), --audit-confidence C, --audit-two-world T (fleet_audit.c) */
    unsigned audit_canaries, audit_two_world;
    double audit_confidence;
    fleet_conn_options conn;
} options;

/* A device on the POSIX port (--store-dir) with the fleet's deterministic entropy: the port's ctx is the posix
 * state, the first member, so the entropy function reaches the rest. */
typedef struct fleet_posix {
    dprec_port_posix posix;
    fleet_entropy entropy;
} fleet_posix;

typedef struct device {
    dprec_client *client;
    void *mem;
    dprec_port port;
    fleet_memport *mp;
    fleet_posix *posix;
    double sse;       /* squared error over the test ratings of the last evaluation */
    double sae;       /* absolute error (the MAE: seed 004's metric compares it with the non-private model's) */
    int failed;       /* a permanent error: the device is out of the fleet */
    int absent;       /* --audit-canaries: a canary whose coin kept it out of the run (no client) */
    int opted_in;     /* --opt-in: the device shares its ratings in the opt-in job (its app set allow_non_private) */
    unsigned char *token; /* --registration token: its enrollment token (fleet_enroll.c), malloc'd; else NULL */
    size_t token_len;
} device;

typedef struct fleet {
    options *o;
    fleet_data data;
    device *dev;
    fleet_conn *conn;
    uint64_t job;
    dprec_sync_config scfg;
    unsigned char *release;
    size_t release_len;
    dprec_release_info release_info;
    /* work distribution */
    atomic_uint_fast64_t next, done, reported, errors;
    double mae; /* the last evaluation's mean absolute error */
    double load_seconds; /* the last fleet_load_devices's */
    int phase; /* 0 load, 1 sync, 2 evaluate */
    int optin_only; /* --opt-in's job: only the opted-in devices sync (the others' apps never join a plain job) */
    int optin_spent; /* after it, until the devices are loaded afresh: the opted-in devices sit the jobs out (their
                      * ledgers hold the plain job's unbounded charge, past every cap: their SDK refuses a report) */
    uint32_t opted_in; /* --opt-in: how many devices opted in */
    double rmse_all;   /* --opt-in: the last evaluation over every device (fleet_evaluate's figure leaves them out) */
    int secure_step; /* a secure round's pass: 0 advertise, 1 share, 2 mask, 3 consistency, 4 unmask (-1: not secure) */
    unsigned round;  /* the round being run */
    char first_error[512];
    pthread_mutex_t lock;
    struct timespec phase_start;
    const char *phase_name;
    struct fleet_poison *poison; /* --malicious (fleet_poison.c), or NULL */
    struct fleet_audit *audit;   /* --audit-canaries, --audit-two-world (fleet_audit.c), or NULL */
} fleet;

typedef struct worker {
    fleet *f;
    int index;
    dprec_transport t;
    const dprec_transport *relay; /* the job's protocol's relay transport for this worker (or NULL) */
    dprec_transport poison_t;     /* --malicious: t behind fleet_poison.c's report rewriting (request NULL: off) */
    dprec_transport audit_t;      /* --audit-canaries, local model: t behind fleet_audit.c's report capture (NULL: off) */
} worker;

/* What a job gave: its RMSE after the last round, its guarantee (the aggregator's, checked against the devices'
 * own ledgers), and how many device failures it saw. */
typedef struct job_result {
    double rmse, epsilon, delta;
    dprec_model model;
    unsigned rounds;
    unsigned long long failures;
} job_result;


/* The baselines of the data (fleet_data_baselines): the test RMSE of the global mean, the item mean and the user
 * mean, the global mean, and the number of test ratings. */
typedef struct fleet_baselines {
    double global_rmse, item_rmse, user_rmse, mean;
    size_t ntest;
} fleet_baselines;

/* The comparison jobs run (--compare): their protocols and what each gave, in the order run. */
typedef struct fleet_comparisons {
    const fleet_proto *proto[FLEET_MAX_COMPARE];
    job_result res[FLEET_MAX_COMPARE];
    size_t n;
} fleet_comparisons;

/* ---- fleet_options.c: the command line ------------------------------------------------------------------- */

/* Parses the flags into *o (the protocol's own through its descriptor, then its defaults). 0; 1 after printing
 * --help; else an exit status, with a message printed. */
int fleet_parse_args(int argc, char **argv, options *o);
/* A protocol's defaults (its finish), then the common ones it left unset. */
int fleet_finish_proto(const fleet_proto *p, fleet_common *c);
/* The data set --data or --synthetic names. 0, or -1 with a message in err. */
int fleet_load_data(const options *o, fleet_data *d, char *err, size_t errcap);
/* --items-top: keeps the ratings of the N most-rated items, and the subset's bitmap in o. 0, or -1 (out of memory). */
int fleet_filter_items(options *o, fleet_data *d);

/* ---- fleet_device.c: the simulated devices and the threads that run them --------------------------------- */

/* The monotonic clock, in seconds. */
double fleet_now_s(void);
/* The signature-check memo the simulated devices share (dprec_sync_config.verified_seen / verified_remember). */
int fleet_sig_memo_seen(void *ctx, const unsigned char tag[32]);
void fleet_sig_memo_remember(void *ctx, const unsigned char tag[32]);
/* One pass over every device on nthreads threads: phase 0 loads, 1 syncs, 2 evaluates. */
void fleet_run_phase(fleet *f, int phase, const char *name, worker *ws, unsigned nthreads);
/* Every device's test RMSE on f->release (f->mae gets the MAE); NaN when no device was evaluated. */
double fleet_evaluate(fleet *f, worker *ws, unsigned nthreads, size_t ntest);
/* Frees every device's client, memory and port. */
void fleet_free_devices(fleet *f);
/* A fresh fleet for the selected protocol, each device loaded with its training ratings; announce: then the devices'
 * line (fleet_print_devices). 0 or -1 (printed). */
int fleet_load_devices(fleet *f, worker *ws, unsigned nthreads, int announce);
/* The devices' line: how many, their stores, the largest SDK memory, the last load's time. */
void fleet_print_devices(fleet *f);

/* ---- fleet_run.c: one job against the aggregator --------------------------------------------------------- */

/* One request whose answer is JSON, as the operator (admin) or as a device (bearer); the parsed answer if its status
 * is `want`, else NULL with a message in err. */
cJSON *fleet_call_json(fleet *f, int admin, const char *method, const char *path, const char *bearer,
                       const char *body, int want, char *err, size_t errcap);
/* A number of a JSON object (a string "inf" or a number in a string too), or dflt. */
double fleet_json_num(const cJSON *o, const char *key, double dflt);
/* Runs one job of the selected protocol on the loaded devices, to its last round; gm, im, um: the global, item and
 * user means' test RMSE, which the main job's --plot draws. 0, or -1 (printed). */
int fleet_run_job(fleet *f, worker *ws, unsigned nthreads, const char *token, int main_job, double gm, double im,
                  double um, job_result *res);
/* --bias-base: the private bias model's job on the same devices, at its share of the budget. 0, or -1 (printed). */
int fleet_run_base(fleet *f, worker *ws, unsigned nthreads, const char *token, job_result *res);
int fleet_run_optin(fleet *f, worker *ws, unsigned nthreads, const char *token, job_result *res);

/* ---- fleet_poison.c: --malicious ------------------------------------------------------------------------------ */

/* After the devices are loaded: picks the malicious devices (o->c.malicious of them, by the seed) and puts each worker's
 * transport behind the report rewriting (worker.poison_t). Nothing without --malicious. 0, or -1 (printed). */
int fleet_poison_start(fleet *f, worker *ws, unsigned nthreads);
/* The main job: from its spec (as sent to the aggregator, f->job set), the malicious devices send their worst reports
 * and the fleet replays every round; job_end stops it. 0, or -1 with a message in err. */
int fleet_poison_job_begin(fleet *f, const char *spec, char *err, size_t errcap);
void fleet_poison_job_end(fleet *f);
/* Before a round's sync (f->release: the release its reports are computed on), and after it closed and its release
 * was fetched: the replay and the checks of round r. 0, or -1 with a message in err. */
void fleet_poison_round_begin(fleet *f);
int fleet_poison_round_end(fleet *f, unsigned r, char *err, size_t errcap);
/* The closing lines (nothing without --malicious); 1 if a bound was exceeded or nothing could be checked, else 0. */
int fleet_poison_print(const fleet *f);
void fleet_poison_free(fleet *f);

/* ---- fleet_audit.c: --audit-canaries N and --audit-two-world T, the empirical privacy audit ------------------ */

/* After the data is loaded, split and its baselines printed: draws the canaries' coins and adds them to the data (their
 * users, and their own items if the protocol's audit asks). Nothing without the flags. 0, or -1 (printed). */
int fleet_audit_setup(fleet *f);
/* Device u is a canary kept out of the run by its coin (central model): it gets no client. */
int fleet_audit_absent(const fleet *f, uint32_t u);
/* A canary device's configuration (the protocol's hook), and its ratings once its store is loaded (unless they are
 * set before every round). DPREC_OK for any other device. */
void fleet_audit_device_config(const fleet *f, uint32_t u, dprec_config *cfg);
int fleet_audit_device_load(fleet *f, uint32_t u);
/* After the devices' transports exist: puts each worker's behind the capture of the canaries' reports (local model). */
int fleet_audit_start(fleet *f, worker *ws, unsigned nthreads);
/* fleet_run_job's calls: the job's id is known; before a round's sync (the canaries' data of that round, from
 * f->release); after it (the local model's scores of the round's reports); after the guarantee is read (the central
 * scores from the last release, the guesses and the bound). 0, or -1 with a message in err. */
void fleet_audit_job_begin(fleet *f);
int fleet_audit_round_begin(fleet *f, char *err, size_t errcap);
void fleet_audit_round_synced(fleet *f);
void fleet_audit_job_end(fleet *f, const dprec_guarantee *g, const job_result *res);
/* The audit's lines, its contract line last; 1 when the lower bound exceeds the claimed epsilon (a privacy defect) or
 * the audit could not be made, else 0. */
int fleet_audit_print(const fleet *f);
/* --audit-two-world T: the job T times with the one canary and T times without, on fresh devices; prints its lines.
 * 0, or -1 (printed); *exceeded gets 1 when its bound exceeds the claim. */
int fleet_audit_two_world(fleet *f, worker *ws, unsigned nthreads, const char *token, int *exceeded);
void fleet_audit_free(fleet *f);

/* ---- fleet_compare.c: the comparisons and the verdict ---------------------------------------------------- */

/* Runs the comparisons (--compare, else the protocol's list), each on a fresh copy of the fleet at the same budget;
 * adds their device failures to *failures. 0, or -1 (printed). */
int fleet_compare_run(fleet *f, worker *ws, unsigned nthreads, const char *token, fleet_comparisons *cmp,
                      unsigned long long *failures);
/* The comparisons' lines, then the verdict of a private run against the user mean and each comparison. */
void fleet_compare_print(const options *o, const job_result *main_res, double user_rmse,
                         const fleet_comparisons *cmp);

/* ---- fleet_output.c: what the fleet prints --------------------------------------------------------------- */

/* An epsilon as every summary prints it: rounded up (dprec_format_up), "n/a" when unknown. */
void fleet_fmt_eps(char *out, size_t cap, double e);
/* The data and baselines lines, before anything runs. */
void fleet_print_data(const options *o, const fleet_data *d, const fleet_baselines *b);
/* The job's line (main job: on stdout with the protocol's description; a comparison or base job: its progress). */
void fleet_print_job(const fleet *f, unsigned nthreads, int main_job);
/* The secure-aggregation plan the aggregator published for the job, which every device checked. */
void fleet_print_secagg_plan(fleet *f);
/* The per-round table: its head, and one round's line (eps: the formatted epsilon). */
void fleet_print_round_head(void);
void fleet_print_round(unsigned r, unsigned long long reported, double rmse, const char *eps, double secs);
/* --csv: opens the file and writes its head; NULL (printed) when it cannot be written. */
FILE *fleet_csv_open(const char *path);
/* One round's CSV line, flushed. */
void fleet_csv_round(FILE *csv, unsigned r, unsigned long long reported, double rmse, const char *eps, double secs);
/* --plot: the RMSE per round from the CSV at `csv`, with gnuplot, beside the global, item and user means. */
void fleet_draw_plot(const options *o, const char *csv, double gm, double im, double um);
/* With secure aggregation: how many reports the aggregator stored (its metrics). */
void fleet_print_secagg_stored(fleet *f);
/* The job's guarantee as the aggregator states it (priv: its "privacy" object, or NULL), and at user level. */
void fleet_print_guarantee(const options *o, const dprec_guarantee *g, const cJSON *priv);
/* --bias-base: the base job's line; then the guarantee of the two jobs together. */
void fleet_print_base(const options *o, const job_result *base_res);
void fleet_print_with_base(const job_result *main_res);
/* The closing lines: the baselines with the wall time (before the comparisons' lines), and the final line. */
void fleet_print_baselines(const fleet_baselines *b, double wall_s);
void fleet_print_final(const options *o, const job_result *main_res);

#endif /* DPREC_FLEET_SIM_H */
