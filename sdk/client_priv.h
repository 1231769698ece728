/* dprec internal — the client object, shared by client.c, store.c and recommend.c. */
#ifndef DPREC_CLIENT_PRIV_H
#define DPREC_CLIENT_PRIV_H

#include <stdint.h>

#include "alloc.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "json.h"
#include "topk.h"
#include "config_check.h"

#define DPREC_STORE_NAME_MAX 48 /* prefix + ".tmp" must fit DPREC_PORT_NAME_MAX */
#define DPREC_MAX_CAPACITY 1000000u
#define DPREC_MAX_K 10000u

/* Store file v1: header, payload of sections, trailer (see store.c for the byte layout). */
#define DPREC_STORE_HEADER_SIZE 48u
#define DPREC_STORE_SECTION_HEADER 8u
#define DPREC_STORE_RATINGS_PREFIX 8u
#define DPREC_STORE_RECORD_SIZE 16u
#define DPREC_STORE_TRAILER_MAX 32u

#define DPREC_MAX_LEDGER_JOBS 4096u
#define DPREC_MAX_PENDING_SLOTS 64u
#define DPREC_MAX_REPORT_BYTES (16u << 20)
#define DPREC_PENDING_HEADER 40u /* id 16, job 8, round 8, len 4, reserved 4 */

/* One ledger line, in memory (88 bytes; the file stores the same fields, ledger.c). state says what the device
 * decided for last_round: */
#define DPREC_LINE_TAKE_PART 1u /* drew "take part" (Poisson sampling); nothing charged for that round yet */
#define DPREC_LINE_SAT_OUT 2u   /* drew "sit out" (charged if the job's accounting charges sit-outs) */
#define DPREC_LINE_REPORTED 3u  /* a report for last_round is stored and charged */
typedef struct ledger_line {
    uint64_t job_id;
    uint64_t last_round;
    double epsilon, delta;           /* cumulative, at the job's unit */
    double user_epsilon, user_delta; /* cumulative, at user level */
    uint32_t reports;
    uint32_t rounds;                 /* rounds charged */
    uint64_t max_rounds;             /* 0: no limit */
    uint8_t unit;
    uint8_t model;
    uint8_t state;
    uint8_t reserved;
    uint32_t reserved2;
    unsigned char pin[DPREC_JOB_PIN_SIZE];
} ledger_line;

/* Sync state (sync.c). The registration is durable (store section 4); backoff and the response buffer live
 * in memory only. Participation decisions live in the ledger (one line per job, never evicted). */
#define DPREC_SYNC_TOKEN_LEN 64u        /* the device token: 64 hex characters */
#define DPREC_SYNC_RESPONSE_MAX 4096u   /* the largest JSON response read (the aggregator's JSON cap) */
#define DPREC_SYNC_JSON_TOKENS 160u     /* tokens of the largest JSON response parsed (a secure job's view: about 110) */

/* The most protocols with state (protocol.h, dprec_proto_state) a build can have; sdk/protocols/table.c checks. */
#define DPREC_MAX_PROTOCOLS 16u

typedef enum stream_mode { STREAM_NONE = 0, STREAM_FIT = 1, STREAM_TOPK = 2, STREAM_VERIFY = 3 } stream_mode;

/* The client's trusted release (verify.c): the one release fit, recommend and predict accept, verified once
 * (digest and signature) when it arrived; kept in store section DPREC_SECTION_TRUST. */
#define DPREC_TRUST_SIGNED 1u   /* its signature verified under the app's pinned key */
#define DPREC_TRUST_INSECURE 2u /* trusted on its digest alone (DPREC_VERIFY_INSECURE_UNSIGNED) */
typedef struct trusted_release {
    uint32_t how; /* 0: none, or DPREC_TRUST_* */
    unsigned char head[DPREC_RELEASE_HEADER_SIZE];
    unsigned char digest[DPREC_RELEASE_DIGEST_SIZE];
} trusted_release;

/* The last call's failure detail (diag.c; dprec_client_last_error_info). tee keeps the first bytes of the answer
 * to the request in flight (sync), whatever its sink does with them, so that an error body's code and message can
 * be read whichever buffer the answer went to. */
#define DPREC_DIAG_TEE 512u
typedef struct dprec_diag {
    int http_status;
    char request[DPREC_ERROR_REQUEST_MAX];
    char code[DPREC_ERROR_CODE_MAX];
    char message[DPREC_ERROR_MESSAGE_MAX];
    int hold;       /* inside dprec_client_sync: the SDK's own calls of public functions do not start over */
    size_t tee_len;
    unsigned char tee[DPREC_DIAG_TEE];
} dprec_diag;

