/* dprec internal — a device's part in a secure-aggregation job (`params.aggregation: "secure"` of gauss-gd and
 * dpals; docs/privacy.md "Secure aggregation", docs/protocol.md "Secure aggregation").
 *
 * The device never takes the noise plan on trust: it reads the published plan's integers (privacy.secagg), checks
 * them itself (common/ddg.c, dprec_ddg_plan_check: b holds the sum of n_max devices without wrapping; the RDP
 * recomputed from the integers at n_min survivors), checks the SecAgg+ parameters (k/2 < t <= k, n_min >= t and at
 * least DPREC_SECURE_MIN_SURVIVORS, the plan's length equal to the vector its protocol sends, the clip its
 * protocol's), and charges its ledger the distributed discrete Gaussian's RDP at the FEWEST survivors the round may
 * unmask (n_min: fewer shares, less noise), composed over the rounds by its own accountant. sync_secure.c runs the
 * round's steps (advertise, share, masked input, unmask) one per call as the aggregator's phase advances; the round's
 * secrets (common/secagg.h) live in memory only: a restart mid-round makes the device a dropout, which the protocol
 * tolerates, and the report path (dprec_report_prepare) still allows one masked input per round.
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
} dprec_secure_state;

/* The fixed part of the area (the scratch follows it, 16-byte aligned). */
#define DPREC_SECURE_FIXED_BYTES 40960u

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

/* The report of a secure job: the envelope header, then [magic "DSA1"][id u32][dim u32][bits u32] and dim masked
 * residues (u64 LE). The input is dprec_secure_input(c)[0 .. len), which the protocol filled: it is encoded (clip,
 * rotation, conditional rounding, the device's discrete Gaussian share, mod 2^b), then masked with the inbox
 * sync_secure.c fetched, and wiped. With c->fallback the input is taken as 0. */
size_t dprec_secure_report_size(const dprec_ddg_plan *plan);
int dprec_secure_build(dprec_client *c, const dprec_sync_job *job, const dprec_job_policy *pol, uint16_t wire_id,
                       const unsigned char report_id[DPREC_REPORT_ID_SIZE], unsigned char *out, size_t cap, size_t *len);

#endif /* DPREC_SECURE_H */
