/* dprec — the library's version at run time (include/dprec/version.h). The values are compiled into the library,
 * so an app can compare them with the DPREC_VERSION_* of the headers it was built against. */
#include "dprec/version.h"

#include "config_check.h"

_Static_assert(DPREC_VERSION_MINOR < 100 && DPREC_VERSION_PATCH < 100, "DPREC_VERSION_NUMBER packs two digits each");

const char *dprec_version(void) {
    return DPREC_VERSION_STRING;
}

unsigned dprec_version_number(void) {
    return (unsigned)DPREC_VERSION_NUMBER;
}
