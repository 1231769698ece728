/* dprec internal — a device's part in a secure-aggregation job (`params.aggregation: "secure"` of gauss-gd and
 * dpals; docs/privacy.md "Secure aggregation", docs/protocol.md "Secure aggregation").
 *
 * The device never takes the noise plan on trust: it reads the published plan's integers (privacy.secagg), checks
 * them itself (common/ddg.c, dprec_ddg_plan_check: b holds the sum of n_max devices without wrapping; the RDP
 * recomputed from the integers at n_min survivors), checks the SecAgg+ parameters (k/2 < t <= k, n_min >= t and at
 * least DPREC_SECURE_MIN_SURVIVORS, the plan's length equal to the vector its protocol sends, the clip its
 * protocol's), and charges its ledger the distributed discrete Gaussian's RDP at the FEWEST survivors the round may
 * unmask (n_min: fewer shares, less noise), composed over the rounds by its own accountant. sync_secure.c runs the
 * round's steps (advertise, share, masked input, consistency, unmask) one per call as the aggregator's phase advances;
 * the round's secrets (common/secagg.h) live in memory only: a restart mid-round makes the device a dropout, which
 * the protocol tolerates, and the report path (dprec_report_prepare) still allows one masked input per round.
 *
 * Against an active server (docs/privacy.md "Secure aggregation"): the device signs its round keys, the neighbours it
 * masked with (in its masked input's report) and the survivor set with its identity key; it shares nothing unless
 * every neighbour's keys carry a valid signature by a distinct identity that is not its own (and, with the app's
 * enrollment key, an enrollment token of the app's for that identity: sdk/secure_check.c); it reveals nothing unless
 * the survivor set it signed was attested by max(t, n_min) distinct such identities and the requests agree with it,
 * and no neighbour's self-mask share unless that neighbour's signed list of the neighbours it masked with names it;
 * and it refuses a plan, or a neighbour list, that tolerates fewer colluding devices (2t - k - 1) than
 * cfg.secagg_min_colluders.
 *
 * Memory (cfg.secagg_max_len = n > 0; 0: secure jobs are refused with DPREC_ERR_CONFIG): the state below
 * (DPREC_SECURE_FIXED_BYTES), n doubles of input and 4 D words of scratch (D = the power of two >= n: rotation,
 * noisy integers, residues, masked residues): at most DPREC_CLIENT_SECAGG_BYTES(n) (include/dprec/dprec.h). */
#ifndef DPREC_SECURE_H
#define DPREC_SECURE_H

#include <stddef.h>
#include <stdint.h>

#include "ddg.h"
#include "protocol.h"
#include "secagg.h"


/* ---- the device's checks of the aggregator's lists (sdk/secure_check.c) -------------------------------------------
 * The neighbours, survivors and requests answers can be long (a survivor set of n_max ids, max(t, n_min) attestations
 * with their tokens): they are read as they stream in, one record at a time, in O(k) memory (k <= 64), and every
 * record is checked before the next is read. A reader never stops the transfer: it records its first refusal and
 * drops the rest, so that the caller, once the HTTP status is known, tells a refusal (a 200 answer that fails a check:
 * the device leaves the round) from an error answer (whose JSON body the reader also failed on). */

enum { DPREC_SECURE_READ_NEIGHBOURS = 1, DPREC_SECURE_READ_SURVIVORS, DPREC_SECURE_READ_REQUESTS };

/* What a reader checks against: the device's own facts and the plan's, never the aggregator's word. */
typedef struct dprec_secure_check {
    uint64_t job, round;
    uint32_t id;                         /* the device's id in the round */
    const unsigned char *identity;       /* its identity public key (65 bytes) */
    const unsigned char *enroll_key;     /* the app's enrollment public key (DER), or NULL: tokens are not checked */
    size_t enroll_key_len;
    uint32_t floor;                      /* max(t, n_min): the fewest survivors and attesters it accepts */
    uint32_t n_max;                      /* the most devices a round may hold */
    uint32_t k_max;                      /* the most neighbours it accepts (the plan's k) */
    /* the host's memo of signature checks already passed in this process (dprec_sync_config.verified_seen; both NULL:
     * every signature is checked): tag = SHA-256("dprec secagg sig v1" || key || digest || signature) */
    int (*seen)(void *ctx, const unsigned char tag[32]);
    void (*remember)(void *ctx, const unsigned char tag[32]);
    void *memo;
} dprec_secure_check;

