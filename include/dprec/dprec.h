/* dprec — the device SDK: keep a user's ratings on the device, and turn released item profiles V into a
 * user vector and recommendations locally.
 *
 * Memory: the SDK allocates only at dprec_client_init, from memory the app hands over (a buffer) or through
 * the app's allocator hooks under a hard cap; never afterwards on the rate/recommend paths. Peak use is
 * dprec_client_required_size(cfg) and never more than DPREC_CLIENT_MEMORY_BOUND(d, capacity, max_k).
 * Threads: none. A client is not thread-safe; two clients share nothing in memory (there are no globals), but
 * one store (port and store name) takes one client at a time: the first dprec_store_load locks it through the
 * port until dprec_client_free, and a second client is refused (DPREC_ERR_STORE_LOCKED), in this process or
 * another, since each would save its own view over the other's ratings and ledger charges.
 * Every function returns a dprec_status (0 = success, negative = error; see dprec/status.h). */
#ifndef DPREC_DPREC_H
#define DPREC_DPREC_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/export.h"
#include "dprec/platform.h"
#include "dprec/privacy.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "dprec/version.h"

DPREC_BEGIN_DECLS

/* The fixed part of a client (its struct, the CSPRNG and AES-GCM contexts, the stream reader, the sync state: a
 * 4 KiB JSON response buffer and its tokens, and the last failure's detail), rounded up. A test holds sizeof of the
 * real fixed part under this constant. */
#define DPREC_CLIENT_FIXED_BYTES 13312u

/* An upper bound on a client's memory, in bytes, for latent dimension d, rating capacity cap, largest
 * top-K k, ledger lines jobs, pending-report slots slots and largest report rbytes (docs/sdk.md derives it):
 *   fixed part                                   DPREC_CLIENT_FIXED_BYTES
 *   ratings, sorted by item                      16 * cap
 *   normal equations (double), user vectors      8 * d * d + 8 * d + 8 * d  (u, and u_pred for the shrinkage)
 *   the fit's scratch: 16 rows of d doubles     128 * d  (its blocked accumulation, common/linalg.c)
 *   gauss-gd's gradient-mode state               16 + 12 * d (+ 15 alignment)
 *   rows of the rated items kept by a fit        4 * cap * (d + 1), and their shrinkage: 8 * cap
 *   top-K heap                                   8 * k
 *   ledger lines                                 88 * jobs
 *   pending reports (40-byte header, 8-aligned)  slots * (rbytes + 47)
 *   store file image: header, sections, trailer  16 * cap + 88 * jobs + slots * (rbytes + 47) + 464
 *                                                (464: header 48, section headers and prefixes 48, trailer 32,
 *                                                the sync section 176 with a relay registration,
 *                                                the trusted release's 112, and slack)
 *   alignment slack                              16 per block, 10 blocks, the arena's start, and the shrinkage's
 *                                                part of the rows' block */
#define DPREC_CLIENT_MEMORY_BOUND_EX(d, cap, k, jobs, slots, rbytes)                                        \
    ((size_t)DPREC_CLIENT_FIXED_BYTES + 40u * (size_t)(cap) + 4u * (size_t)(cap) * ((size_t)(d) + 1u) +  \
     8u * (size_t)(d) * (size_t)(d) +                                                                      \
     156u * (size_t)(d) + 8u * (size_t)(k) + 176u * (size_t)(jobs) + 2u * (size_t)(slots) * ((size_t)(rbytes) + 47u) + \
     464u + 192u + 32u)

/* The extra memory of a client that keeps private-fw state (cfg.fw_max_ratings = xi > 0; 0 costs nothing):
 * the state in memory (a 24-byte header, xi item ids and d coefficients, 4 bytes each, and scratch for a
 * build: xi staged item ids and 3 xi floats; 15 bytes of alignment) and its store section in the file image
 * (8-byte section header, 32-byte prefix, 4 xi + 4 d bytes). */
