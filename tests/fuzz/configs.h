/* The client configurations of the fuzz targets, shared with fuzz_seeds.c so that its seeds fit them. */
#ifndef DPREC_FUZZ_CONFIGS_H
#define DPREC_FUZZ_CONFIGS_H

#include "dprec/dprec.h"

/* The store key of fuzz_store.c's encrypted mode (fixed: the harness seals files under it). */
#define FUZZ_STORE_KEY "dprec fuzz store key, not secret"

/* fuzz_store.c: small, with a ledger, pending slots and private-fw state, so that every section decodes. */
static inline void fuzz_store_config(dprec_config *cfg, int encrypted) {
    dprec_config_default(cfg);
    cfg->num_items = 100;
    cfg->dim = 4;
    cfg->rating_capacity = 8;
    cfg->max_k = 4;
    cfg->ledger_jobs = 4;
    cfg->pending_slots = 2;
    cfg->max_report_bytes = 256;
    cfg->fw_max_ratings = 4;
    cfg->encrypt_at_rest = encrypted;
}

/* fuzz_sync.c: job 7 of m = 20 items, d = 4, every protocol allowed within generous caps. */
static inline void fuzz_sync_config(dprec_config *cfg) {
    dprec_config_default(cfg);
    cfg->num_items = 20;
    cfg->dim = 4;
    cfg->rating_capacity = 16;
    cfg->max_k = 4;
    cfg->allow_non_private = 1;
    cfg->cap_user_epsilon = cfg->cap_rating_epsilon = 100.0;
    cfg->cap_user_delta = cfg->cap_rating_delta = 1e-3;
    cfg->ledger_jobs = 4;
    cfg->pending_slots = 2;
    cfg->max_report_bytes = 2048;
    cfg->fw_max_ratings = 4;
}

#endif
