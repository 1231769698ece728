/* dprec internal — what the portable SDK assumes of its compiler and target, checked when it is compiled, so
 * that a build breaking an assumption stops instead of misbehaving (the idea of mbedTLS's check_config.h).
 *
 * Included by the SDK's internal headers (bytes.h, client_priv.h, accountant.h, noise.h, json.h, linalg.h,
 * topk.h) and so by every file that checks a float: a whole-library build with one of the options below fails
 * at its first file. */
#ifndef DPREC_CONFIG_CHECK_H
#define DPREC_CONFIG_CHECK_H

#include <float.h>
#include <limits.h>

/* Releases, stores and reports carry IEEE-754 binary32 and binary64 bit patterns, which bytes.h copies
 * straight into float and double. */
#if CHAR_BIT != 8
#error "dprec needs 8-bit bytes"
#endif
#if FLT_RADIX != 2 || FLT_MANT_DIG != 24 || FLT_MAX_EXP != 128 || DBL_MANT_DIG != 53 || DBL_MAX_EXP != 1024
#error "dprec needs IEEE-754 binary32 float and binary64 double"
#endif
_Static_assert(sizeof(float) == 4 && sizeof(double) == 8, "dprec needs 4-byte float and 8-byte double");

/* Fast math: -ffast-math, -Ofast and -ffinite-math-only let the compiler assume that no value is NaN or
 * infinite, and so delete the checks that refuse such values (x == x, isnan, isfinite: a NaN lambda, rating or
 * privacy parameter would be accepted). The SDK's privacy and input checks depend on them. Compile the SDK
 * without these options; an app may still use them for its own files. */
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "dprec must not be compiled with -ffast-math, -Ofast or -ffinite-math-only: they delete its NaN and infinity checks"
#endif

#endif /* DPREC_CONFIG_CHECK_H */