/* Why writes are refused (!loaded), for DPREC_ERR_STATE's text: 0 no load yet, a load's refusal (its status), or: */
#define DPREC_UNLOADED_RENAME 1 /* a save failed at its rename: storage may hold either generation */

struct dprec_client {
    dprec_heap heap; /* first: dprec_client_free copies it out before releasing */
    dprec_config cfg;
    char store_name[DPREC_STORE_NAME_MAX];
    dprec_port port;
    int last_cause;
    dprec_diag diag;
    int unloaded_why;

    dprec_rng rng;
    dprec_gcm gcm; /* keyed only when cfg.encrypt_at_rest */

    /* store */
    dprec_rating *ratings; /* sorted by item, count of them valid */
    uint32_t count;
    uint64_t generation;   /* of the state held in memory (0: never saved) */
    int loaded;            /* a load established what storage holds: writes allowed */
    void *store_lock;      /* the port's lock on the store, held from the first load to dprec_client_free */
    int store_locked;
    unsigned char *image;  /* file image buffer, image_cap bytes */
    size_t image_cap;

    /* privacy ledger and pending reports (ledger.c) */
    ledger_line *ledger;        /* cfg.ledger_jobs lines, ledger_count used */
    uint32_t ledger_count;
    unsigned char *pending;     /* cfg.pending_slots slots of pending_stride bytes, pending_count used, oldest first */
    size_t pending_stride;
    uint32_t pending_count;
    uint32_t pending_skip;      /* a slot left out of the next save (being acknowledged), or UINT32_MAX */
    int ledger_lost;            /* every generation was damaged: spending unknown, reports blocked */
    int mirror_needed;          /* a charge is in the newest generation only: pending bytes withheld */

    /* local step */
    double *a;       /* d*d normal equations */
    double *b;       /* d */
    double *scratch; /* DPREC_GRAM_SCRATCH(d) doubles: a block of rows for the fit's accumulation, the scratch row of
                      * its QR fallback, u in doubles for a top-K (recommend.c); holds nothing between calls */
    float *u;        /* d: the fitted user vector: the least squares on the release as published (the protocols' reports
                      * are built from it) */
    float *u_pred;   /* d: the user vector predictions use: u, or with a release that carries its items' uncertainty
                      * (release format 3) the least squares on the shrunk release (recommend.c, "Shrinkage") */
    int fitted;
    int fitted_shrinks;      /* the fitted release carries an uncertainty column: predictions shrink */
    uint32_t fitted_pinned;  /* the leading coordinates of v_j its shrinkage leaves alone */
    unsigned char fitted_digest[DPREC_RELEASE_DIGEST_SIZE];
    float fitted_mu;
    trusted_release trusted;
    /* The release rows of the rated items, kept by the last fit: for ratings[i], rows[i (d+1) .. + d) is v_j
     * and rows[i (d+1) + d] is b_j (rating_capacity (d+1) floats). Valid while fitted and the ratings are
     * unchanged; the private protocols' gradients need them once u is known (sdk/protocols/). */
    float *rows;
    /* For ratings[i], keep[2 i] and keep[2 i + 1]: the release's shrinkage of that item's bias and of its v_j
     * (dprec_item_uncertainty), kept by the last fit with the rows (rating_capacity pairs). */
    float *keep;
    int fit_shrinks; /* set while a fit reads a release with an uncertainty column */
    /* Set by sync.c while it builds the data-independent fallback report (protocol.h, build): the protocols
     * then see no ratings and u = 0 and must not change their durable state. */
    int fallback;

    /* Each protocol's state (protocol.h, dprec_proto_state), in the order of dprec_protocols[]: memory of the
     * arena the protocol lays out itself (NULL: none in this configuration). */
    unsigned char *proto_state[DPREC_MAX_PROTOCOLS];
    /* Secure aggregation's area (sdk/secure.h; NULL when cfg.secagg_max_len is 0), after the protocols' state. */
    unsigned char *secure;

    /* streaming over a release */
    stream_mode stream;
    dprec_release_reader reader;
    dprec_recommendation *topk_slots; /* max_k */
    dprec_topk topk;
    uint32_t cursor; /* rated-item cursor: rows arrive in item order, ratings are sorted */

