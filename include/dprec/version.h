/* dprec — the version of these headers, and of the library at run time.
 *
 * This file is the single source of the version: CMake reads it (project(), the package version file, dprec.pc).
 * Compatibility (docs/sdk.md, "Compatibility"): while the major version is 0, each minor version may change the
 * ABI; patch versions never do. An app built against these headers checks the library it runs with:
 *
 *     if (dprec_version_number() / 100 != DPREC_VERSION_NUMBER / 100) ...  (another major.minor: do not use it)
 *
 * and the structs it fills carry their size (struct_size), so a library can tell which fields the app knows. */
#ifndef DPREC_VERSION_H
#define DPREC_VERSION_H

#include <stddef.h>

#include "dprec/export.h"

DPREC_BEGIN_DECLS

#define DPREC_VERSION_MAJOR 0
#define DPREC_VERSION_MINOR 2
#define DPREC_VERSION_PATCH 0
#define DPREC_VERSION_STRING "0.2.0"
/* major * 10000 + minor * 100 + patch: 200 for 0.2.0 */
#define DPREC_VERSION_NUMBER (DPREC_VERSION_MAJOR * 10000 + DPREC_VERSION_MINOR * 100 + DPREC_VERSION_PATCH)

/* The version of the library linked at run time, "major.minor.patch" (static storage, never NULL). */
DPREC_API const char *dprec_version(void);

/* The same as a number, major * 10000 + minor * 100 + patch. */
DPREC_API unsigned dprec_version_number(void);

/* ---- structs an app fills carry their size ------------------------------------------------------------------
 * dprec_config, dprec_allocator, dprec_port, dprec_net, dprec_verify_config, dprec_sync_config, dprec_transport,
 * dprec_curl_options, dprec_mbedtls_options and dprec_release_reader start with `uint32_t struct_size`: the sizeof
 * the app was compiled with. A library then reads only the fields the app knows (the others take their defaults), and refuses
 * (DPREC_ERR_STRUCT_SIZE) a struct from newer headers in which the app set a field this library does not have.
 * struct_size 0 means the layout of 0.2.0, the first with the member (so a struct zeroed with memset keeps
 * working); set it, with the init functions or DPREC_STRUCT_INIT, to use a field added later. docs/sdk.md,
 * "Compatibility". */

/* Zeroes size bytes at s and sets its leading uint32_t struct_size to size. */
DPREC_API void dprec_struct_init(void *s, size_t size);
#define DPREC_STRUCT_INIT(ptr) dprec_struct_init((ptr), sizeof *(ptr))

DPREC_END_DECLS

#endif /* DPREC_VERSION_H */
