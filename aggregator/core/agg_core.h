/* dprec aggregator core — the top layer's own declarations (not API): what core/'s files share, and what the relay
 * and `dprec-aggregator train` take from it.
 *
 * core/ is the assembly and the request layer (docs/architecture.md): agg.c (the core's lifetime, /metrics),
 * agg_requests.c (routes, validation, the answers), agg_build.c (release 1 of large jobs, on a thread of its own)
 * and agg_transport.c (the in-process transport). It may call every
 * layer below: the round engine (rounds/agg_rounds.h, agg_sign.h, agg_secure.h), the protocols
 * (protocols/agg_protocol.h), the store's reads (state/agg_store.h) and the base (base/agg_base.h). */
#ifndef DPREC_AGG_CORE_H
#define DPREC_AGG_CORE_H

#include <stddef.h>

#include "agg.h"
#include "base/agg_base.h"

/* agg.c: a dprec_agg with only a CSPRNG (from the OS) and, when key_path is not NULL, the signing key at key_path
 * (generated 0600 if missing), for agg_release_build and agg_random outside a running aggregator (`dprec-aggregator
 * train`). 0, or -1 with a message. Closed with agg_signer_close (NULL: no-op), never dprec_agg_close. */
int agg_signer_open(const char *key_path, dprec_agg **out, char *err, size_t errcap);
void agg_signer_close(dprec_agg *a);
/* The request counters: a refused report by its error code; the index of an HTTP status (agg_status_codes; the last
 * slot counts the others). */
void agg_count_reject(dprec_agg *a, const char *code);
int agg_status_slot(int status);

/* agg_build.c: the builder thread of release 1 of large jobs (started by dprec_agg_open, stopped by dprec_agg_close
 * after running what is queued, before the writer stops). submit: run(arg) on the builder, in order; 0, or -1 (no
 * builder, out of memory, stopping: run is not called). */
int agg_builder_start(dprec_agg *a);
void agg_builder_stop(dprec_agg *a);
int agg_builder_submit(dprec_agg *a, void (*run)(void *arg), void *arg);

/* agg_transport.c: an in-process transport's request, handed to a core's blocking handler (dprec_agg_handle, or
 * the relay's); the response body goes to the sink in pieces of chunk bytes (0: whole). A dprec status. */
int agg_transport_forward(int (*handler)(void *core, const dprec_agg_request *, dprec_agg_response *), void *core,
                          size_t chunk, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                          dprec_http_response *resp);

#endif /* DPREC_AGG_CORE_H */
