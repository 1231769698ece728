/* dprec aggregator core — the model a release carries, and the release as the layers read it back: parsed into a
 * model, clamped to the public bound devices require, and the names of the compact encodings (release-format.md).
 *
 * Its own file because the store reads a round's release back into a model (state/), the protocols build and free
 * models, and the request layer parses a base job's release: the model is the base's (agg_base.h). Signing a release
 * is the round engine's (rounds/agg_sign.c). */
#include <stdlib.h>
#include <string.h>

#include "agg_base.h"
#include "dprec/release.h"
#include "dprec/status.h"
#include "release_priv.h"

void agg_job_free(agg_job *j) {
    if (j == NULL) return;
    free(j->params);
    j->params = NULL;
    free(j->rule);
    j->rule = NULL;
}

void agg_model_free(agg_model *x) {
    if (x == NULL) return;
    free(x->v);
    free(x->bias);
    free(x->unc);
    x->v = NULL;
    x->bias = NULL;
    x->unc = NULL;
}

int agg_release_encoding_parse(const char *name, uint16_t *enc) {
    if (strcmp(name, "f32") == 0) *enc = 0;
    else if (strcmp(name, "q16") == 0) *enc = DPREC_RELEASE_ENC_Q16;
    else if (strcmp(name, "q8") == 0) *enc = DPREC_RELEASE_ENC_Q8;
    else return -1;
    return 0;
}

const char *agg_release_encoding_name(uint16_t enc) {
    return enc == DPREC_RELEASE_ENC_Q16 ? "q16" : enc == DPREC_RELEASE_ENC_Q8 ? "q8" : "f32";
}

static float clamp_value(float v) {
    if (!(v == v)) return 0.0f; /* NaN: never produced by a global step, but never signed either */
    if (v > DPREC_RELEASE_VALUE_MAX) return DPREC_RELEASE_VALUE_MAX;
    if (v < -DPREC_RELEASE_VALUE_MAX) return -DPREC_RELEASE_VALUE_MAX;
    return v;
}

/* Devices refuse a release with a value past the public bound DPREC_RELEASE_VALUE_MAX (dprec/release.h), so
 * the model is clamped to it before it is signed: post-processing of the private model, no privacy cost. */
void agg_model_clamp(agg_model *x) {
    for (size_t k = 0; k < (size_t)x->m * x->d; k++) x->v[k] = clamp_value(x->v[k]);
    if (x->bias != NULL)
        for (uint32_t j = 0; j < x->m; j++) x->bias[j] = clamp_value(x->bias[j]);
    x->mu = clamp_value(x->mu);
}

int agg_release_to_model(const unsigned char *buf, size_t len, agg_model *x) {
    dprec_release_info info;
    memset(x, 0, sizeof *x);
    if (dprec_release_check(buf, len, &info) != DPREC_OK) return -1;
    x->m = info.num_items;
    x->d = info.dim;
    x->mu = info.global_mean;
    x->v = malloc(sizeof(float) * (size_t)x->m * x->d);
    if (info.flags & DPREC_RELEASE_HAS_BIASES) x->bias = malloc(sizeof(float) * x->m);
    if (x->v == NULL || ((info.flags & DPREC_RELEASE_HAS_BIASES) && x->bias == NULL)) {
        agg_model_free(x);
        return -1;
    }
    for (uint32_t jj = 0; jj < x->m; jj++) {
        float b = 0.0f;
        if (dprec_release_row(buf, &info, jj, x->v + (size_t)jj * x->d, &b) != DPREC_OK) {
            agg_model_free(x);
            return -1;
        }
        if (x->bias != NULL) x->bias[jj] = b;
    }
    /* the items' uncertainty, when the release carries it (a protocol's next step propagates it) */
    dprec_release_column cols[DPREC_RELEASE_MAX_COLUMNS];
    uint32_t ncols = 0;
    if (dprec_release_columns(buf, len, cols, DPREC_RELEASE_MAX_COLUMNS, &ncols) != DPREC_OK) ncols = 0;
    for (uint32_t c = 0; c < ncols && c < DPREC_RELEASE_MAX_COLUMNS; c++) {
        if (cols[c].type != DPREC_RELEASE_COL_UNCERTAINTY) continue;
        x->unc = malloc((size_t)x->m * DPREC_RELEASE_UNCERTAINTY_WIDTH);
        if (x->unc == NULL) {
            agg_model_free(x);
            return -1;
        }
        x->unc_flags = cols[c].flags;
        const uint32_t core = dprec_release_row_size(info.dim, info.flags);
        const uint64_t stride = (info.total_size - DPREC_RELEASE_HEADER_SIZE - DPREC_RELEASE_DIGEST_SIZE - info.sig_len) / info.num_items;
        for (uint32_t jj = 0; jj < x->m; jj++)
            memcpy(x->unc + (size_t)jj * DPREC_RELEASE_UNCERTAINTY_WIDTH,
                   buf + DPREC_RELEASE_HEADER_SIZE + (size_t)jj * stride + core + cols[c].offset,
                   DPREC_RELEASE_UNCERTAINTY_WIDTH);
    }
    return 0;
}
