/* dprec — status codes.
 *
 * 0 is success; every error is negative. Codes are grouped by module in blocks of 100 and are never
 * renumbered: a code that is no longer used is retired in place (its name kept, marked obsolete). */
#ifndef DPREC_STATUS_H
#define DPREC_STATUS_H

#include "dprec/export.h"

DPREC_BEGIN_DECLS

typedef enum dprec_status {
    DPREC_OK = 0,

    /* general: -1 .. -99 */
    DPREC_ERR_INVALID_ARGUMENT = -1, /* a NULL pointer, a zero size, or a value out of its documented range */
    DPREC_ERR_NO_MEMORY = -2,        /* the arena or the allocator cap is too small */
    DPREC_ERR_BUFFER_TOO_SMALL = -3, /* an output buffer cannot hold the result */
    DPREC_ERR_CONFIG = -4,           /* the configuration is inconsistent (see the field's comment) */
    DPREC_ERR_STATE = -5,            /* the call is not valid in the object's current state (which state:
                                      * dprec_client_last_error_detail, e.g. a stream left open, no fit yet, the
                                      * store held by another client) */
    DPREC_ERR_CRYPTO = -6,           /* mbedTLS failed; dprec_client_last_cause() has its code */
    DPREC_ERR_INTERNAL = -7,         /* a broken internal invariant: please report it */
    DPREC_ERR_STRUCT_SIZE = -8,      /* a struct's struct_size is one this library cannot use (other headers) */

    /* platform port: -100 .. -199 */
    DPREC_ERR_IO = -100,            /* a read, write, fsync or rename failed; the cause is kept */
    DPREC_ERR_NOT_FOUND = -101,     /* the file or blob does not exist */
    DPREC_ERR_NO_SPACE = -102,      /* the device storage is full */
    DPREC_ERR_ENTROPY = -103,       /* the port could not supply entropy */
    DPREC_ERR_PORT_MISSING = -104,  /* a port function the call needs is NULL */

    /* rating store: -200 .. -299 */
    DPREC_ERR_ITEM_OUT_OF_RANGE = -200,  /* item id >= the catalogue size */
    DPREC_ERR_VALUE_OUT_OF_SCALE = -201, /* rating outside [rating_min, rating_max] */
    DPREC_ERR_VALUE_NOT_FINITE = -202,   /* NaN or infinite rating */
    DPREC_ERR_STORE_FULL = -203,         /* the store holds rating_capacity ratings already */
    DPREC_ERR_NOT_RATED = -204,          /* remove or get of an item the user has not rated */
    DPREC_ERR_STORE_CORRUPT = -205,      /* a stored file failed its checksum or is malformed */
    DPREC_ERR_STORE_TRUNCATED = -206,    /* a stored file is shorter than its header says */
    DPREC_ERR_STORE_VERSION = -207,      /* a stored file has a format version this build cannot read */
    DPREC_ERR_STORE_KEY = -208,          /* the file is encrypted and the key is missing or wrong */
    DPREC_ERR_STORE_MISMATCH = -209,     /* the file was written for another catalogue size or capacity */
    DPREC_ERR_BAD_TIMESTAMP = -210,      /* a negative timestamp */
    DPREC_ERR_STORE_LOCKED = -211,       /* another client, in this process or another, is using the store */

    /* release of item profiles: -300 .. -399 */
    DPREC_ERR_RELEASE_MAGIC = -300,     /* not a dprec release */
    DPREC_ERR_RELEASE_VERSION = -301,   /* a release format version this build cannot read */
    DPREC_ERR_RELEASE_HEADER = -302,    /* inconsistent header: sizes, scale, flags or reserved bytes */
    DPREC_ERR_RELEASE_TRUNCATED = -303, /* fewer bytes than the header announces */
    DPREC_ERR_RELEASE_TRAILING = -304,  /* more bytes than the header announces */
    DPREC_ERR_RELEASE_DIGEST = -305,    /* the SHA-256 digest does not match the content */
    DPREC_ERR_RELEASE_VALUE = -306,     /* a NaN, infinite or out-of-bound (|x| > 2^20) value in the body */
    DPREC_ERR_RELEASE_SIGNATURE = -307, /* the signature is missing or does not verify */
    DPREC_ERR_RELEASE_MISMATCH = -308,  /* the release's m, d or scale differ from the client's */
    DPREC_ERR_RELEASE_UNVERIFIED = -309, /* not the client's trusted release: verify it first (dprec_release_verify) */
    DPREC_ERR_RELEASE_COLUMN = -310,    /* a critical release column (format 3) this build cannot read */

    /* local computation: -400 .. -499 */
    DPREC_ERR_SINGULAR = -400,  /* the least-squares system is not positive definite (raise lambda) */
    DPREC_ERR_NO_RATINGS = -401, /* the operation needs at least one rating */

    /* privacy ledger and reports: -500 .. -599 */
    DPREC_ERR_BUDGET_EXCEEDED = -500,  /* the report would take the user past the configured cap */
    DPREC_ERR_ALREADY_REPORTED = -501, /* this job already has a report for this (or a later) round */
    DPREC_ERR_NON_PRIVATE = -502,      /* a non-private report while cfg.allow_non_private is 0 */
    DPREC_ERR_PENDING_FULL = -503,     /* every pending-report slot holds an unacknowledged report */
    DPREC_ERR_LEDGER_FULL = -504,      /* the ledger has no line left for a new job */
    DPREC_ERR_LEDGER_LOST = -505,      /* every store generation was damaged: past spending is unknown */
    DPREC_ERR_REPORT_TOO_LARGE = -506, /* the report builder needs more than cfg.max_report_bytes */
    DPREC_ERR_JOB_CHANGED = -507,      /* the job's privacy parameters differ from those of its first charge */
    DPREC_ERR_JOB_ROUNDS = -508,       /* the job opened more rounds than it declared when the device joined */
    DPREC_ERR_JOB_PARAMS = -509,       /* a job parameter the guarantee depends on is out of the device's bounds,
                                        * or the published guarantee understates the device's own figure */

    /* sync and transport: -600 .. -699 */
    DPREC_ERR_NETWORK = -600,  /* no response: connection, DNS or timeout */
    DPREC_ERR_TLS = -601,      /* the server failed certificate verification or pinning */
    DPREC_ERR_PROTOCOL = -602, /* the aggregator refused a request (a 4xx) or answered something malformed */
    DPREC_ERR_UNSUPPORTED = -603, /* the job's protocol is not built into this SDK */
    DPREC_ERR_ENROLLMENT = -604   /* the enrollment token is missing, malformed, expired, for another app, not
                                   * signed by the app's enrollment key, or already used (docs/protocol.md) */
} dprec_status;

/* Returns a static, human-readable description of a status (never NULL; unknown codes get a generic text). */
DPREC_API const char *dprec_strerror(int status);

/* Returns the symbolic name of a status ("DPREC_ERR_STORE_FULL"), or "DPREC_UNKNOWN". */
DPREC_API const char *dprec_status_name(int status);

DPREC_END_DECLS

#endif /* DPREC_STATUS_H */
