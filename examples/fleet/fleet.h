/* dprec-fleet internals: data sets, the in-memory port, the connection to an aggregator. Not API. */
#ifndef DPREC_FLEET_H
#define DPREC_FLEET_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/platform.h"
#include "dprec/sync.h"

/* ---- data --------------------------------------------------------------------------------------------- */

typedef struct fleet_rating {
    uint32_t user; /* dense 0 .. num_users-1 */
    uint32_t item; /* dense 0 .. num_items-1 */
    float value;
    int64_t timestamp;
} fleet_rating;

typedef struct fleet_data {
    uint32_t num_users, num_items;
    float rating_min, rating_max;
    fleet_rating *ratings; /* grouped by user after fleet_data_split */
    size_t num_ratings;
    /* after the split: user u's ratings are ratings[off[u] .. off[u+1]); the first ntrain[u] are training */
    size_t *off;
    uint32_t *ntrain;
    uint32_t max_train; /* the most training ratings of one user */
} fleet_data;

/* The next value of a splitmix64 stream (simulation randomness only: splits, synthetic data, never privacy). */
uint64_t fleet_rand_next(uint64_t *state);
double fleet_rand_unit(uint64_t *state); /* uniform in [0, 1) */

/* Loads u.data (tab), ratings.dat (::) or ratings.csv (comma, header). Ids are mapped densely in order of
 * their original value. Returns 0, or -1 with a message in err. */
int fleet_data_load(const char *path, fleet_data *d, char *err, size_t errcap);

/* Synthetic low-rank data (the default shape): users x items, about `ratings` ratings, item popularity ~ Zipf(1),
 * rating = 3 + b_j + u.v + N(0, noise^2), clamped to [1, 5], no user biases. */
int fleet_data_synthetic(uint32_t users, uint32_t items, size_t ratings, uint32_t rank, double noise,
                         uint64_t seed, fleet_data *d, char *err, size_t errcap);

/* A synthetic data set's shape: rating = mu + c_i + b_j + u_i . v_j + N(0, noise^2), rounded to multiples of `step`
 * (0: not rounded), clamped to [rating_min, rating_max]; c ~ N(0, user_bias_sd^2), b ~ N(0, item_bias_sd^2), u and v
 * Gaussian of rank `rank` with u.v of standard deviation about signal_sd; item j drawn with weight
 * 1 / (j + zipf_q)^zipf_s (a power law), each user's ratings without replacement; a user's count is Pareto with
 * minimum min_per_user and the mean ratings / users (pareto 1), or log-normal around an even share (pareto 0). */
typedef struct fleet_shape {
    uint32_t users, items;
    size_t ratings;
    uint32_t rank;
    double noise, mu, item_bias_sd, user_bias_sd, signal_sd, zipf_s, zipf_q, min_per_user;
    int pareto;
    double rating_min, rating_max, step;
    int harmonic; /* 1: factor component t has variance proportional to 1 / (t + 1); 0: all equal */
} fleet_shape;

/* The MovieLens-10M-shaped fleet of the leaderboard, its sizes scaled by f (1: 70,000 users, 10,000 items,
 * 10,050,000 ratings): power-law item popularity and user activity, user and item biases, low rank + noise. */
void fleet_shape_ml10m(double f, fleet_shape *s);
/* The named small shapes (--synthetic small, app2000; fleet_data.c): 0, or -1 for an unknown name. */
int fleet_shape_named(const char *name, fleet_shape *s);
int fleet_data_shape(const fleet_shape *s, uint64_t seed, fleet_data *d, char *err, size_t errcap);

/* Groups ratings by user and shuffles each user's list; a fraction `test_fraction` (rounded, at least one
 * rating kept for training) becomes that user's test set. */
int fleet_data_split(fleet_data *d, double test_fraction, uint64_t seed);

/* RMSE on the test ratings of the global-mean and item-mean predictors (from the training data: what a curator
 * holding every rating would compute, without privacy) and of the user mean (each user's own training mean: what
 * a device predicts from its own ratings alone, at no privacy cost under any trust model). */
