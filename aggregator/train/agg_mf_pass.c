/* dprec aggregator core — one pass of the seed-003 solver (agg_mf_pass): the block scheduler (a thread takes a block
 * whose user group and item group no other thread holds, LIBMF's rule, so no row is written by two threads at once),
 * the threads that run the kernels of agg_mf_kernels.c over the blocks, and SGLD's second half-step, the prior's exact
 * drift and the Langevin noise over every row (agg_mf.h), with one noise stream per thread. Its own file because it
 * owns the threads and the pass's order, the only part of the solver that synchronizes. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "agg_mf_priv.h"
#include "dprec/status.h"

/* ---- the pass: the block scheduler and the threads ---------------------------------------------------------- */

typedef struct mf_pass {
    agg_mf *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *row_busy, *col_busy, *taken;
    uint32_t *order;
    uint32_t nb, started;
    float lr, boost; /* SGD's step; SGLD's step multiplier (1, or 1 / step in a warm-up pass) */
    double sse;      /* SGD: the sum of squared errors; SGLD: the sum of 2 beta w err times boost (mu's drift) */
} mf_pass;

/* A block whose user group and item group are free, in the pass's order; -1 when every block was taken. */
static int take_block(mf_pass *p) {
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->started == p->nb) {
            pthread_mutex_unlock(&p->mu);
            return -1;
        }
        for (uint32_t t = 0; t < p->nb; t++) {
            uint32_t b = p->order[t];
            if (p->taken[b] || p->row_busy[b / p->s->Q] || p->col_busy[b % p->s->Q]) continue;
            p->taken[b] = 1;
            p->row_busy[b / p->s->Q] = p->col_busy[b % p->s->Q] = 1;
            p->started++;
            pthread_mutex_unlock(&p->mu);
            return (int)b;
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
}

