/* dprec internal — streaming top-K over (item, score) in the caller's k slots.
 *
 * The kept entries form a binary min-heap whose root is the WORST of them, so a newcomer is compared with
 * one entry only and, if better, replaces it: O(log k) a push, no allocation. "Better" is the result
 * order: higher score, then lower item id; it is a strict total order on (score, item) pairs once NaN
 * is excluded, so the result equals a full sort whatever order the items arrive in. The caller pushes each
 * item once: nothing here detects a repeated item id. */
#include "topk.h"

#include <math.h>

/* 1 if x ranks strictly before y in the result (higher score; for equal scores, lower item id). Neither
 * score is NaN. -0.0 and +0.0 compare equal here, as they do in a sort by score. */
static int better(const dprec_recommendation *x, const dprec_recommendation *y)
{
    if (x->score != y->score) {
        return x->score > y->score;
    }
    return x->item < y->item;
}

/* Restores the heap below slot i over h[0 .. n): the worse child moves up while it is worse than the
 * entry being placed. */
static void sift_down(dprec_recommendation *h, uint32_t n, uint32_t i)
{
    dprec_recommendation e = h[i];
    /* Slot i has a child iff 2i + 1 < n, i.e. i < n / 2; testing that first keeps 2i + 1 <= n - 1, so it
     * cannot wrap even for k near UINT32_MAX. */
    while (i < n / 2) {
        uint32_t c = 2 * i + 1;
        if (c + 1 < n && better(&h[c], &h[c + 1])) {
            c++; /* the worse of the two children */
        }
        if (!better(&e, &h[c])) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
}

void dprec_topk_reset(dprec_topk *t, dprec_recommendation *storage, uint32_t k)
{
    t->heap = storage;
    t->k = k;
    t->n = 0;
}

void dprec_topk_push(dprec_topk *t, uint32_t item, float score)
{
    dprec_recommendation e;
    e.item = item;
    e.score = score;

    if (isnan(score)) { /* never ranked, never kept */
        return;
    }
    if (t->n < t->k) {
        /* Sift up: the new entry moves towards the root while it is worse than its parent. */
        dprec_recommendation *h = t->heap;
        uint32_t i = t->n++;
        while (i > 0) {
            uint32_t p = (i - 1) / 2;
            if (!better(&h[p], &e)) {
                break;
            }
            h[i] = h[p];
            i = p;
        }
        h[i] = e;
        return;
    }
    /* Full (or k == 0, where n == 0 and nothing is ever compared): the newcomer must beat the worst kept. */
    if (t->n > 0 && better(&e, &t->heap[0])) {
        t->heap[0] = e;
        sift_down(t->heap, t->n, 0);
    }
}

uint32_t dprec_topk_finish(dprec_topk *t)
{
    dprec_recommendation *h = t->heap;
    uint32_t n = t->n;

    /* Heap sort: the root is the worst of h[0 .. m), so moving it to h[m - 1] fills the array from the
     * back with ever better entries, leaving h[0 .. n) best first. */
    for (uint32_t m = n; m > 1; m--) {
        dprec_recommendation worst = h[0];
        h[0] = h[m - 1];
        h[m - 1] = worst;
        sift_down(h, m - 1, 0);
    }
    return n;
}