#define DPREC_CLIENT_FW_BYTES(d, xi) ((xi) ? 24u * (size_t)(xi) + 8u * (size_t)(d) + 80u : (size_t)0)

/* The extra memory of a client that can take part in secure aggregation (cfg.secagg_max_len = n > 0; 0 costs
 * nothing): the round's secrets, the phase messages' buffer, the parsed inbox, the neighbours' identities and the
 * reader that checks the aggregator's lists as they stream in (43008 bytes, a _Static_assert in sdk/secure.c), n
 * doubles of input and 4 words of scratch per coordinate of the rotated vector, whose length is the power of two
 * D >= n (< 2n), 16 bytes of alignment. */
#define DPREC_CLIENT_SECAGG_BYTES(n) ((n) ? 43008u + 8u * (size_t)(n) + 64u * (size_t)(n) + 32u : (size_t)0)

/* The bound with the default ledger and report settings (8 jobs, 1 pending slot, 4096-byte reports). */
#define DPREC_CLIENT_MEMORY_BOUND(d, cap, k) DPREC_CLIENT_MEMORY_BOUND_EX(d, cap, k, 8u, 1u, 4096u)

typedef struct dprec_config {
    uint32_t struct_size;     /* sizeof(dprec_config) as the app was compiled (dprec_config_default sets it) */
    uint32_t num_items;       /* m, the catalogue size; item ids are 0 .. m-1 (1 .. DPREC_MAX_ITEMS) */
    uint32_t dim;             /* d, the latent dimension (1 .. DPREC_MAX_DIM) */
    uint32_t rating_capacity; /* the most ratings the store holds (1 .. 1,000,000) */
    uint32_t max_k;           /* the largest K dprec_recommend will be asked for (1 .. 10,000) */
    float rating_min;         /* the rating scale; values outside it are refused */
    float rating_max;
    float lambda;             /* ridge of the least-squares user vector; > 0 (default 0.1) */
    const char *store_name;   /* prefix of the store's files in the port (default "dprec-ratings") */
    int encrypt_at_rest;      /* 1: AES-256-GCM under the key from port->get_storage_key */
    /* The privacy ledger (dprec/privacy.h). Caps are per unit, over all jobs; 0 (the default) allows no
     * private report at that unit, so an app must choose its users' budget explicitly. */
    double cap_user_epsilon, cap_user_delta;
    double cap_rating_epsilon, cap_rating_delta;
    int allow_non_private;     /* 1 lets model-NONE (`plain` protocol) reports leave the device */
    uint32_t ledger_jobs;      /* ledger lines, one per job ever reported to (default 8, 1 .. 4096) */
    uint32_t pending_slots;    /* reports stored until acknowledged (default 1, 1 .. 64) */
    uint32_t max_report_bytes; /* the largest report (default 4096, 16 .. 16 MiB) */
    /* private-fw (seed 002, joint DP): the most ratings xi a job may ask the device to sample and keep its
     * predictions for (0, the default: the device keeps no private-fw state and refuses such jobs; at most
     * 65535). The client then needs DPREC_CLIENT_FW_BYTES(d, xi) more memory. */
    uint32_t fw_max_ratings;
    /* sgld (seed 003, posterior sampling by a trusted curator, which receives the ratings themselves): the most
     * ratings the device uploads to such a curator (0, the default: it refuses sgld jobs; at most 65535; a job's tau
     * above it is refused), and the device's own epsilon_i for them (0: the job's epsilon). The device sets its
     * weight from epsilon_i so that its guarantee is epsilon_i, and charges epsilon_i (at most the job's epsilon) to
     * its ledger (docs/privacy.md "sgld"). */
    uint32_t sgld_max_ratings;
    double sgld_epsilon;
    /* Secure aggregation (`params.aggregation: "secure"` of gauss-gd and dpals; docs/privacy.md "Secure
     * aggregation"): the longest vector such a job may ask the device to encode and mask (gauss-gd: m (d + 1); dpals:
     * m (d (d + 1) / 2 + d)). 0, the default: the device keeps no room for it and refuses such jobs
     * (DPREC_ERR_CONFIG). At most 2^24. The client then needs DPREC_CLIENT_SECAGG_BYTES(n) more memory. */
    uint32_t secagg_max_len;
    /* Always 0 (added in 0.3, never read): it fills what was the tail padding of the 0.2 layout, so that the fields
     * after it lie past every 0.2 app's struct_size and such an app gets their defaults. */
    uint32_t reserved_0_3;
    /* Secure aggregation against an active server (added in 0.3; docs/privacy.md "Secure aggregation"): the fewest
     * colluding enrolled devices a secure round must tolerate before the server, with them, could recover both of
     * this device's secrets and unmask its input. With k neighbours and threshold t a round tolerates 2t - k - 1
     * (the server needs 2t shares, an honest neighbour reveals one): a job whose plan tolerates fewer is refused
     * (DPREC_ERR_JOB_PARAMS), and so is a round whose neighbour list, as the server sends it, does. Default 1 (also
     * for an app built with 0.2 headers); 0 accepts any plan whose threshold exceeds half the neighbours; at most 63.
     * What a colluding device is, and why that count is exact: docs/privacy.md. */
    uint32_t secagg_min_colluders;
} dprec_config;

