/* dprec internal (shared with the aggregator) — the report envelope of protocol v1 (docs/protocol.md). */
#ifndef DPREC_REPORT_H
#define DPREC_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "dprec/privacy.h"

#define DPREC_ENVELOPE_MAGIC "DPRR"
#define DPREC_ENVELOPE_VERSION 1u
#define DPREC_ENVELOPE_HEADER 56u

/* protocol ids on the wire */
enum {
    DPREC_PROTO_PLAIN = 1,
    DPREC_PROTO_LDP_GD = 2,
    DPREC_PROTO_LDP_GDDR = 3,
    DPREC_PROTO_LDP_RR = 4,
    DPREC_PROTO_GAUSS_GD = 5,
    DPREC_PROTO_PRIVATE_FW = 6,
    DPREC_PROTO_SGLD = 7,
    DPREC_PROTO_DPMF = 8,
    DPREC_PROTO_DPALS = 9
};

/* Reports whose natural length would reveal how many ratings a user has (gauss-gd, private-fw) are padded to
 * the job's fixed number of entries: after the real [item][value] pairs (items strictly increasing) come
 * padding pairs with item DPREC_PAD_ITEM and value +0.0f (all bits zero). The aggregator refuses any other
 * length, a real pair after a padding pair, and a padding pair with other bits. */
#define DPREC_PAD_ITEM 0xFFFFFFFFu

typedef struct dprec_envelope {
    uint16_t protocol;
    uint64_t job_id;
    uint64_t round;
    unsigned char report_id[DPREC_REPORT_ID_SIZE];
    uint64_t release_version;
    const unsigned char *payload; /* decode: points into the buffer */
    uint32_t payload_len;
} dprec_envelope;

/* Writes the 56-byte header for e (payload_len included) at out. */
void dprec_envelope_write_header(unsigned char out[DPREC_ENVELOPE_HEADER], const dprec_envelope *e);

/* Parses buf[0..len): magic, version, reserved bytes, exact length. DPREC_ERR_INVALID_ARGUMENT if malformed. */
int dprec_envelope_parse(const unsigned char *buf, size_t len, dprec_envelope *e);

/* The wire id of a protocol name ("plain" -> 1), or 0 if unknown; and back (NULL if unknown). */
uint16_t dprec_protocol_id(const char *name);
const char *dprec_protocol_name(uint16_t id);

#endif /* DPREC_REPORT_H */
