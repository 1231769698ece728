/* dprec internal — the client object, shared by client.c, store.c and recommend.c. */
#ifndef DPREC_CLIENT_PRIV_H
#define DPREC_CLIENT_PRIV_H

#include <stdint.h>

#include "alloc.h"
#include "crypto.h"
#include "dprec/dprec.h"
#include "topk.h"

#define DPREC_STORE_NAME_MAX 48 /* prefix + ".tmp" must fit DPREC_PORT_NAME_MAX */
#define DPREC_MAX_CAPACITY 1000000u
#define DPREC_MAX_K 10000u

/* Store file v1: header, payload of sections, trailer (see store.c for the byte layout). */
#define DPREC_STORE_HEADER_SIZE 48u
#define DPREC_STORE_SECTION_HEADER 8u
#define DPREC_STORE_RATINGS_PREFIX 8u
#define DPREC_STORE_RECORD_SIZE 16u
#define DPREC_STORE_TRAILER_MAX 32u

typedef enum stream_mode { STREAM_NONE = 0, STREAM_FIT = 1, STREAM_TOPK = 2 } stream_mode;

struct dprec_client {
    dprec_heap heap; /* first: dprec_client_free copies it out before releasing */
    dprec_config cfg;
    char store_name[DPREC_STORE_NAME_MAX];
    dprec_port port;
    int last_cause;

    dprec_rng rng;
    dprec_gcm gcm; /* keyed only when cfg.encrypt_at_rest */

    /* store */
    dprec_rating *ratings; /* sorted by item, count of them valid */
    uint32_t count;
    uint64_t generation;   /* of the state held in memory (0: never saved) */
    unsigned char *image;  /* file image buffer, image_cap bytes */
    size_t image_cap;

    /* local step */
    double *a; /* d*d normal equations */
    double *b; /* d */
    float *u;  /* d: the fitted user vector */
    int fitted;
    unsigned char fitted_digest[DPREC_RELEASE_DIGEST_SIZE];
    float fitted_mu;

    /* streaming over a release */
    stream_mode stream;
    dprec_release_reader reader;
    dprec_recommendation *topk_slots; /* max_k */
    dprec_topk topk;
    uint32_t cursor; /* rated-item cursor: rows arrive in item order, ratings are sorted */
};

/* Sets c->last_cause from the port (for I/O errors) and passes status through. */
int dprec_client_port_error(dprec_client *c, int status);

/* Logs "dprec: <a><b>" through the port's optional log sink (no formatting library: sdk/ has no printf). */
void dprec_client_log(const dprec_client *c, dprec_log_level level, const char *a, const char *b);

/* Binary search in the sorted ratings: index of item, or -(insertion point) - 1. */
int64_t dprec_store_find(const dprec_client *c, uint32_t item);

/* Size of the store's file image for a capacity. */
size_t dprec_store_image_size(uint32_t capacity);

#endif /* DPREC_CLIENT_PRIV_H */