/* Fills the size bytes at *cfg with defaults: d = 16, capacity = 1000, max_k = 100, scale [1, 5], lambda = 0.1,
 * 8 ledger lines, 1 pending slot of 4096 bytes, privacy caps 0 (no private report); num_items is left 0 and must
 * be set. Sets struct_size to size (the app's sizeof). DPREC_ERR_STRUCT_SIZE (nothing written) for a size this
 * library cannot fill. Call it through dprec_config_default, which passes the app's sizeof. */
DPREC_API int dprec_config_default_sized(dprec_config *cfg, size_t size);
static inline void dprec_config_default(dprec_config *cfg) {
    (void)dprec_config_default_sized(cfg, sizeof *cfg);
}

/* Bytes of memory a client with this configuration needs (0 if cfg is invalid). */
DPREC_API size_t dprec_client_required_size(const dprec_config *cfg);

/* Allocator hooks: alloc(user, size) returns memory aligned for any type or NULL; free(user, ptr).
 * The SDK never asks for more than cap bytes in total. Fill with DPREC_STRUCT_INIT(&a) first. */
typedef struct dprec_allocator {
    uint32_t struct_size; /* sizeof(dprec_allocator) as the app was compiled (0: the 0.2.0 layout) */
    void *(*alloc)(void *user, size_t size);
    void (*free)(void *user, void *ptr);
    void *user;
    size_t cap;
} dprec_allocator;

typedef struct dprec_client dprec_client; /* opaque */

/* Creates a client inside mem[0 .. mem_size) (at least dprec_client_required_size(cfg) bytes, any
 * alignment). The app owns mem and must keep it alive until dprec_client_free. cfg and its strings are
 * copied; port is copied (its ctx must outlive the client). Seeds the CSPRNG, and fetches the storage
 * key when encrypt_at_rest is set. Does not touch the store: call dprec_store_load next. */
DPREC_API int dprec_client_init(dprec_client **out, const dprec_config *cfg, const dprec_port *port, void *mem,
                                size_t mem_size);

/* The same, with memory from the app's allocator hooks (copied). */
DPREC_API int dprec_client_init_with_allocator(dprec_client **out, const dprec_config *cfg,
                                               const dprec_port *port, const dprec_allocator *alloc);

/* Wipes keys and state, and returns hook-allocated memory. NULL is a no-op. */
DPREC_API void dprec_client_free(dprec_client *c);

/* Bytes the client took from its arena or hooks (its peak; it never grows after init). */
DPREC_API size_t dprec_client_memory_used(const dprec_client *c);

