/* dprec aggregator core — a protocol's secure-aggregation option: the job's params.aggregation and secagg_* params,
 * checked and planned (the distributed discrete Gaussian's noise plan, common/ddg.h), and whether a job is secure
 * (agg_secure_spec.c; not API).
 *
 * Part of the protocols/ layer (docs/architecture.md): the protocols that offer the option (gauss-gd, dpals)
 * validate and publish it with these, and the layers above ask agg_secure_job. The rounds themselves (phases, the
 * devices' messages, the unmasked sum) are the round engine's: rounds/agg_secure.h. */
#ifndef DPREC_AGG_SECURE_SPEC_H
#define DPREC_AGG_SECURE_SPEC_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/agg_base.h"
#include "ddg.h"

/* A secure job's parameters, from its protocol (agg_protocol.secure_plan). */
typedef struct agg_secure_spec {
    uint32_t k, threshold;
    dprec_ddg_plan plan;
} agg_secure_spec;

/* Parses the secure-aggregation params of a job (params.aggregation, secagg_neighbours, secagg_threshold,
 * secagg_min_survivors, secagg_max_devices, secagg_bits_max) for a protocol whose devices send `len` reals of norm at
 * most clip; plans the noise (dprec_ddg_plan_make at the job's budget, rounds and participation). 1 secure (spec
 * filled), 0 not secure, -1 invalid (err). */
int agg_secure_parse(const agg_job *job, const cJSON *params, uint32_t len, double clip, agg_secure_spec *spec,
                     char *err, size_t errcap);
/* agg_secure_parse on the job's own params, remembered per job (every request of a secure job asks; the planner
 * inverts the accountant). A job without an id (being validated) is not remembered. */
int agg_secure_spec_for(const agg_job *job, uint32_t len, double clip, agg_secure_spec *spec, char *err, size_t errcap);
/* Adds privacy.secagg (the plan's integers and the SecAgg+ parameters) to a job view's privacy object. */
void agg_secure_publish(const agg_secure_spec *spec, cJSON *privacy);

/* 1 if the job is secure (spec filled when not NULL). */
int agg_secure_job(const agg_job *job, agg_secure_spec *spec);

#endif /* DPREC_AGG_SECURE_SPEC_H */
