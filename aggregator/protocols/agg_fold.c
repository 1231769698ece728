/* dprec aggregator core — round sums in fixed point: what a protocol whose global step is a sum of reports folds each
 * report into (agg_protocol.h, "fold"), and what the round engine keeps, checkpoints and adds up across instances.
 *
 * Why integers (docs/notes/streaming-sums.md): a round's sum is made of shards (instances, checkpoints, a log replayed
 * after kill -9) added in any order. Floating-point addition is not associative, so such a sum would depend on the
 * order; int64 addition is. Every value a report adds is quantized first, toward zero, to the grid 2^-F:
 *     q(v) = trunc(v 2^F),  sum_i = sum over reports of q(v_i),  value_i = sum_i 2^-F,
 * so any order and any sharding give the same integers, bit for bit. Toward zero, not to nearest: |q(v)| <= |v| for
 * each coordinate, so a report's quantized contribution has an L2 norm no larger than its clipped one, and the
 * sensitivity the central protocols calibrate their noise to still holds unchanged. The error of a sum of n reports
 * is below n 2^-F per coordinate.
 *
 * F = 31 - ceil(log2 bound) (clamped to 0..40): one report moves a coordinate by at most bound 2^F <= 2^31 grid units,
 * so 2^32 - 1 reports always fit int64 (below 2^63; a bound above 2^31, where F is clamped to 0, fits fewer); every
 * add is checked, and an overflow marks the sum (its finalization then fails, clearly). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_protocol.h"
#include "bytes.h"

#define SUM_MAGIC 0x31535044u /* "DPS1" little-endian */
#define SUM_HEAD 24u          /* magic u32, frac_bits u32, coords u64, count u64 */

int agg_sum_frac_bits(double bound) {
    if (!(bound > 0.0) || !isfinite(bound)) return 31;
    int e = (int)ceil(log2(bound));
    int f = 31 - e;
    return f < 0 ? 0 : f > 40 ? 40 : f;
}

int agg_sum_init(agg_sum *s, const agg_fold_spec *spec) {
    memset(s, 0, sizeof *s);
    if (spec->coords == 0 || spec->coords > ((uint64_t)1 << 32)) return -1;
    s->q = calloc((size_t)spec->coords, sizeof *s->q);
    if (s->q == NULL) return -1;
    s->coords = spec->coords;
    s->frac_bits = agg_sum_frac_bits(spec->bound);
    s->scale = ldexp(1.0, s->frac_bits);
    return 0;
}

void agg_sum_free(agg_sum *s) {
    if (s == NULL) return;
    free(s->q);
    memset(s, 0, sizeof *s);
}

void agg_sum_zero(agg_sum *s) {
    if (s->q != NULL) memset(s->q, 0, (size_t)s->coords * sizeof *s->q);
    s->count = 0;
    s->overflow = 0;
}

void agg_sum_put(agg_sum *s, uint64_t i, double v) {
    /* v 2^F is exact (a power of two scales the exponent only, far from under- or overflow here); the conversion to
     * int64 truncates toward zero (C11 6.3.1.4); a NaN, an infinity or a value past int64 fails the range test */
    const double t = v * s->scale;
    if (i >= s->coords || !(t > -9.2e18 && t < 9.2e18)) {
        s->overflow = 1; /* never silently dropped: the round fails, clearly */
        return;
    }
    if (__builtin_add_overflow(s->q[i], (int64_t)t, &s->q[i])) s->overflow = 1;
}

int agg_sum_add(agg_sum *into, const agg_sum *from) {
    if (into->coords != from->coords || into->frac_bits != from->frac_bits) return -1;
    for (uint64_t i = 0; i < into->coords; i++)
        if (__builtin_add_overflow(into->q[i], from->q[i], &into->q[i])) into->overflow = 1;
    into->count += from->count;
    into->overflow |= from->overflow;
    return 0;
}

double agg_sum_value(const agg_sum *s, uint64_t i) {
    return ldexp((double)s->q[i], -s->frac_bits);
}

size_t agg_sum_encoded_size(const agg_sum *s) {
    return SUM_HEAD + (size_t)s->coords * 8u;
}

void agg_sum_encode(const agg_sum *s, unsigned char *out) {
    dprec_st32(out, SUM_MAGIC);
    dprec_st32(out + 4, (uint32_t)s->frac_bits);
    dprec_st64(out + 8, s->coords);
    dprec_st64(out + 16, s->count);
    for (uint64_t i = 0; i < s->coords; i++) dprec_st64(out + SUM_HEAD + 8 * (size_t)i, (uint64_t)s->q[i]);
}

int agg_sum_add_encoded(agg_sum *into, const unsigned char *b, size_t len) {
    if (len != agg_sum_encoded_size(into) || dprec_ld32(b) != SUM_MAGIC || dprec_ld32(b + 4) != (uint32_t)into->frac_bits ||
        dprec_ld64(b + 8) != into->coords)
        return -1;
    uint64_t count = dprec_ld64(b + 16);
    for (uint64_t i = 0; i < into->coords; i++)
        if (__builtin_add_overflow(into->q[i], (int64_t)dprec_ld64(b + SUM_HEAD + 8 * (size_t)i), &into->q[i]))
            into->overflow = 1;
    into->count += count;
    return 0;
}

int agg_fold_job(const agg_job *job, agg_fold_spec *spec) {
    if (job->proto == NULL || job->proto->fold_spec == NULL || job->proto->fold == NULL || job->proto->sum_step == NULL)
        return 0;
    return job->proto->fold_spec(job, spec) == 1;
}

int agg_fold_report(const agg_job *job, const unsigned char *payload, size_t len, agg_sum *sum) {
    if (job->proto->fold(job, payload, len, sum) != 0) return -1;
    sum->count++;
    return 0;
}

int agg_fold_step(const agg_job *job, const agg_model *prev, const agg_report *reports, size_t n, dprec_rng *rng,
                  agg_model *next, char *err, size_t errcap) {
    agg_fold_spec spec;
    agg_sum sum;
    if (!agg_fold_job(job, &spec)) {
        snprintf(err, errcap, "%s: this job has no round sum (its parameters are out of range)", job->proto->name);
        return -1;
    }
    if (agg_sum_init(&sum, &spec) != 0) {
        snprintf(err, errcap, "out of memory for the round's sum");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (agg_fold_report(job, reports[i].payload, reports[i].payload_len, &sum) != 0) {
            agg_sum_free(&sum);
            snprintf(err, errcap, "a stored report does not fold");
            return -1;
        }
    int rc = agg_fold_sum_step(job, prev, &sum, rng, next, err, errcap);
    agg_sum_free(&sum);
    return rc;
}

int agg_fold_sum_step(const agg_job *job, const agg_model *prev, const agg_sum *sum, dprec_rng *rng, agg_model *next,
                      char *err, size_t errcap) {
    if (sum->overflow) {
        snprintf(err, errcap, "the round's sum overflowed its fixed-point range (more than 2^32 reports?)");
        return -1;
    }
    return job->proto->sum_step(job, prev, sum, rng, next, err, errcap);
}
