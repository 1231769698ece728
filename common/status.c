/* dprec — status codes to text. */
#include "dprec/status.h"

#include <stddef.h>

typedef struct status_entry {
    int code;
    const char *name;
    const char *text;
} status_entry;

#define E(code, text) {code, #code, text}
static const status_entry status_table[] = {
    E(DPREC_OK, "success"),
    E(DPREC_ERR_INVALID_ARGUMENT, "invalid argument"),
    E(DPREC_ERR_NO_MEMORY, "not enough memory in the arena or under the allocator cap"),
    E(DPREC_ERR_BUFFER_TOO_SMALL, "output buffer too small"),
    E(DPREC_ERR_CONFIG, "inconsistent configuration"),
    E(DPREC_ERR_STATE, "call not valid in the current state (the client's error detail says why)"),
    E(DPREC_ERR_CRYPTO, "cryptographic library error"),
    E(DPREC_ERR_INTERNAL, "internal error (please report)"),
    E(DPREC_ERR_STRUCT_SIZE, "struct_size of a struct the app filled does not match this library (built against other headers?)"),
    E(DPREC_ERR_IO, "storage I/O error"),
    E(DPREC_ERR_NOT_FOUND, "file not found"),
    E(DPREC_ERR_NO_SPACE, "device storage full"),
    E(DPREC_ERR_ENTROPY, "no entropy available"),
    E(DPREC_ERR_PORT_MISSING, "the platform port lacks a function this call needs"),
    E(DPREC_ERR_ITEM_OUT_OF_RANGE, "item id outside the catalogue"),
    E(DPREC_ERR_VALUE_OUT_OF_SCALE, "rating outside the rating scale"),
    E(DPREC_ERR_VALUE_NOT_FINITE, "rating is NaN or infinite"),
    E(DPREC_ERR_STORE_FULL, "rating store is full"),
    E(DPREC_ERR_NOT_RATED, "item has not been rated"),
    E(DPREC_ERR_STORE_CORRUPT, "stored ratings failed their checksum"),
    E(DPREC_ERR_STORE_TRUNCATED, "stored ratings file is truncated"),
    E(DPREC_ERR_STORE_VERSION, "stored ratings file has an unsupported format version"),
    E(DPREC_ERR_STORE_KEY, "stored ratings cannot be decrypted (missing or wrong key)"),
    E(DPREC_ERR_STORE_MISMATCH, "stored ratings were written for another catalogue or a larger capacity"),
    E(DPREC_ERR_BAD_TIMESTAMP, "negative timestamp"),
    E(DPREC_ERR_STORE_LOCKED, "another client (in this process or another) is using the store"),
    E(DPREC_ERR_RELEASE_MAGIC, "not a dprec release"),
    E(DPREC_ERR_RELEASE_VERSION, "unsupported release format version"),
    E(DPREC_ERR_RELEASE_HEADER, "inconsistent release header"),
    E(DPREC_ERR_RELEASE_TRUNCATED, "release is truncated"),
    E(DPREC_ERR_RELEASE_TRAILING, "release has trailing bytes"),
    E(DPREC_ERR_RELEASE_DIGEST, "release digest does not match its content"),
    E(DPREC_ERR_RELEASE_VALUE, "release holds a NaN, infinite or out-of-bound value"),
    E(DPREC_ERR_RELEASE_SIGNATURE, "release signature missing or invalid"),
    E(DPREC_ERR_RELEASE_MISMATCH, "release does not match the client (m, d, scale or fitted release)"),
    E(DPREC_ERR_RELEASE_UNVERIFIED, "release not verified: not the client's trusted release (dprec_release_verify)"),
    E(DPREC_ERR_RELEASE_COLUMN, "release has a critical column (format 3) this build cannot read"),
    E(DPREC_ERR_SINGULAR, "least-squares system is singular (increase lambda)"),
    E(DPREC_ERR_NO_RATINGS, "no ratings"),
    E(DPREC_ERR_BUDGET_EXCEEDED, "the report would exceed the user's privacy cap"),
    E(DPREC_ERR_ALREADY_REPORTED, "already reported for this job and round"),
    E(DPREC_ERR_NON_PRIVATE, "non-private report refused (allow_non_private is off)"),
    E(DPREC_ERR_PENDING_FULL, "every pending-report slot is in use"),
    E(DPREC_ERR_LEDGER_FULL, "the privacy ledger has no room for another job"),
    E(DPREC_ERR_LEDGER_LOST, "the privacy ledger was lost with a damaged store; reports are blocked"),
    E(DPREC_ERR_REPORT_TOO_LARGE, "the report is larger than max_report_bytes"),
    E(DPREC_ERR_JOB_CHANGED, "the job's privacy parameters changed since this device first took part"),
    E(DPREC_ERR_JOB_ROUNDS, "the job opened more rounds than it declared"),
    E(DPREC_ERR_JOB_PARAMS, "a job parameter is outside the device's privacy bounds"),
    E(DPREC_ERR_NETWORK, "no response from the aggregator"),
    E(DPREC_ERR_TLS, "the aggregator failed certificate verification or pinning"),
    E(DPREC_ERR_PROTOCOL, "the aggregator refused the request or answered something malformed"),
    E(DPREC_ERR_UNSUPPORTED, "the job's protocol is not supported by this SDK"),
    E(DPREC_ERR_ENROLLMENT, "the enrollment token is missing, malformed, expired, for another app, not signed by the "
                            "app's enrollment key, or already used"),
};
#undef E

static const status_entry *status_find(int status) {
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++) {
        if (status_table[i].code == status) return &status_table[i];
    }
    return NULL;
}

const char *dprec_strerror(int status) {
    const status_entry *e = status_find(status);
    return e ? e->text : "unknown status";
}

const char *dprec_status_name(int status) {
    const status_entry *e = status_find(status);
    return e ? e->name : "DPREC_UNKNOWN";
}
