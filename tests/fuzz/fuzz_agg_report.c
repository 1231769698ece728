/* Fuzz target: the aggregator's report intake (aggregator/core: the envelope, then the job's protocol's
 * payload checks, then the round's bookkeeping), through dprec_agg_handle as a registered device. Byte 0 picks
 * the job (agg_env.h: one per protocol); the rest is the report body. Every answer must be a well-formed JSON
 * response with a 2xx or 4xx status: a report never makes the aggregator fail (5xx) or crash. */
#include "agg_env.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    agg_env *e = agg_env_get();
    unsigned job = (unsigned)(data[0] % AGG_JOBS) + 1u;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%u/reports", job);
    dprec_agg_response r;
    int status = agg_env_call(e, DPREC_LISTENER_DEVICE, "POST", path, e->device_auth, data + 1, size - 1, &r);
    FUZZ_CHECK(status == 200 || (status >= 400 && status < 500));
    cJSON *o = cJSON_ParseWithLength((const char *)r.body, r.body_len);
    FUZZ_CHECK(o != NULL);
    cJSON_Delete(o);
    dprec_agg_response_free(&r);
    return 0;
}