/* ---- diagnostics: why the last call failed ------------------------------------------------------------------
 *
 * Every function that takes a client and returns a dprec_status starts by forgetting the previous call's
 * diagnostics (its cause and detail), and on failure leaves what it knows: so after a call that failed they are
 * that call's, and after one that succeeded they are empty (a sync whose outcome is DPREC_SYNC_RETRY_LATER keeps
 * the transient failure's). Functions that return a count or a size, and the getters below, change nothing. The
 * diagnostics are the one part of a client that a call through a const pointer writes (the client lives in the
 * app's writable memory); a client is not thread-safe anyway. */

/* The native cause of the last call's failure (errno from the port, or an mbedTLS code), 0 if none. */
DPREC_API int dprec_client_last_cause(const dprec_client *c);

#define DPREC_ERROR_REQUEST_MAX 96u  /* dprec_error_info.request, NUL included */
#define DPREC_ERROR_CODE_MAX 48u     /* dprec_error_info.server_code, NUL included */
#define DPREC_ERROR_MESSAGE_MAX 256u /* dprec_error_info.message, NUL included */

/* The detail of the last call's failure (like SQLite's sqlite3_errmsg, libcurl's CURLOPT_ERRORBUFFER). Each
 * string is NUL-terminated, cut to its array, printable ASCII only (a server's text is filtered), "" if unknown. */
typedef struct dprec_error_info {
    uint32_t struct_size; /* sizeof(dprec_error_info) as the app was compiled (DPREC_STRUCT_INIT) */
    int cause;            /* as dprec_client_last_cause */
    /* dprec_client_sync: the HTTP status of the answer that made the call fail or retry (>= 300), 0 if none did
     * (no answer at all: see message) */
    int http_status;
    /* dprec_client_sync: the last request it made, "GET /v1/jobs/99" ("relay " in front for a relay's) */
    char request[DPREC_ERROR_REQUEST_MAX];
    /* the aggregator's (or relay's) error code from its answer {"error": code, "message": text}, e.g.
     * "not_found", "budget_exhausted" (docs/protocol.md lists them) */
    char server_code[DPREC_ERROR_CODE_MAX];
    /* what went wrong, from whoever knows best: the server's message ("unknown job"), the transport's text for a
     * request that got no answer (the TLS library's: "the server's public key matches no pinned key"), or the
     * SDK's own reason, e.g. which of the causes of DPREC_ERR_STATE this is ("a fit stream is open ...") */
    char message[DPREC_ERROR_MESSAGE_MAX];
} dprec_error_info;

/* Fills *out (its struct_size set by the app: DPREC_STRUCT_INIT) with the last call's failure detail. Returns
 * DPREC_OK, DPREC_ERR_INVALID_ARGUMENT (NULL) or DPREC_ERR_STRUCT_SIZE. Changes nothing in the client. */
DPREC_API int dprec_client_last_error_info(const dprec_client *c, dprec_error_info *out);

/* The same detail as one line of text for a log or a bug report, e.g.
 *   "GET /v1/jobs/99: HTTP 404 not_found: unknown job"
 *   "GET /v1/jobs/7: the server's public key matches no pinned key"
 *   "a fit stream is open (dprec_fit_begin): end it with dprec_fit_end"
 * ("" if the last call did not fail), NUL-terminated into buf[0 .. len) and cut to fit. Returns the length the
 * whole line has (as snprintf: a result >= len means it was cut). buf may be NULL when len is 0. */
DPREC_API size_t dprec_client_last_error_detail(const dprec_client *c, char *buf, size_t len);

/* Random bytes from the client's CSPRNG (mbedTLS CTR_DRBG, AES-256, reseeded by the library's policy). */
DPREC_API int dprec_client_random(dprec_client *c, void *out, size_t len);

/* ---- the local rating store ------------------------------------------------------------------------ */

typedef struct dprec_rating {
    uint32_t item;
    float value;
    int64_t timestamp; /* seconds since the Unix epoch */
} dprec_rating;

/* Timestamp value that asks the SDK to use the port's wall clock. */
#define DPREC_TIMESTAMP_NOW INT64_MIN