void fleet_data_baselines(const fleet_data *d, double *global_rmse, double *item_rmse, double *user_rmse,
                          double *global_mean, size_t *num_test);

void fleet_data_free(fleet_data *d);

/* ---- a simulated device's entropy: SHA-256(seed || counter), reproducible by --seed (never in an app) ----- */

typedef struct fleet_entropy {
    unsigned char seed[16];
    uint64_t counter;
    int seeded;
} fleet_entropy;

void fleet_entropy_seed(fleet_entropy *e, uint64_t seed, uint32_t device);
int fleet_entropy_draw(fleet_entropy *e, unsigned char *buf, size_t len);

/* ---- the in-memory port: a device's files live in RAM -------------------------------------------------- */

typedef struct fleet_memfile {
    char name[DPREC_PORT_NAME_MAX];
    unsigned char *data;
    size_t len, cap;
    int used;
} fleet_memfile;

#define FLEET_MEMPORT_FILES 8

typedef struct fleet_memport {
    fleet_memfile files[FLEET_MEMPORT_FILES];
    int last_cause;
    fleet_entropy entropy; /* seeded: the device's entropy; else the OS's */
} fleet_memport;

void fleet_memport_init(dprec_port *port, fleet_memport *mp);
void fleet_memport_free(fleet_memport *mp);

/* ---- the connection to an aggregator --------------------------------------------------------------------- */

typedef struct fleet_conn fleet_conn;

typedef struct fleet_conn_options {
    int in_process;          /* dprec_agg_open in a temp dir */
    const char *url;         /* --aggregator URL (device listener), or NULL */
    const char *admin_url;   /* --admin-url, or NULL */
    const char *admin_token; /* --admin-token, or NULL */
    const char *cacert;      /* --cacert PEM for --aggregator, or NULL */
    const char *release_key; /* --release-key DER for --aggregator, or NULL */
    const char *argv0;       /* to find dprec-aggregator next to the fleet */
    int verbose;
    int relay;               /* the service is a relay (dprec-relay, relay/relay.h; key file relay-key.der) */
    /* --registration token: the app's enrollment public key (DER) and app id the services it starts enroll with
     * (fleet_enroll.c plays the app's backend); NULL: registration open */
    const unsigned char *enrollment_key;
    size_t enrollment_key_len;
    const char *app_id;
} fleet_conn_options;

/* Opens the aggregator: in-process, an existing one, or a child `dprec-aggregator serve`. */
int fleet_conn_open(const fleet_conn_options *o, fleet_conn **out, char *err, size_t errcap);
void fleet_conn_close(fleet_conn *c);

/* A device transport (one per thread; the in-process one is shared-safe). */
int fleet_conn_transport(fleet_conn *c, dprec_transport *t, char *err, size_t errcap);
void fleet_conn_transport_free(fleet_conn *c, dprec_transport *t);

/* The release-signing public key (DER) devices pin; for a relay, the key its round sums are signed with. */
const unsigned char *fleet_conn_release_key(const fleet_conn *c, size_t *len);

/* One request. admin: to the admin listener with the admin token; else the device listener with bearer
 * (may be NULL). The response body is returned malloc'd in *body (NUL-terminated) and its length in *len.
 * Returns the HTTP status, or a negative dprec_status if no response arrived. */
int fleet_conn_call(fleet_conn *c, int admin, const char *method, const char *path, const char *bearer,
                    const char *content_type, const void *req_body, size_t req_len, unsigned char **body,
                    size_t *len);

/* Finalizes the open round of the job now (admin round/close; in-process falls back to the clock). */
int fleet_conn_close_round(fleet_conn *c, uint64_t job, char *err, size_t errcap);

/* A short description ("in-process", "https://127.0.0.1:40211 (started by the fleet)"). */
const char *fleet_conn_describe(const fleet_conn *c);

#endif /* DPREC_FLEET_H */
