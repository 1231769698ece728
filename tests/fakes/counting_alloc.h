/* Test helper: allocator hooks that count blocks and bytes (current and peak) and can fail the Nth call. */
#ifndef DPREC_COUNTING_ALLOC_H
#define DPREC_COUNTING_ALLOC_H

#include <stddef.h>

#include "dprec/dprec.h"

typedef struct counting_alloc {
    size_t allocs, frees;
    size_t bytes, peak;
    size_t fail_at; /* the Nth alloc (1-based) returns NULL; 0 = never */
} counting_alloc;

/* Hooks over c with the given cap. */
dprec_allocator counting_alloc_hooks(counting_alloc *c, size_t cap);

#endif