/* Loads the newest good generation of the store (ratings, privacy ledger, pending reports). The first load
 * takes the store's lock from the port (platform.h) and the client keeps it until dprec_client_free: while
 * another client holds it this returns DPREC_ERR_STORE_LOCKED, reads nothing and leaves writes refused (call
 * again later). The store keeps two generations. No files yet is DPREC_OK with an empty store. If a generation is refused, this returns
 * why (DPREC_ERR_STORE_CORRUPT, _TRUNCATED, _VERSION, _KEY, _MISMATCH, or an I/O error) and the client holds
 * the newest good generation, or nothing. Writes (put, remove, reports) are allowed only after a load that
 * returned DPREC_OK, _CORRUPT or _TRUNCATED: after any other refusal a newer good generation may exist that a
 * write could destroy, so they return DPREC_ERR_STATE until a load succeeds. If every generation was damaged,
 * the privacy ledger is unknown and reports return DPREC_ERR_LEDGER_LOST (dprec_ledger_reset_after_loss). */
DPREC_API int dprec_store_load(dprec_client *c);

/* Writes the current state again (both ledger and ratings), e.g. to retry after dprec_report_prepare
 * returned an I/O error for its mirror copy. */
DPREC_API int dprec_store_flush(dprec_client *c);

/* Adds or updates the rating of item. Durable on DPREC_OK (written, fsynced, renamed). On any error the
 * store in memory is unchanged and so is storage, except after an I/O error at the rename stage, which a port
 * may have applied before failing: then writes are refused until dprec_store_load re-reads the truth. */
DPREC_API int dprec_store_put(dprec_client *c, uint32_t item, float value, int64_t timestamp);

/* Adds or updates n ratings at once (an imported history), in order, so that a later rating of the same item
 * wins, and writes the store once: durable on DPREC_OK. Each rating is checked as dprec_store_put checks it
 * before anything changes (a bad one is refused with its status and nothing is written). If the store fills up
 * (DPREC_ERR_STORE_FULL) or the write fails, the client reads back its last durable generation, the state
 * before the call; if that read fails too, writes are refused until dprec_store_load succeeds. n puts cost n
 * writes of the whole store; this costs one. */
DPREC_API int dprec_store_put_many(dprec_client *c, const dprec_rating *ratings, uint32_t n);

/* Removes the rating of item (DPREC_ERR_NOT_RATED if there is none). Durable on DPREC_OK. */
DPREC_API int dprec_store_remove(dprec_client *c, uint32_t item);

/* Looks up the rating of item into *out (DPREC_ERR_NOT_RATED if none). */
DPREC_API int dprec_store_get(const dprec_client *c, uint32_t item, dprec_rating *out);

/* Number of ratings held. */
DPREC_API uint32_t dprec_store_count(const dprec_client *c);

/* The index-th rating in increasing item order (0 <= index < count): iterate with a for loop. */
DPREC_API int dprec_store_at(const dprec_client *c, uint32_t index, dprec_rating *out);

/* ---- releases: verified once, when they arrive ---------------------------------------------------------- */

/* A release is used only once it is verified: its digest, every value against the public bound, and the
 * aggregator's ECDSA P-256 signature over the digest under the key the app pinned (anyone can recompute a
 * digest; only the aggregator can sign). Verification is an explicit step, done once when a release arrives;
 * the client then holds it as its *trusted release* (one at a time: its header and digest, saved in the store)
 * and fit, recommend and predict accept exactly that release. On a buffer they check only its header and the
 * digest stored in it against the trusted one (O(1), no second SHA-256 pass: docs/sdk.md, "Verified once"), so
 * the app must keep the bytes where only it can change them (its private storage or memory) and verify again
 * anything it did not keep that way. dprec_client_sync verifies the round's release it fits by itself. */

/* How a release's origin is checked. Fill with dprec_verify_config_init, then set what you need: a later
 * version may add members, which init sets to their defaults. */