    /* sync with the aggregator (sync.c) */
    int registered;
    uint64_t device_id;
    char token[DPREC_SYNC_TOKEN_LEN + 1]; /* NUL-terminated when registered */
    uint32_t sync_failures;               /* consecutive transient failures, for the backoff (memory only) */
    /* the registration with a relay (sync_relay.c; durable in the sync section), for jobs that report through one */
    int relay_registered;
    uint64_t relay_device_id;
    char relay_token[DPREC_SYNC_TOKEN_LEN + 1];
    /* the device's identity key (identity.c; durable in section 34): the scalar, and its public key once computed */
    int has_identity, identity_pk_ready;
    unsigned char identity_sk[32];
    unsigned char identity_pk[65];
    const unsigned char *enroll_token; /* the app's enrollment token, for the duration of a sync call (sync.c) */
    size_t enroll_token_len;
    const struct dprec_sync_config *sync_cfg; /* the call's configuration, the same (sync_secure.c: the app's enrollment
                                               * key, the host's memo of signature checks) */
    size_t resp_len;
    int resp_overflow;
    unsigned char resp[DPREC_SYNC_RESPONSE_MAX]; /* JSON responses only: releases are streamed */
    dprec_json_token json[DPREC_SYNC_JSON_TOKENS];
    /* a streamed release's header and signature, kept as the stream passes (verify.c, capture) */
    unsigned char release_head[DPREC_RELEASE_HEADER_SIZE];
    unsigned char release_sig[DPREC_RELEASE_MAX_SIG];
    uint64_t release_got;
    uint64_t release_sig_start;
    uint32_t release_sig_len;
    int release_head_ok;
};

struct dprec_transport;

/* ---- diagnostics (diag.c) ---------------------------------------------------------------------------------
 * Every public function that takes a client and returns a status calls dprec_diag_begin first: the previous call's
 * cause and detail are forgotten (not inside a sync, whose own calls of public functions keep the sync's). The
 * detail is written through a const client too (diag.c says why that is sound). */
void dprec_diag_begin(const dprec_client *c);
/* Forgets the detail and the cause, whatever the hold. */
void dprec_diag_clear(const dprec_client *c);
/* Sets the detail's message to a, b and c joined (NULL parts skipped) and returns status. */
int dprec_diag_fail(const dprec_client *c, int status, const char *a, const char *b, const char *d);
/* DPREC_ERR_STATE because a stream is open (or the wrong one): the text names it and how to end it. */
int dprec_diag_stream(const dprec_client *c);
/* DPREC_ERR_STATE because the store takes no writes (!loaded): never loaded, held by another client, a load
 * refused, a rename failed. */
int dprec_diag_unloaded(const dprec_client *c);
/* DPREC_ERR_RELEASE_MISMATCH, the text saying what differs: the release's m and d (and scale) against the client's. */
int dprec_diag_mismatch(const dprec_client *c, const dprec_release_info *info);
/* DPREC_ERR_STATE because there is no user vector yet. */
int dprec_diag_unfitted(const dprec_client *c);
/* Sync: a request starts (its line, "relay " prefixed when relay), the tee emptied. */
void dprec_diag_request(dprec_client *c, const char *method, const char *path, int relay);
/* Sync: the sink wrapper's copy of an answer's first bytes. */
void dprec_diag_tee(dprec_client *c, const unsigned char *chunk, size_t len);
/* Sync: the request ended with transport status rc and HTTP status http (when rc is DPREC_OK): a refusal (>= 300)
 * keeps its status and the error body's code and message; no answer keeps the transport's text. */
void dprec_diag_answer(dprec_client *c, const struct dprec_transport *t, int rc, int http);

/* Sets c->last_cause from the port (for I/O errors) and passes status through. */
int dprec_client_port_error(dprec_client *c, int status);

/* Logs "dprec: <a><b>" through the port's optional log sink (no formatting library: sdk/ has no printf). */
void dprec_client_log(const dprec_client *c, dprec_log_level level, const char *a, const char *b);

/* Binary search in the sorted ratings: index of item, or -(insertion point) - 1. */
int64_t dprec_store_find(const dprec_client *c, uint32_t item);

/* Size of the store's file image for a configuration. */
size_t dprec_store_image_size(const dprec_config *cfg);

/* Writes the in-memory state as the next generation (store.c). */
int dprec_store_save(dprec_client *c);

/* Ledger and pending-report sections of the store file (ledger.c). encode writes the section (header
 * included) at p and returns the end; decode validates a section's data and, if commit, loads it. */
