/* dprec aggregator core — a job's "population_rule" option as every protocol's rule reads it (docs/protocol.md, "The
 * population rule"): {"devices": N, "ratings_per_device": a}, both declared by the app (a device registers on its first
 * sync, which needs a job, so the registrations at a first job's creation count nothing of the population). Part of
 * the protocols/ layer (docs/architecture.md); not API. */
#ifndef DPREC_AGG_RULE_OPTION_H
#define DPREC_AGG_RULE_OPTION_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"

#define AGG_RULE_MAX_DEVICES 1e9 /* as the spec's min_reports */

/* Reads the option against the job's shape (m, the budget): N an integer in 1..1e9, a a number in (0, m], nothing else
 * in the object, and a budget with delta > 0 (every rule inverts the accountant at (epsilon, delta)). 0, or -1 with a
 * message naming the field. */
int agg_rule_option_read(const agg_job *shape, const cJSON *option, uint32_t *devices, double *activity, char *err,
                         size_t errcap);

/* A rule's record begun with what every rule reads (docs/protocol.md "The population rule"): devices (declared),
 * ratings_per_device, items (m), k under the name k_name, scale_width, and the budget (epsilon, delta) as the job has it
 * (the request layer adds its unit and model, as the job's privacy block). The caller adds its own fields and owns the
 * object. NULL when out of memory. */
cJSON *agg_rule_record_new(const agg_job *shape, uint32_t devices, double activity, const char *k_name, uint32_t k);

#endif /* DPREC_AGG_RULE_OPTION_H */
