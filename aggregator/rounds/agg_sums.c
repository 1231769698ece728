/* dprec aggregator core — folded rounds: this instance's shard of each open round's sum, kept by the writer as reports
 * commit, checkpointed into the state, and the round's whole sum read back for its finalization
 * (docs/notes/streaming-sums.md).
 *
 * What is durable, and when. A report's bytes are a log row of this instance, written in its batch's transaction with
 * its dedup row (agg_engine.c: acknowledged after that commit). The writer then folds the report into the slot's
 * accumulator, in memory: the instance's last checkpoint plus every log row it wrote since. When those log rows pass
 * the sum's encoded size, the accumulator is checkpointed: its row and the deletion of the log rows it covers commit
 * in one transaction, so every acknowledged report is always in exactly one checkpoint or in the log, and the log of
 * an instance stays under the sum's size plus one batch. A kill -9 loses only the memory: the next time the writer
 * needs the accumulator it rebuilds it from the state (its checkpoint and its log rows), and the finalization reads the
 * state, never the memory: every instance's checkpoint plus every log row, whoever wrote it, alive or dead.
 *
 * The sums are integers (protocols/agg_fold.c), so shards added in any order give the same sum, bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agg_engine_priv.h"
#include "report.h"
#include "protocols/agg_protocol.h"
#include "state/agg_store.h"

void agg_sums_drop(agg_slot *s) {
    if (s->acc != NULL) {
        agg_sum_free(s->acc);
        free(s->acc);
    }
    s->acc = NULL;
    s->acc_round = 0;
    s->log_bytes = 0;
}

/* Adds stored shards (checkpoints, log rows) to sum; *log_bytes (may be NULL) gets the log rows' bytes. 0 or -1. */
static int add_shards(const agg_job *job, agg_sum *sum, const agg_store_shards *sh, const agg_store_reports *log,
                      size_t *log_bytes) {
    for (size_t i = 0; i < sh->n; i++)
        if (agg_sum_add_encoded(sum, sh->b[i], sh->len[i]) != 0) return -1; /* another shape: a damaged state */
    size_t bytes = 0;
    for (size_t i = 0; i < log->n; i++) {
        if (agg_fold_report(job, log->r[i].payload, log->r[i].payload_len, sum) != 0) return -1;
        bytes += log->r[i].payload_len + DPREC_ENVELOPE_HEADER; /* the row holds the whole envelope */
    }
    if (log_bytes != NULL) *log_bytes = bytes;
    return 0;
}

int agg_sums_prepare(dprec_agg *a, agg_slot *s) {
    agg_fold_spec spec;
    if (s->acc != NULL && s->acc_round == s->job.round) return 0; /* ready: the common case, checked first */
    if (s->raw) return 0;
    if (!agg_fold_job(&s->job, &spec)) {
        s->raw = 1; /* not asked again for every report (a protocol's fold_spec may parse the job's params) */
        return 0;
    }
    agg_sums_drop(s);
    agg_sum *acc = malloc(sizeof *acc);
    if (acc == NULL || agg_sum_init(acc, &spec) != 0) {
        free(acc);
        return -1;
    }
    /* rebuilt from what this instance stored of the round before (a restart, or a round it saw begin elsewhere) */
    agg_store_reports log;
    agg_store_shards sh;
    size_t bytes = 0;
    int rc = agg_store_shard_load(a, s->job.id, s->job.round, &log, &sh);
    if (rc == 0) rc = add_shards(&s->job, acc, &sh, &log, &bytes);
    agg_store_reports_free(&log);
    agg_store_shards_free(&sh);
    if (rc != 0) {
        agg_sum_free(acc);
        free(acc);
        return -1;
    }
    s->acc = acc;
    s->acc_round = s->job.round;
    s->log_bytes = bytes;
    return 0;
}

void agg_sums_committed(dprec_agg *a, agg_slot *s, int64_t round, const unsigned char *bytes, size_t len) {
    (void)a;
    if (s->acc == NULL || s->acc_round != round) return;
    dprec_envelope e;
    if (dprec_envelope_parse(bytes, len, &e) != DPREC_OK ||
        agg_fold_report(&s->job, e.payload, e.payload_len, s->acc) != 0) {
        /* validated at intake, so never; were it to happen, the memory no longer matches the log: rebuilt from the
         * state at the next use, and no checkpoint is written from it */
        agg_sums_drop(s);
        return;
    }
    s->log_bytes += len; /* the log row holds the whole envelope */
}

void agg_sums_checkpoint(dprec_agg *a, agg_slot *s) {
    /* keep_report_payloads keeps the log whole: the finalization then folds every report from it */
    if (s->acc == NULL || a->cfg.keep_report_payloads || s->job.done || s->acc_round != s->job.round ||
        s->log_bytes < agg_sum_encoded_size(s->acc))
        return;
    size_t len = agg_sum_encoded_size(s->acc);
    unsigned char *b = malloc(len);
    if (b == NULL) return; /* the log keeps the reports: the next batch tries again */
    agg_sum_encode(s->acc, b);
    if (agg_store_shard_checkpoint(a, s->job.id, s->acc_round, b, len, (int64_t)s->acc->count) == 0) {
        s->log_bytes = 0;
        pthread_mutex_lock(&a->m_mu);
        a->metrics.sum_checkpoints++;
        pthread_mutex_unlock(&a->m_mu);
    }
    free(b);
}

int agg_sums_round(dprec_agg *a, const agg_job *job, int64_t round, agg_model *prev, agg_sum *sum, char *err,
                   size_t errcap) {
    agg_fold_spec spec;
    if (!agg_fold_job(job, &spec) || agg_sum_init(sum, &spec) != 0) {
        snprintf(err, errcap, "out of memory for the round's sum");
        return -1;
    }
    agg_store_reports log;
    agg_store_shards sh;
    int rc = agg_store_round_load_folded(a, job->id, round, prev, &log, &sh, err, errcap);
    if (rc == 0 && add_shards(job, sum, &sh, &log, NULL) != 0) {
        snprintf(err, errcap, "the round's stored sum does not match the job (a damaged checkpoint or log row)");
        rc = -1;
    }
    agg_store_reports_free(&log);
    agg_store_shards_free(&sh);
    if (rc != 0) agg_sum_free(sum);
    return rc;
}
