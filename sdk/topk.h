/* dprec internal — streaming top-K: a bounded min-heap over (item, score), O(K) memory, O(log K) a push.
 * Order: higher score first; equal scores rank the lower item id first (so results are deterministic and
 * equal to a full sort by (score desc, item asc)). NaN scores are never admitted. */
#ifndef DPREC_TOPK_H
#define DPREC_TOPK_H

#include <stdint.h>

#include "dprec/dprec.h"
#include "config_check.h"

typedef struct dprec_topk {
    dprec_recommendation *heap; /* k slots, owned by the caller */
    uint32_t k;
    uint32_t n;
} dprec_topk;

void dprec_topk_reset(dprec_topk *t, dprec_recommendation *storage, uint32_t k);
void dprec_topk_push(dprec_topk *t, uint32_t item, float score);
/* Sorts the kept entries best first into the heap storage in place and returns their number; the heap
 * must be reset before the next push. */
uint32_t dprec_topk_finish(dprec_topk *t);

#endif /* DPREC_TOPK_H */
