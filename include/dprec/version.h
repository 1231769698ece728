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

DPREC_END_DECLS

#endif /* DPREC_VERSION_H */