typedef struct dprec_verify_config {
    uint32_t struct_size; /* sizeof(dprec_verify_config) as the app was compiled (dprec_verify_config_init sets it) */
    /* The aggregator's release-signing public key (DER SubjectPublicKeyInfo, ECDSA P-256), pinned by the app;
     * what `dprec-aggregator serve` serves and prints. Borrowed for the call. */
    const unsigned char *release_key;
    size_t release_key_len;
    uint32_t flags; /* DPREC_VERIFY_* */
    /* Optional: the signature-check memo of dprec_sync_config (sync.h), for a host running many clients. */
    int (*verified_seen)(void *ctx, const unsigned char tag[32]);
    void (*verified_remember)(void *ctx, const unsigned char tag[32]);
    void *verified_ctx;
} dprec_verify_config;

/* Trust a release whose signature is not checked (an unsigned release, or any release when no key is given) on
 * its digest alone. For test data and offline demos only: anyone can forge such a release. A signature that
 * is checked (a key given, a signed release) must still verify. */
#define DPREC_VERIFY_INSECURE_UNSIGNED 0x0001u

/* Fills *vc with the defaults: no key, no flags, no memo, and struct_size. */
static inline void dprec_verify_config_init(dprec_verify_config *vc) {
    dprec_struct_init(vc, sizeof *vc);
}

/* Verifies a release held in memory (header, exact size, values, digest, then the signature under
 * vc->release_key) and makes it the client's trusted release. A loaded store (dprec_store_load) saves it, so
 * it stays trusted across restarts; on an I/O error nothing changes. Refused: the release's own errors
 * (DPREC_ERR_RELEASE_*, as dprec_release_check), DPREC_ERR_RELEASE_SIGNATURE (no signature, or one that does
 * not verify), DPREC_ERR_CONFIG (the key is not an EC P-256 public key), DPREC_ERR_RELEASE_MISMATCH (another
 * catalogue size, d or scale than the client's), DPREC_ERR_INVALID_ARGUMENT (no key and no
 * DPREC_VERIFY_INSECURE_UNSIGNED). On success fills *info (may be NULL). Checking the signature runs mbedTLS's
 * public-key code, which calloc()s a few KiB internally and frees it before returning (docs/sdk.md). */
DPREC_API int dprec_release_verify(dprec_client *c, const void *release, size_t len, const dprec_verify_config *vc,
                                   dprec_release_info *info);

/* The same over a stream (a download or a file read in chunks of any size): begin, feed, end. The trusted
 * release changes only if end succeeds. A feed that returns an error ends the stream (the release is refused;
 * writes, which a stream in progress refuses with DPREC_ERR_STATE, go on); an app that abandons a stream for its
 * own reasons (the download failed) ends it with dprec_verify_end, whose error it may ignore. */
DPREC_API int dprec_verify_begin(dprec_client *c);
DPREC_API int dprec_verify_feed(dprec_client *c, const void *chunk, size_t len);
DPREC_API int dprec_verify_end(dprec_client *c, const dprec_verify_config *vc, dprec_release_info *info);

/* The client's trusted release: its header fields and digest into *info. DPREC_ERR_NOT_FOUND if there is none.
 * *insecure (may be NULL) gets 1 if it was trusted without a signature check (DPREC_VERIFY_INSECURE_UNSIGNED). */
DPREC_API int dprec_release_trusted(const dprec_client *c, dprec_release_info *info, int *insecure);

/* ---- local computation on a release ------------------------------------------------------------------- */

/* Computes the user vector from the trusted release held in memory, by regularized least squares over the
 * user's rated items (Liu, Wang, Smola, RecSys 2015, eq. 5, with the release's biases subtracted):
 *   u = (lambda I + sum_j v_j v_j^T)^-1 sum_j (r_j - mu - b_j) v_j.
 * With no ratings u = 0 (predictions fall back to mu + b_j). Reads the header, the digest field and the rows
 * of the rated items only: O(n d^2 + d^3). DPREC_ERR_RELEASE_UNVERIFIED unless release is the client's trusted
 * release (its header and stored digest); DPREC_ERR_RELEASE_MISMATCH if it does not match the client's
 * catalogue size, d and scale; DPREC_ERR_RELEASE_VALUE if a value read is past the public bound (the bytes
 * changed since they were verified); DPREC_ERR_SINGULAR if the system is singular or its solution so large
 * that a prediction could not be represented (raise lambda). */
