/* dprec internal — the client object, shared by client.c, store.c and recommend.c. */
#ifndef DPREC_CLIENT_PRIV_H
#define DPREC_CLIENT_PRIV_H

#include <stdint.h>

#include "alloc.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "json.h"
#include "topk.h"

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

/* One ledger line, in memory (48 bytes; the file stores the same fields). */
typedef struct ledger_line {
    uint64_t job_id;
    uint64_t last_round;
    double epsilon;
    double delta;
    uint32_t reports;
    uint8_t unit;
    uint8_t model;
    uint16_t reserved;
    uint32_t reserved2;
} ledger_line;

/* Sync state (sync.c). The registration and the participation decisions are durable (store section 4);
 * backoff and the response buffer live in memory only. */
#define DPREC_SYNC_TOKEN_LEN 64u        /* the device token: 64 hex characters */
#define DPREC_SYNC_MEMO 4u              /* (job, round) participation decisions remembered, newest first */
#define DPREC_SYNC_RESPONSE_MAX 4096u   /* the largest JSON response read (the aggregator's JSON cap) */
#define DPREC_SYNC_JSON_TOKENS 96u      /* tokens of the largest JSON response parsed */
#define DPREC_SYNC_MEMO_PARTICIPATE 1u
#define DPREC_SYNC_MEMO_SIT_OUT 2u

typedef struct sync_memo {
    uint64_t job_id;
    uint64_t round;
    uint32_t decision; /* 0: empty slot, DPREC_SYNC_MEMO_PARTICIPATE or DPREC_SYNC_MEMO_SIT_OUT */
    uint32_t reserved;
} sync_memo;

typedef enum stream_mode { STREAM_NONE = 0, STREAM_FIT = 1, STREAM_TOPK = 2 } stream_mode;

struct dprec_client {
    dprec_heap heap; /* first: dprec_client_free copies it out before releasing */
    dprec_config cfg;
    char store_name[DPREC_STORE_NAME_MAX];
    dprec_port port;
    int last_cause;

    dprec_rng rng;
    dprec_gcm gcm; /* keyed only when cfg.encrypt_at_rest */

    /* store */
    dprec_rating *ratings; /* sorted by item, count of them valid */
    uint32_t count;
    uint64_t generation;   /* of the state held in memory (0: never saved) */
    int loaded;            /* a load established what storage holds: writes allowed */
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
    double *a; /* d*d normal equations */
    double *b; /* d */
    float *u;  /* d: the fitted user vector */
    /* gauss-gd with params.u_update "gradient" (protocol_gauss.c): the user vector kept across the job's rounds
     * and moved by seed 001's gradient step once per round (memory only: a restart starts it again), the job
     * and round of its last step (gu_job 0: none), and d doubles of scratch for the gradient (also the scratch
     * row of the fit's QR fallback, recommend.c: neither use keeps anything in it). */
    float *gu;
    uint64_t gu_job, gu_round;
    double *gu_grad;
    int fitted;
    unsigned char fitted_digest[DPREC_RELEASE_DIGEST_SIZE];
    float fitted_mu;
    /* The release rows of the rated items, kept by the last fit: for ratings[i], rows[i (d+1) .. + d) is v_j
     * and rows[i (d+1) + d] is b_j (rating_capacity (d+1) floats). Valid while fitted and the ratings are
     * unchanged; the private protocols' gradients need them once u is known (sdk/protocol_*.c). */
    float *rows;

    /* private-fw state of one job (protocol_fw.c; store section 5), when cfg.fw_max_ratings > 0: the job, the
     * last round whose local step was applied, the sampled items (fw_n <= fw_max_ratings, increasing) and the
     * coefficients g (cfg.dim floats) of the row Y_i over the release's columns. fw_job 0: no state. */
    uint64_t fw_job;
    uint64_t fw_round;
    uint32_t fw_n;
    uint32_t *fw_items;
    float *fw_g;
    float *fw_scratch; /* 3 fw_max_ratings floats for the local step */

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
    sync_memo memo[DPREC_SYNC_MEMO];
    uint32_t sync_failures;               /* consecutive transient failures, for the backoff (memory only) */
    size_t resp_len;
    int resp_overflow;
    unsigned char resp[DPREC_SYNC_RESPONSE_MAX]; /* JSON responses only: releases are streamed */
    dprec_json_token json[DPREC_SYNC_JSON_TOKENS];
    unsigned char release_head[DPREC_RELEASE_HEADER_SIZE]; /* a streamed release's header and signature */
    unsigned char release_sig[DPREC_RELEASE_MAX_SIG];
    uint64_t release_got;
};

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

/* The private-fw section of the store file (protocol_fw.c): non-critical (a reader that drops it only loses
 * accuracy, never privacy: the aggregator bounds every report itself). */
#define DPREC_SECTION_FW 5u
size_t dprec_fw_section_max(const dprec_config *cfg);
size_t dprec_fw_state_bytes(const dprec_config *cfg);
unsigned char *dprec_fw_encode(const dprec_client *c, unsigned char *p);
int dprec_fw_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
void dprec_fw_reset(dprec_client *c);

/* The sync section of the store file (sync.c): registration and participation decisions. */
#define DPREC_SECTION_SYNC 4u
size_t dprec_sync_section_max(void);
unsigned char *dprec_sync_encode(const dprec_client *c, unsigned char *p);
int dprec_sync_decode(dprec_client *c, const unsigned char *d, uint32_t len, int commit);
/* Forgets the registration and decisions in memory (before a load). */
void dprec_sync_reset(dprec_client *c);

#endif /* DPREC_CLIENT_PRIV_H */
