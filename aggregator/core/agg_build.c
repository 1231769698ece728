/* dprec aggregator core — the builder: one thread that builds and signs release 1 of a large job, so that neither the
 * request's thread (the admin listener has one by default) nor the writer (every report's commit) waits for it. A
 * plain job at the size limit (m·d ≈ 64 M parameters: a 268 MB release) takes tens of seconds to build and sign; the
 * admin request that creates it waits on its suspended connection, and every other request is answered meanwhile.
 *
 * Work runs in submission order, one item at a time (two such builds at once would only double the memory). At
 * close, what is queued still runs, before the writer it submits to stops. Its own file: a thread with its own
 * queue, apart from the routes that use it. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdlib.h>

#include "agg_core.h"

typedef struct agg_work {
    void (*run)(void *arg);
    void *arg;
    struct agg_work *next;
} agg_work;

struct agg_builder {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    agg_work *head, *tail;
    int stop;
};

static void *builder_main(void *arg) {
    struct agg_builder *b = arg;
    pthread_setname_np(pthread_self(), "dprec-builder");
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (b->head == NULL && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
        agg_work *w = b->head;
        if (w == NULL) break; /* stopping, and nothing left */
        b->head = w->next;
        if (b->head == NULL) b->tail = NULL;
        pthread_mutex_unlock(&b->mu);
        w->run(w->arg);
        free(w);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int agg_builder_start(dprec_agg *a) {
    struct agg_builder *b = calloc(1, sizeof *b);
    if (b == NULL) return -1;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (pthread_create(&b->th, NULL, builder_main, b) != 0) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return -1;
    }
    a->builder = b;
    return 0;
}

void agg_builder_stop(dprec_agg *a) {
    struct agg_builder *b = a->builder;
    if (b == NULL) return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
    a->builder = NULL;
}

int agg_builder_submit(dprec_agg *a, void (*run)(void *arg), void *arg) {
    struct agg_builder *b = a->builder;
    agg_work *w = b != NULL ? calloc(1, sizeof *w) : NULL;
    if (w == NULL) return -1;
    w->run = run;
    w->arg = arg;
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        pthread_mutex_unlock(&b->mu);
        free(w);
        return -1;
    }
    if (b->tail != NULL) b->tail->next = w;
    else b->head = w;
    b->tail = w;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}