DPREC_API int dprec_fit(dprec_client *c, const void *release, size_t len);

/* The same, streaming: begin, feed chunks of any size, end. Every byte is hashed again (a stream cannot be
 * bound to the trusted release otherwise): end refuses a stream whose SHA-256 digest is not the trusted
 * release's (DPREC_ERR_RELEASE_UNVERIFIED). The user vector changes only if end succeeds. A feed that returns an
 * error ends the stream, as for verify (a later feed or end: DPREC_ERR_STATE). */
DPREC_API int dprec_fit_begin(dprec_client *c);
DPREC_API int dprec_fit_feed(dprec_client *c, const void *chunk, size_t len);
DPREC_API int dprec_fit_end(dprec_client *c);

/* Copies the current user vector (d floats) into out; DPREC_ERR_STATE before a successful fit. */
DPREC_API int dprec_user_vector(const dprec_client *c, float *out, uint32_t dim);

typedef struct dprec_recommendation {
    uint32_t item;
    float score; /* predicted rating mu + b_j + u.v_j, clamped to the rating scale */
} dprec_recommendation;

/* Fits the user vector on the trusted release held in memory (as dprec_fit), then writes the k best items the
 * user has not rated into out (best first; ties by lower item id) and their number into *n (< k only if fewer
 * items are unrated). 1 <= k <= cfg.max_k. Costs the fit and one scoring pass over the rows, O(m d + m log k):
 * the bytes are not hashed again. */
DPREC_API int dprec_recommend(dprec_client *c, const void *release, size_t len, uint32_t k,
                              dprec_recommendation *out, uint32_t *n);

/* Top-K streaming, after a successful fit on the same release (checked by its SHA-256 digest at end:
 * DPREC_ERR_RELEASE_MISMATCH for another release). A feed that returns an error ends the stream, as for verify. */
DPREC_API int dprec_topk_begin(dprec_client *c, uint32_t k);
DPREC_API int dprec_topk_feed(dprec_client *c, const void *chunk, size_t len);
DPREC_API int dprec_topk_end(dprec_client *c, dprec_recommendation *out, uint32_t *n);

/* The predicted rating of one item, from the fitted user vector and the trusted release held in memory, which
 * must be the fitted one (DPREC_ERR_RELEASE_UNVERIFIED, DPREC_ERR_RELEASE_MISMATCH). Reads the header, the
 * digest field and row `item` only: O(d), so a memory-mapped release file is read in three places. */
DPREC_API int dprec_predict(const dprec_client *c, const void *release, size_t len, uint32_t item, float *score);

/* private-fw (seed 002): the device's own row of predictions Y_i = sum_c g_c v_c, as the coefficients g
 * (dim floats) over the release's columns: the predicted rating of item j is offset + g . V_j, offset the
 * user's centre (dprec_fw_user_offset) with V_j the row of j in the job's latest release (docs/protocol.md, private-fw). The
 * prediction is for this user only (joint DP: it depends on their own ratings without noise; never send it).
 * DPREC_ERR_NOT_FOUND if the client keeps no state for job_id; dim must equal cfg.dim. */
DPREC_API int dprec_fw_user_vector(const dprec_client *c, uint64_t job_id, float *g, uint32_t dim);
/* private-fw: the centre of this user's predictions for job_id, used in place of the job's public offset above
 * (params.center "user", the default: the mean of the user's sampled ratings shrunk toward the public offset
 * with the weight of one rating; docs/protocol.md). DPREC_ERR_NOT_FOUND if the client keeps no state for the job
 * or the state predates the centre (then the job's public offset applies). */
DPREC_API int dprec_fw_user_offset(const dprec_client *c, uint64_t job_id, double *offset);

DPREC_END_DECLS

#endif /* DPREC_DPREC_H */
