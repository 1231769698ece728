/* dprec — the structs an app fills, read by the size the app compiled them with (common/abi.h). The idea is Linux's
 * copy_struct_from_user (openat2, clone3): a smaller struct gets the newer fields' defaults (zero), a larger one
 * is accepted only if every byte this library does not know is zero. */
#include "abi.h"

#include <string.h>

#include "dprec/status.h"
#include "dprec/version.h"

void dprec_struct_init(void *s, size_t size) {
    if (s == NULL || size < sizeof(uint32_t) || size > UINT32_MAX) return;
    memset(s, 0, size);
    uint32_t n = (uint32_t)size;
    memcpy(s, &n, sizeof n);
}

size_t dprec_abi_app_size(const void *src, size_t base_size) {
    uint32_t n;
    memcpy(&n, src, sizeof n);
    return n == 0 ? base_size : (size_t)n;
}

int dprec_abi_copy_in(void *dst, size_t lib_size, const void *src, size_t base_size) {
    size_t app = dprec_abi_app_size(src, base_size);
    if (app < base_size || app > lib_size + DPREC_ABI_MAX_GROWTH) return DPREC_ERR_STRUCT_SIZE;
    const unsigned char *s = (const unsigned char *)src;
    for (size_t i = lib_size; i < app; i++)
        if (s[i] != 0) return DPREC_ERR_STRUCT_SIZE;
    size_t known = app < lib_size ? app : lib_size;
    memmove(dst, src, known);
    memset((unsigned char *)dst + known, 0, lib_size - known);
    uint32_t n = (uint32_t)lib_size;
    memcpy(dst, &n, sizeof n);
    return DPREC_OK;
}
