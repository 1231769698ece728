/* dprec internal — the one allocator seam. A heap is either an arena carved from the app's buffer (bump
 * allocation, nothing freed until the client goes) or the app's hooks under a hard cap. Every block is
 * 16-byte aligned and zeroed. Only dprec_client_init allocates. */
#ifndef DPREC_ALLOC_H
#define DPREC_ALLOC_H

#include <stddef.h>

#include "dprec/dprec.h"

#define DPREC_HEAP_ALIGN 16u
#define DPREC_HEAP_MAX_BLOCKS 16u

typedef struct dprec_heap {
    int use_hooks;
    unsigned char *base; /* arena: aligned start */
    size_t size;         /* arena: usable bytes from base */
    size_t used;         /* bytes handed out, including alignment padding (arena) or block sizes (hooks) */
    dprec_allocator hooks;
    void *blocks[DPREC_HEAP_MAX_BLOCKS]; /* hooks: what to give back */
    unsigned nblocks;
} dprec_heap;

/* Rounds n up to the heap alignment; returns 0 on overflow. */
size_t dprec_heap_round(size_t n);

void dprec_heap_init_arena(dprec_heap *h, void *mem, size_t size);
void dprec_heap_init_hooks(dprec_heap *h, const dprec_allocator *hooks);

/* A zeroed, aligned block of size bytes, or NULL (arena exhausted, cap reached, hook failed). */
void *dprec_heap_alloc(dprec_heap *h, size_t size);

/* Returns every hook-allocated block (arena: nothing to do). The heap may live inside a block. */
void dprec_heap_release(dprec_heap *h);

#endif /* DPREC_ALLOC_H */
