/* dprec aggregator core — the seed-003 solver's data layout (agg_mf.c says why it is laid out this way): users and
 * items renumbered into internal rows by rating count and dealt round robin into P user groups and Q item groups, and
 * the ratings of every (user group, item group) block stored by user row, then item row. Its own file because it is
 * built once, at create, and shapes everything after: the kernels only walk what it wrote (agg_mf_priv.h's mf_block),
 * and the scheduler only pairs its groups. */
#include <stdlib.h>
#include <string.h>

#include "agg_mf_priv.h"

typedef struct count_ref {
    uint32_t id;
    uint32_t n;
} count_ref;

static int by_count_desc(const void *a, const void *b) {
    const count_ref *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Internal rows: ids sorted by count (descending), rank r dealt to group r % G at position r / G. */
int agg_mf_assign_rows(const uint32_t *count, uint32_t nids, uint32_t groups, uint32_t *row, uint32_t *group_of) {
    count_ref *c = malloc(sizeof *c * (nids > 0 ? nids : 1));
    uint32_t *start = calloc(groups + 1u, sizeof *start);
    if (c == NULL || start == NULL) {
        free(c);
        free(start);
        return -1;
    }
    for (uint32_t i = 0; i < nids; i++) c[i] = (count_ref){i, count[i]};
    qsort(c, nids, sizeof *c, by_count_desc);
    for (uint32_t g = 0; g < groups; g++) start[g + 1] = start[g] + (nids > g ? (nids - g + groups - 1u) / groups : 0u);
    for (uint32_t r = 0; r < nids; r++) {
        uint32_t g = r % groups;
        row[c[r].id] = start[g] + r / groups;
        group_of[c[r].id] = g;
    }
    free(c);
    free(start);
    return 0;
}

void agg_mf_blocks_free(agg_mf *s) {
    for (uint32_t b = 0; s->blocks != NULL && b < s->P * s->Q; b++) {
        free(s->blocks[b].urow);
        free(s->blocks[b].off);
        free(s->blocks[b].ent);
    }
    free(s->blocks);
    s->blocks = NULL;
}

/* The blocks: every rating goes to block (user group, item group); each block's ratings sorted by (user row, item
 * row) with two stable counting sorts (by item row, then by user row) and one stable distribution. */
int agg_mf_build_blocks(agg_mf *s, const agg_mf_data *d, const uint32_t *ugroup, const uint32_t *igroup) {
    const size_t n = d->n;
    const uint32_t nb = s->P * s->Q;
    s->blocks = calloc(nb, sizeof *s->blocks);
    size_t *cnt = calloc((size_t)(s->users > s->items ? s->users : s->items) + 1u, sizeof *cnt);
    size_t *ord = malloc(sizeof *ord * (n > 0 ? n : 1)), *ord2 = malloc(sizeof *ord2 * (n > 0 ? n : 1));
    size_t *bcount = calloc(nb, sizeof *bcount);
    if (s->blocks == NULL || cnt == NULL || ord == NULL || ord2 == NULL || bcount == NULL) goto oom;
    for (size_t i = 0; i < n; i++) cnt[s->item_row[d->item[i]] + 1u]++;
    for (uint32_t j = 0; j < s->items; j++) cnt[j + 1] += cnt[j];
    for (size_t i = 0; i < n; i++) ord[cnt[s->item_row[d->item[i]]]++] = i;
    memset(cnt, 0, sizeof *cnt * ((size_t)(s->users > s->items ? s->users : s->items) + 1u));
    for (size_t i = 0; i < n; i++) cnt[s->user_row[d->user[i]] + 1u]++;
    for (uint32_t u = 0; u < s->users; u++) cnt[u + 1] += cnt[u];
    for (size_t t = 0; t < n; t++) {
        size_t i = ord[t];
        ord2[cnt[s->user_row[d->user[i]]]++] = i;
    }
    for (size_t i = 0; i < n; i++) bcount[ugroup[d->user[i]] * s->Q + igroup[d->item[i]]]++;
    for (uint32_t b = 0; b < nb; b++) {
        mf_block *bl = &s->blocks[b];
        bl->ent = malloc(sizeof *bl->ent * (bcount[b] + MF_PREFETCH));
        if (bl->ent == NULL) goto oom;
        for (size_t e = 0; e < MF_PREFETCH; e++) bl->ent[bcount[b] + e] = (mf_entry){0, 0.0f};
    }
    for (size_t t = 0; t < n; t++) { /* by user row, then item row: users change at most once per run in a block */
        size_t i = ord2[t];
        mf_block *bl = &s->blocks[ugroup[d->user[i]] * s->Q + igroup[d->item[i]]];
        bl->ent[bl->n++] = (mf_entry){s->item_row[d->item[i]], d->rating[i]};
        ord[t] = s->user_row[d->user[i]]; /* reused: the user row of the t-th rating in this order */
    }
    for (uint32_t b = 0; b < nb; b++) { /* count each block's users */
        s->blocks[b].nusers = 0;
        s->blocks[b].n = 0;
    }
    uint32_t *last = malloc(sizeof *last * nb);
    if (last == NULL) goto oom;
    for (uint32_t b = 0; b < nb; b++) last[b] = UINT32_MAX;
    for (size_t t = 0; t < n; t++) {
        size_t i = ord2[t];
        uint32_t b = ugroup[d->user[i]] * s->Q + igroup[d->item[i]];
        if (last[b] != (uint32_t)ord[t]) {
            last[b] = (uint32_t)ord[t];
            s->blocks[b].nusers++;
        }
    }
    for (uint32_t b = 0; b < nb; b++) {
        mf_block *bl = &s->blocks[b];
        bl->urow = malloc(sizeof *bl->urow * (bl->nusers > 0 ? bl->nusers : 1));
        bl->off = malloc(sizeof *bl->off * ((size_t)bl->nusers + 1u));
        if (bl->urow == NULL || bl->off == NULL) {
            free(last);
            goto oom;
        }
        bl->nusers = 0;
        bl->off[0] = 0;
        last[b] = UINT32_MAX;
    }
    for (size_t t = 0; t < n; t++) {
        size_t i = ord2[t];
        uint32_t b = ugroup[d->user[i]] * s->Q + igroup[d->item[i]];
        mf_block *bl = &s->blocks[b];
        if (last[b] != (uint32_t)ord[t]) {
            last[b] = (uint32_t)ord[t];
            bl->urow[bl->nusers++] = (uint32_t)ord[t];
            bl->off[bl->nusers] = bl->off[bl->nusers - 1u];
        }
        bl->off[bl->nusers]++;
        bl->n++;
    }
    free(last);
    free(cnt);
    free(ord);
    free(ord2);
    free(bcount);
    return 0;
oom:
    free(cnt);
    free(ord);
    free(ord2);
    free(bcount);
    return -1;
}
