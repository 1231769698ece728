/* dprec aggregator core — a job's "population_rule" option (agg_rule_option.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "agg_rule_option.h"

int agg_rule_option_read(const agg_job *shape, const cJSON *option, uint32_t *devices, double *activity, char *err,
                         size_t errcap) {
    if (!cJSON_IsObject(option)) {
        snprintf(err, errcap, "population_rule must be an object {\"devices\": N, \"ratings_per_device\": a}");
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, option) {
        const char *k = it->string != NULL ? it->string : "?";
        if (strcmp(k, "devices") != 0 && strcmp(k, "ratings_per_device") != 0) {
            snprintf(err, errcap, "population_rule.%.40s is not an input of the rule (devices, ratings_per_device)", k);
            return -1;
        }
    }
    const cJSON *nd = cJSON_GetObjectItemCaseSensitive(option, "devices");
    const cJSON *na = cJSON_GetObjectItemCaseSensitive(option, "ratings_per_device");
    if (!cJSON_IsNumber(nd) || !isfinite(nd->valuedouble) || nd->valuedouble < 1 ||
        nd->valuedouble > AGG_RULE_MAX_DEVICES || floor(nd->valuedouble) != nd->valuedouble) {
        snprintf(err, errcap, "population_rule.devices must be an integer in 1..1e9: the devices the app has, "
                              "declared");
        return -1;
    }
    if (!cJSON_IsNumber(na) || !isfinite(na->valuedouble) || !(na->valuedouble > 0) || na->valuedouble > shape->m) {
        snprintf(err, errcap, "population_rule.ratings_per_device must be a number in (0, m = %u]: the ratings a "
                 "device typically holds, at most the catalogue's items", shape->m);
        return -1;
    }
    if (!shape->has_budget || !(shape->budget_delta > 0.0)) {
        snprintf(err, errcap, "population_rule needs a budget with delta > 0 (the rule inverts the accountant at "
                 "(epsilon, delta))");
        return -1;
    }
    *devices = (uint32_t)nd->valuedouble;
    *activity = na->valuedouble;
    return 0;
}

cJSON *agg_rule_record_new(const agg_job *shape, uint32_t devices, double activity, const char *k_name, uint32_t k) {
    cJSON *r = cJSON_CreateObject();
    int ok = r != NULL;
    ok = ok && cJSON_AddNumberToObject(r, "devices", devices);
    ok = ok && cJSON_AddStringToObject(r, "devices_from", "declared");
    ok = ok && cJSON_AddNumberToObject(r, "ratings_per_device", activity);
    ok = ok && cJSON_AddNumberToObject(r, "items", shape->m) && cJSON_AddNumberToObject(r, k_name, k);
    ok = ok && cJSON_AddNumberToObject(r, "scale_width", shape->rating_max - shape->rating_min);
    ok = ok && cJSON_AddNumberToObject(r, "epsilon", shape->budget_epsilon) &&
         cJSON_AddNumberToObject(r, "delta", shape->budget_delta);
    if (!ok) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}
