/* dprec aggregator — the protocols this aggregator runs. Adding a protocol adds its aggregator/protocols/<name>.c and one
 * line here; no other protocol changes. */
#include <stdio.h>
#include <string.h>

#include "agg_protocol.h"

static const agg_protocol *const protocols[] = {
    &agg_protocol_plain,
    &agg_protocol_ldp_gd,
    &agg_protocol_ldp_gddr,
    &agg_protocol_ldp_rr,
    &agg_protocol_gauss_gd,
    &agg_protocol_private_fw,
    &agg_protocol_dpals,
    &agg_protocol_dpmf,
    &agg_protocol_sgld,
};

const agg_protocol *agg_protocol_by_name(const char *name) {
    if (name == NULL) return NULL;
    for (size_t i = 0; i < sizeof protocols / sizeof protocols[0]; i++)
        if (strcmp(protocols[i]->name, name) == 0) return protocols[i];
    return NULL;
}

const agg_protocol *agg_protocol_by_id(uint16_t id) {
    for (size_t i = 0; i < sizeof protocols / sizeof protocols[0]; i++)
        if (protocols[i]->id == id) return protocols[i];
    return NULL;
}

size_t agg_protocol_names(int (*keep)(const agg_protocol *), char *buf, size_t cap) {
    size_t n = 0, count = 0;
    if (cap > 0) buf[0] = '\0';
    for (size_t i = 0; i < sizeof protocols / sizeof protocols[0]; i++) {
        if (keep != NULL && !keep(protocols[i])) continue;
        if (cap > n) {
            int w = snprintf(buf + n, cap - n, "%s%s", count > 0 ? ", " : "", protocols[i]->name);
            n = w < 0 ? n : (n + (size_t)w < cap ? n + (size_t)w : cap - 1u); /* truncated at cap */
        }
        count++;
    }
    return count;
}
