/* Fuzz target: the aggregator's job parser (POST /v1/admin/jobs: the spec's fields, the protocol's params and
 * budget checks), through dprec_agg_handle as the admin. The input is the JSON body. A spec whose m d is above
 * 4096 is skipped: the admin is trusted to create large jobs, and each job stores its first release, so the
 * fuzzer's memory would grow with them. Every answer must be well-formed JSON with 201 or a 4xx. */
#include "agg_env.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    agg_env *e = agg_env_get();
    cJSON *spec = cJSON_ParseWithLength((const char *)data, size);
    if (spec != NULL) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(spec, "m"), *d = cJSON_GetObjectItemCaseSensitive(spec, "d");
        int big = cJSON_IsNumber(m) && cJSON_IsNumber(d) && m->valuedouble * d->valuedouble > 4096.0;
        cJSON_Delete(spec);
        if (big) return 0;
    }
    dprec_agg_response r;
    int status = agg_env_call(e, DPREC_LISTENER_ADMIN, "POST", "/v1/admin/jobs", AGG_ADMIN, data, size, &r);
    FUZZ_CHECK(status == 201 || (status >= 400 && status < 500));
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    FUZZ_CHECK(o != NULL);
    cJSON_Delete(o);
    dprec_agg_response_free(&r);
    return 0;
}
