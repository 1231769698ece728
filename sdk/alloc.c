/* dprec — the allocator seam (see alloc.h). The only file in sdk/ that obtains memory. */
#include "alloc.h"

#include <stdint.h>
#include <string.h>

size_t dprec_heap_round(size_t n) {
    if (n > SIZE_MAX - (DPREC_HEAP_ALIGN - 1)) return 0;
    return (n + DPREC_HEAP_ALIGN - 1) & ~(size_t)(DPREC_HEAP_ALIGN - 1);
}

void dprec_heap_init_arena(dprec_heap *h, void *mem, size_t size) {
    memset(h, 0, sizeof *h);
    uintptr_t p = (uintptr_t)mem;
    size_t pad = (size_t)((DPREC_HEAP_ALIGN - (p % DPREC_HEAP_ALIGN)) % DPREC_HEAP_ALIGN);
    if (mem == NULL || size < pad) return; /* size stays 0: every allocation fails */
    h->base = (unsigned char *)mem + pad;
    h->size = size - pad;
}

void dprec_heap_init_hooks(dprec_heap *h, const dprec_allocator *hooks) {
    memset(h, 0, sizeof *h);
    h->use_hooks = 1;
    h->hooks = *hooks;
}

void *dprec_heap_alloc(dprec_heap *h, size_t size) {
    size_t n = dprec_heap_round(size);
    if (n == 0) return NULL;
    void *p;
    if (!h->use_hooks) {
        if (h->base == NULL || n > h->size - h->used) return NULL;
        p = h->base + h->used;
    } else {
        if (h->nblocks == DPREC_HEAP_MAX_BLOCKS || n > h->hooks.cap - h->used || h->used > h->hooks.cap)
            return NULL;
        p = h->hooks.alloc(h->hooks.user, n);
        if (p == NULL) return NULL;
        /* The hooks promise alignment for any type; we rely on it for doubles and mbedTLS contexts. */
        h->blocks[h->nblocks++] = p;
    }
    h->used += n;
    memset(p, 0, n);
    return p;
}

void dprec_heap_release(dprec_heap *h) {
    if (!h->use_hooks) return;
    /* Copy first: the heap itself may live in one of the blocks we are about to free. */
    dprec_heap copy = *h;
    memset(h, 0, sizeof *h);
    for (unsigned i = copy.nblocks; i-- > 0;) copy.hooks.free(copy.hooks.user, copy.blocks[i]);
}
