#include "counting_alloc.h"

#include <stdlib.h>
#include <string.h>

/* Each block carries its size in a 16-byte prefix, so frees can be subtracted. */
static void *ca_alloc(void *user, size_t size) {
    counting_alloc *c = user;
    if (c->fail_at != 0 && c->allocs + 1 == c->fail_at) {
        c->allocs++;
        return NULL;
    }
    unsigned char *p = malloc(size + 16);
    if (p == NULL) return NULL;
    memcpy(p, &size, sizeof size);
    c->allocs++;
    c->bytes += size;
    if (c->bytes > c->peak) c->peak = c->bytes;
    return p + 16;
}

static void ca_free(void *user, void *ptr) {
    counting_alloc *c = user;
    if (ptr == NULL) return;
    unsigned char *p = (unsigned char *)ptr - 16;
    size_t size;
    memcpy(&size, p, sizeof size);
    c->frees++;
    c->bytes -= size;
    free(p);
}

dprec_allocator counting_alloc_hooks(counting_alloc *c, size_t cap) {
    dprec_allocator a = {sizeof(dprec_allocator), ca_alloc, ca_free, c, cap};
    return a;
}
