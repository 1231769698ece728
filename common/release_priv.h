/* dprec internal — what the local step needs of the release format beyond include/dprec/release.h: a row's size
 * and its decoding, for each encoding (common/release.c). */
#ifndef DPREC_RELEASE_PRIV_H
#define DPREC_RELEASE_PRIV_H

#include <stdint.h>

#include "config_check.h"
#include "dprec/release.h"

/* Bytes per body row of a release with these (valid) flags and d, without its columns (format 3). */
uint32_t dprec_release_row_size(uint32_t dim, uint16_t flags);

/* Bytes from one row to the next of a release whose header was parsed into *info: the row and its columns. */
uint32_t dprec_release_stride(const dprec_release_info *info);

/* Checks the values of the row at p (the bias, and the float32 values or a compact row's scale and integers) and
 * decodes it into *bias (0 without biases) and row[0..d): DPREC_ERR_RELEASE_VALUE if a value is past what a verified
 * release can hold. */
int dprec_release_decode_row(const unsigned char *p, uint32_t dim, uint16_t flags, float *bias, float *row);

#endif /* DPREC_RELEASE_PRIV_H */