typedef struct dprec_secure_reader {
    dprec_secure_check ck;
    struct dprec_secure_state *s;        /* where the parsed records go (nb, nb_identity, req; the device's nb) */
    int kind, stage;
    int status;                          /* DPREC_OK, or the first refusal (the rest of the answer is dropped) */
    int stopped;                         /* the transfer was stopped: the answer ran past its largest size */
    const char *why;                     /* what the refusal was, for the log */
    size_t need, have;                   /* the current record's bytes: wanted, gathered in buf */
    uint64_t total;                      /* bytes seen */
    uint32_t count, done;                /* records announced, records checked */
    /* neighbours: nothing more; survivors: the set's hash, whether it holds the device, which neighbours it holds;
     * requests: the survivors count and hash they name, the requests, whether each self-mask request's owner signed
     * that it masked with this device (named), the distinct attesters verified and how many of them are its
     * neighbours */
    uint32_t survivors, n_req, attested, nb_attested, prev_id;
    uint8_t named[DPREC_SECAGG_MAX_NEIGHBOURS];
    int holds_self;
    unsigned char hash[32];
    unsigned char prev[DPREC_IDENTITY_PK_SIZE];
    uint8_t in_u3[DPREC_SECAGG_MAX_NEIGHBOURS];
    mbedtls_sha256_context sha;
    unsigned char buf[DPREC_SECURE_RECORD_MAX];
} dprec_secure_reader;

/* Starts reading an answer of `kind` into s (the reader is s->rd's usual place). */
void dprec_secure_reader_start(dprec_secure_reader *rd, struct dprec_secure_state *s, int kind,
                               const dprec_secure_check *ck);
/* A dprec_http_sink: checks the records as they arrive. Returns 0 (the transfer goes on) except past the answer's
 * largest possible size, where it stops it with DPREC_ERR_PROTOCOL. */
int dprec_secure_reader_feed(void *rd, const unsigned char *chunk, size_t len);
/* After the transfer: DPREC_OK if the answer was complete and every record passed; else DPREC_ERR_PROTOCOL (or
 * DPREC_ERR_CONFIG for an enrollment key that is not an EC P-256 key), rd->why saying what. Frees the hash context. */
int dprec_secure_reader_finish(dprec_secure_reader *rd);

/* The client's secure-aggregation area (NULL when cfg.secagg_max_len is 0). */
typedef struct dprec_secure_state {
    uint64_t job, round;           /* the round the secrets belong to (job 0: none) */
    dprec_secagg_device dev;
    uint32_t n_inbox;
    dprec_secagg_envelope inbox[DPREC_SECAGG_MAX_NEIGHBOURS];
    size_t io_len;
    int io_overflow;
    /* a step message whose answer did not arrive (1 keys, 2 shares, 3 reveals; 0 none): re-sent, the same bytes
     * (s->io[0 .. io_len)), while the phase lasts; the aggregator answers a repeat 200 and applies it once */
    int unsent;
    unsigned char io[DPREC_SECURE_IO_MAX];
    /* a step's parsed messages: here rather than on the stack (the SDK needs at most 16 KiB of it, docs/sdk.md) */
    dprec_secagg_pub nb[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_request req[DPREC_SECAGG_MAX_NEIGHBOURS];
    dprec_secagg_reveal rv[DPREC_SECAGG_MAX_NEIGHBOURS];
    /* the neighbours' identity keys, in nb's order (distinct, none the device's own), and the reader of the lists */
    unsigned char nb_identity[DPREC_SECAGG_MAX_NEIGHBOURS][DPREC_IDENTITY_PK_SIZE];
    dprec_secure_reader rd;
} dprec_secure_state;

/* The fixed part of the area (the scratch follows it, 16-byte aligned). */
#define DPREC_SECURE_FIXED_BYTES 43008u

size_t dprec_secure_memory(const dprec_config *cfg);
dprec_secure_state *dprec_secure_of(const dprec_client *c);
double *dprec_secure_input(const dprec_client *c); /* cfg.secagg_max_len doubles: the protocol's vector goes here */

/* 1 if the job asks for secure aggregation (params.aggregation "secure"), 0 if not ("trusted" or absent), -1 for any
 * other value. */
int dprec_secure_requested(const dprec_sync_job *job);

/* The device's checks of a secure job whose protocol sends `len` reals of L2 norm at most `clip` each round (see the
 * file head). Fills the policy: secure = 1, secure_job, model secure-aggregation, the round step (the discrete Gaussian of
 * the plan's noise multiplier at the job's participation rate), delta and the report's size. DPREC_ERR_CONFIG if the
 * client keeps no room for such a vector, DPREC_ERR_JOB_PARAMS for anything that would weaken the guarantee. */
int dprec_secure_policy(const dprec_client *c, const dprec_sync_job *job, uint32_t len, double clip,
                        dprec_job_policy *pol);

/* The report of a secure job: the envelope header, then [magic "DSA2"][id u32][dim u32][bits u32], dim masked
 * residues (u64 LE) and the statement of the neighbours it masked with, signed with its identity key, in the plan's k
 * slots (DPREC_SECURE_PAYLOAD_SIZE, common/secagg.h). The input is dprec_secure_input(c)[0 .. len), which the protocol
 * filled: it is encoded (clip, rotation, conditional rounding, the device's discrete Gaussian share, mod 2^b), then
 * masked with the inbox sync_secure.c fetched, and wiped. With c->fallback the input is taken as 0. The statement
 * travels in the report so that the aggregator holds it for every device whose masked input it holds, whenever the
 * device drops later (its holders need it to reveal its self-mask share: docs/privacy.md "Against an active server"). */
size_t dprec_secure_report_size(const dprec_secure_job *sj);
int dprec_secure_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol, uint16_t wire_id,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len);

#endif /* DPREC_SECURE_H */
