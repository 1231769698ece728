/* dprec internal — reading the structs an app fills, whatever headers it was built with (include/dprec/version.h,
 * docs/sdk.md "Compatibility"). Each such struct starts with uint32_t struct_size, the app's sizeof. */
#ifndef DPREC_ABI_H
#define DPREC_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "config_check.h"

/* The most a struct may grow between the headers an app was built with and this library (a sanity bound: a
 * struct_size past it is not a struct of ours, and nothing past it is read). */
#define DPREC_ABI_MAX_GROWTH 1024u

/* The app's size of the struct at src: its struct_size, or base_size (the struct's 0.2.0 layout) when that is 0. */
size_t dprec_abi_app_size(const void *src, size_t base_size);

/* Copies the app's struct at src into dst (lib_size bytes: this library's sizeof), the fields the app does not know
 * zeroed (every field added after 0.2.0 means "as before" when zero), and sets dst's struct_size to lib_size.
 * base_size is the struct's size in 0.2.0 (the first layout with struct_size). DPREC_ERR_STRUCT_SIZE, dst
 * untouched, if the app's size is below base_size or beyond lib_size + DPREC_ABI_MAX_GROWTH, or if the app set a
 * byte past lib_size (a field of newer headers that this library would silently ignore). */
int dprec_abi_copy_in(void *dst, size_t lib_size, const void *src, size_t base_size);

/* The usual call: the struct's current size is its 0.2.0 size (no struct has grown since). When one grows, its
 * base size becomes offsetof(its type, its first new field) here, for that type only. */
#define DPREC_ABI_COPY_IN(dst, src) dprec_abi_copy_in((dst), sizeof *(dst), (src), sizeof *(dst))

#endif /* DPREC_ABI_H */
