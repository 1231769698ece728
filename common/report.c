/* dprec — the report envelope of protocol v1 (docs/protocol.md), shared by devices and the aggregator. */
#include "report.h"

#include <string.h>

#include "bytes.h"
#include "dprec/status.h"

static const char *const protocol_names[] = {NULL, "plain", "ldp-gd", "ldp-gddr", "ldp-rr", "gauss-gd",
                                             "private-fw", "sgld", "dpmf", "dpals"};

void dprec_envelope_write_header(unsigned char out[DPREC_ENVELOPE_HEADER], const dprec_envelope *e) {
    memcpy(out, DPREC_ENVELOPE_MAGIC, 4);
    dprec_st16(out + 4, DPREC_ENVELOPE_VERSION);
    dprec_st16(out + 6, e->protocol);
    dprec_st64(out + 8, e->job_id);
    dprec_st64(out + 16, e->round);
    memcpy(out + 24, e->report_id, DPREC_REPORT_ID_SIZE);
    dprec_st64(out + 40, e->release_version);
    dprec_st32(out + 48, e->payload_len);
    dprec_st32(out + 52, 0);
}

int dprec_envelope_parse(const unsigned char *buf, size_t len, dprec_envelope *e) {
    if (buf == NULL || e == NULL || len < DPREC_ENVELOPE_HEADER) return DPREC_ERR_INVALID_ARGUMENT;
    if (memcmp(buf, DPREC_ENVELOPE_MAGIC, 4) != 0 || dprec_ld16(buf + 4) != DPREC_ENVELOPE_VERSION ||
        dprec_ld32(buf + 52) != 0)
        return DPREC_ERR_INVALID_ARGUMENT;
    uint32_t plen = dprec_ld32(buf + 48);
    if ((size_t)plen != len - DPREC_ENVELOPE_HEADER) return DPREC_ERR_INVALID_ARGUMENT;
    e->protocol = dprec_ld16(buf + 6);
    e->job_id = dprec_ld64(buf + 8);
    e->round = dprec_ld64(buf + 16);
    memcpy(e->report_id, buf + 24, DPREC_REPORT_ID_SIZE);
    e->release_version = dprec_ld64(buf + 40);
    e->payload_len = plen;
    e->payload = buf + DPREC_ENVELOPE_HEADER;
    return DPREC_OK;
}

uint16_t dprec_protocol_id(const char *name) {
    if (name == NULL) return 0;
    for (uint16_t i = 1; i < sizeof protocol_names / sizeof protocol_names[0]; i++)
        if (strcmp(protocol_names[i], name) == 0) return i;
    return 0;
}

const char *dprec_protocol_name(uint16_t id) {
    if (id == 0 || id >= sizeof protocol_names / sizeof protocol_names[0]) return NULL;
    return protocol_names[id];
}
