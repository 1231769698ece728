/* dprec — export macro and C++ guards shared by every public header. */
#ifndef DPREC_EXPORT_H
#define DPREC_EXPORT_H

#if defined(_WIN32) && defined(DPREC_SHARED)
#  if defined(DPREC_BUILDING)
#    define DPREC_API __declspec(dllexport)
#  else
#    define DPREC_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define DPREC_API __attribute__((visibility("default")))
#else
#  define DPREC_API
#endif

#ifdef __cplusplus
#  define DPREC_BEGIN_DECLS extern "C" {
#  define DPREC_END_DECLS }
#else
#  define DPREC_BEGIN_DECLS
#  define DPREC_END_DECLS
#endif

#endif /* DPREC_EXPORT_H */
