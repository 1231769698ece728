/* dprec aggregator — the in-process transport (agg.h): device requests handed to dprec_agg_handle (or, through
 * agg_transport_forward, to another core's blocking handler). */
#include <stdio.h>
#include <string.h>

#include "agg.h"
#include "agg_core.h"
#include "dprec/status.h"

/* agg_core.h; the relay's in-process transport (relay/relay.c) uses it too. */
int agg_transport_forward(int (*handler)(void *core, const dprec_agg_request *, dprec_agg_response *), void *core,
                          size_t chunk, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                          dprec_http_response *resp) {
    char auth[160];
    dprec_agg_request r;
    memset(&r, 0, sizeof r);
    r.listener = DPREC_LISTENER_DEVICE;
    r.method = req->method;
    r.path = req->path;
    if (req->bearer != NULL) {
        int n = snprintf(auth, sizeof auth, "Bearer %s", req->bearer);
        if (n < 0 || (size_t)n >= sizeof auth) return DPREC_ERR_INVALID_ARGUMENT;
        r.authorization = auth;
    }
    r.body = req->body;
    r.body_len = req->body_len;
    dprec_agg_response out;
    memset(&out, 0, sizeof out);
    if (handler(core, &r, &out) != 0) {
        dprec_agg_response_free(&out);
        return DPREC_ERR_NETWORK; /* no response could be produced: as if the network failed */
    }
    resp->status = out.status;
    resp->retry_after = out.retry_after;
    int rc = DPREC_OK;
    size_t step = chunk > 0 ? chunk : out.body_len;
    for (size_t off = 0; sink != NULL && off < out.body_len && rc == DPREC_OK; off += step) {
        size_t n = out.body_len - off < step ? out.body_len - off : step;
        rc = sink(sink_user, out.body + off, n);
    }
    dprec_agg_response_free(&out);
    return rc;
}

static int agg_handler(void *core, const dprec_agg_request *req, dprec_agg_response *resp) {
    return dprec_agg_handle(core, req, resp);
}

static int agg_transport_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                                 dprec_http_response *resp) {
    const dprec_agg_transport *st = ctx;
    return agg_transport_forward(agg_handler, st->agg, st->chunk, req, sink, sink_user, resp);
}

void dprec_agg_transport_init(dprec_transport *t, dprec_agg_transport *state, dprec_agg *a, size_t chunk) {
    state->agg = a;
    state->chunk = chunk;
    DPREC_STRUCT_INIT(t);
    t->ctx = state;
    t->request = agg_transport_request;
}