static void give_block(mf_pass *p, uint32_t b, double sse) {
    pthread_mutex_lock(&p->mu);
    p->row_busy[b / p->s->Q] = p->col_busy[b % p->s->Q] = 0;
    p->sse += sse;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *sweep_thread(void *arg) {
    mf_pass *p = arg;
    agg_mf *s = p->s;
    int b;
    while ((b = take_block(p)) >= 0) {
        const mf_block *bl = &s->blocks[b];
        double sse;
#ifdef MF_X86
        if (s->avx2)
            sse = s->cfg.method == AGG_MF_SGD ? agg_mf_sgd_block_avx2(s, bl, p->lr) : agg_mf_sgld_block_avx2(s, bl, p->boost);
        else
#endif
            sse = s->cfg.method == AGG_MF_SGD ? agg_mf_sgd_block_base(s, bl, p->lr) : agg_mf_sgld_block_base(s, bl, p->boost);
        give_block(p, (uint32_t)b, sse);
    }
    return NULL;
}

/* The prior's drift and the Langevin noise of one SGLD step, exactly (agg_mf.h), on rows [from, to) of the
 * concatenation users then items, with the thread's own stream. */
typedef struct mf_noise_job {
    agg_mf *s;
    agg_mf_stream *st;
    size_t from, to;
    double boost; /* > 0: a warm-up pass, the prior's drift at eta times boost and no noise */
} mf_noise_job;

static void *noise_thread(void *arg) {
    mf_noise_job *j = arg;
    agg_mf *s = j->s;
    enum { CHUNK = 4096 };
    float z[CHUNK];
    size_t have = 0, at = 0;
    const uint32_t k = s->k;
    for (size_t x = j->from; x < j->to; x++) {
        int user = x < s->users;
        uint32_t r = user ? (uint32_t)x : (uint32_t)(x - s->users);
        float *row = (user ? s->U : s->V) + (size_t)r * s->kp, *b = user ? &s->bu[r] : item_bias(s, r);
        const mf_ou *o = user ? &s->ou_u[r] : &s->ou_v[r];
        if (j->boost > 0.0) { /* warm-up: descent, no noise */
            const float a = (float)exp(-(double)o->eta * j->boost / (s->cfg.prior_sd * s->cfg.prior_sd));
            for (uint32_t c = 0; c < k; c++) row[c] *= a;
            *b *= (float)exp(-(double)o->eta_b * j->boost / (s->cfg.bias_prior_sd * s->cfg.bias_prior_sd));
            continue;
        }
        if (have - at < k + 1u) { /* normals in chunks; the few left over are wiped, never reused */
            agg_mf_stream_normals(j->st, z, CHUNK);
            have = CHUNK;
            at = 0;
        }
        const float a = o->a, sd = o->s;
        for (uint32_t c = 0; c < k; c++) row[c] = a * row[c] + sd * z[at + c];
        *b = o->a_b * *b + o->s_b * z[at + k];
        at += k + 1u;
    }
    dprec_wipe(z, sizeof z);
    return NULL;
}

static void run_threads(unsigned nthreads, void *(*fn)(void *), void *args, size_t argsize) {
    pthread_t th[AGG_MF_MAX_THREADS];
    unsigned char started[AGG_MF_MAX_THREADS] = {0};
    for (unsigned t = 1; t < nthreads; t++)
        started[t] = pthread_create(&th[t], NULL, fn, (char *)args + t * argsize) == 0;
    fn(args);
    for (unsigned t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(th[t], NULL);
        else fn((char *)args + t * argsize); /* a thread that did not start: its share runs here */
}

int agg_mf_pass(agg_mf *s, dprec_rng *rng, double *train_sse, char *err, size_t errcap) {
    const unsigned T = s->cfg.threads;
    if (s->cfg.method == AGG_MF_SGLD && !s->keyed) {
        if (rng == NULL) return fail(err, errcap, "SGLD needs the CSPRNG for its noise");
        for (unsigned t = 0; t < T; t++)
            if (agg_mf_stream_seed(&s->streams[t], rng) != DPREC_OK) return fail(err, errcap, "the CSPRNG failed");
        s->keyed = 1;
    }
    mf_pass p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.nb = s->P * s->Q;
    p.lr = (float)(s->cfg.lr / (1.0 + s->cfg.lr_decay * (double)s->passes));
    const int warm = s->cfg.method == AGG_MF_SGLD && s->passes < s->cfg.warmup;
    p.boost = warm ? (float)(1.0 / s->cfg.step) : 1.0f;
    p.row_busy = calloc(s->P, 1);
    p.col_busy = calloc(s->Q, 1);
    p.taken = calloc(p.nb, 1);
    p.order = malloc(sizeof *p.order * p.nb);
    if (p.row_busy == NULL || p.col_busy == NULL || p.taken == NULL || p.order == NULL) {
        free(p.row_busy), free(p.col_busy), free(p.taken), free(p.order);
        return fail(err, errcap, "out of memory");
    }
    uint64_t os = s->cfg.seed ^ (0x5851f42d4c957f2dull * (s->passes + 1u)); /* public: the blocks' order */
    for (uint32_t b = 0; b < p.nb; b++) p.order[b] = b;
    for (uint32_t b = p.nb; b > 1; b--) {
        uint32_t c = (uint32_t)(splitmix64(&os) % b), t = p.order[b - 1];
        p.order[b - 1] = p.order[c];
        p.order[c] = t;
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    {
        pthread_t th[AGG_MF_MAX_THREADS];
        unsigned char started[AGG_MF_MAX_THREADS] = {0};
        for (unsigned t = 1; t < T; t++) started[t] = pthread_create(&th[t], NULL, sweep_thread, &p) == 0;
        sweep_thread(&p); /* returns once every block was taken; the others finish theirs */
        for (unsigned t = 1; t < T; t++)
            if (started[t]) pthread_join(th[t], NULL);
    }
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    free(p.row_busy), free(p.col_busy), free(p.taken), free(p.order);
    if (s->cfg.method == AGG_MF_SGLD) {
        mf_noise_job jobs[AGG_MF_MAX_THREADS];
        size_t rows = (size_t)s->users + s->items;
        for (unsigned t = 0; t < T; t++)
            jobs[t] = (mf_noise_job){s, &s->streams[t], rows * t / T, rows * (t + 1u) / T, warm ? (double)p.boost : 0.0};
        if (s->cfg.mu_prior_sd > 0.0) {
            /* mu: its data drift from the pass's errors at its own step (never boosted: every rating moves it, so a
             * warm-up Newton step would overshoot together with the biases), then its prior's exact step and noise
             * (drawn here, before the rows' noise threads use the streams) */
            const double m0 = s->cfg.mu, sm2 = s->cfg.mu_prior_sd * s->cfg.mu_prior_sd;
            s->mu += s->eta_mu * p.sse / (double)p.boost;
            if (warm) {
                s->mu = m0 + (s->mu - m0) * exp(-s->eta_mu / sm2);
            } else {
                float z;
                agg_mf_stream_normals(&s->streams[0], &z, 1);
                s->mu = m0 + s->a_mu * (s->mu - m0) + s->s_mu * (double)z;
                dprec_wipe(&z, sizeof z);
            }
        }
        run_threads(T, noise_thread, jobs, sizeof jobs[0]);
    }
    s->passes++;
    if (train_sse != NULL) *train_sse = s->cfg.method == AGG_MF_SGD ? p.sse : NAN;
    return 0;
}