#define DPREC_SECTION_LEDGER 2u
#define DPREC_SECTION_PENDING 3u
size_t dprec_ledger_section_max(const dprec_config *cfg);
size_t dprec_pending_section_max(const dprec_config *cfg);
size_t dprec_pending_stride(const dprec_config *cfg);
unsigned char *dprec_ledger_encode(const dprec_client *c, unsigned char *p);
unsigned char *dprec_pending_encode(const dprec_client *c, unsigned char *p);
int dprec_ledger_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
int dprec_pending_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);

/* The ledger's line of job_id, or NULL. */
const ledger_line *dprec_ledger_line(const dprec_client *c, uint64_t job_id);
/* Whether dprec_report_prepare would accept this charge (the same checks, nothing written). */
int dprec_ledger_check(const dprec_client *c, const dprec_charge *ch);
/* Records the participation draw of (ch->job_id, ch->round) durably before it is acted on: decision
 * DPREC_LINE_TAKE_PART (nothing charged) or DPREC_LINE_SAT_OUT, charged with ch when charge is 1 (and then
 * written to both store generations, as a report's charge is). Refused as dprec_report_prepare refuses. */
int dprec_ledger_decide(dprec_client *c, const dprec_charge *ch, unsigned decision, int charge);

/* Protocol state in the store file (store.c walks dprec_protocols[]; the numbers in use: 1 ratings, 2 ledger,
 * 3 pending reports, 4 sync, 5 private-fw). */
#define DPREC_SECTION_FW 5u

/* The trusted release's store section (verify.c): non-critical (an SDK that does not know it drops it, and its
 * app verifies again). Numbered away from the protocols' sections (5 upwards). A compact release (format 2) is kept
 * in section 33 instead: an SDK of 0.1 would read its header as a damaged section 32 and call the store corrupt,
 * where it skips an unknown section 33. */
#define DPREC_SECTION_TRUST 32u
#define DPREC_SECTION_TRUST_COMPACT 33u
/* A release with columns (format 3) is kept in section 35, for the same reason: an SDK of 0.2 skips it (and its app
 * verifies again) rather than read a format-3 header in section 33 as damage. */
#define DPREC_SECTION_TRUST_COLUMNS 35u
size_t dprec_trust_section_max(void);
unsigned char *dprec_trust_encode(const dprec_client *c, unsigned char *p);
int dprec_trust_decode(dprec_client *c, uint16_t type, const unsigned char *d, uint32_t len, int commit);

/* Releases (verify.c). capture_reset/capture keep the header and the signature bytes of a release as it streams
 * past (the reader skips the signature). origin checks the signature of a release whose digest is known good
 * (info->digest) against vc: *how gets DPREC_TRUST_SIGNED or _INSECURE. */
void dprec_release_capture_reset(dprec_client *c);
void dprec_release_capture(dprec_client *c, const unsigned char *chunk, size_t len);
int dprec_release_origin(dprec_client *c, const dprec_verify_config *vc, const dprec_release_info *info,
                         const unsigned char *sig, uint32_t *how);
/* Ends a fit stream whose release the caller has verified itself (sync.c: digest, then signature): as
 * dprec_fit_end, without requiring it to be the trusted release. */
int dprec_fit_end_verified(dprec_client *c);

/* The sync section of the store file (sync.c): the registration. */
#define DPREC_SECTION_SYNC 4u
size_t dprec_sync_section_max(void);
unsigned char *dprec_sync_encode(const dprec_client *c, unsigned char *p);
int dprec_sync_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
/* Forgets the registration in memory (before a load). */
void dprec_sync_reset(dprec_client *c);

/* The device's identity key (identity.c; common/identity.h): its store section, numbered away from the others. */
#define DPREC_SECTION_IDENTITY 34u
size_t dprec_identity_section_max(void);
unsigned char *dprec_identity_encode(const dprec_client *c, unsigned char *p);
int dprec_identity_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
void dprec_identity_reset(dprec_client *c);
/* The identity, drawn and stored durably if the client has none (the store must be loaded: DPREC_ERR_STATE), and its
 * public key computed (c->identity_pk). */
int dprec_identity_ensure(dprec_client *c);
/* Signs the statement (label, msg) with the identity key (common/identity.h: dprec_identity_digest). */
int dprec_identity_sign_statement(dprec_client *c, const char *label, const void *msg, size_t len,
                                  unsigned char sig[64]);

#endif /* DPREC_CLIENT_PRIV_H */
