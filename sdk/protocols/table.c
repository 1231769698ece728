/* dprec — the protocols this SDK can take part in. Adding a protocol adds its sdk/protocols/<name>.c and one line
 * here; sync.c, the store and the client find everything else in its descriptor (sdk/protocol.h). */
#include <string.h>

#include "client_priv.h"
#include "protocol.h"

const dprec_proto *const dprec_protocols[] = {
    &dprec_proto_plain,
    &dprec_proto_ldp_gd,
    &dprec_proto_ldp_gddr,
    &dprec_proto_ldp_rr,
    &dprec_proto_gauss_gd,
    &dprec_proto_private_fw,
    &dprec_proto_dpals,
    &dprec_proto_dpmf,
    &dprec_proto_sgld,
};

const size_t dprec_protocol_count = sizeof dprec_protocols / sizeof dprec_protocols[0];

_Static_assert(sizeof dprec_protocols / sizeof dprec_protocols[0] <= DPREC_MAX_PROTOCOLS,
               "raise DPREC_MAX_PROTOCOLS (client_priv.h): the client keeps a state pointer per protocol");

const dprec_proto *dprec_proto_find(const char *name) {
    for (size_t i = 0; i < dprec_protocol_count; i++)
        if (strcmp(dprec_protocols[i]->name, name) == 0) return dprec_protocols[i];
    return NULL;
}

unsigned char *dprec_proto_state_mem(const dprec_client *c, const dprec_proto *p) {
    for (size_t i = 0; i < dprec_protocol_count; i++)
        if (dprec_protocols[i] == p) return c->proto_state[i];
    return NULL;
}
