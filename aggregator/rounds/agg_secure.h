/* dprec aggregator — secure aggregation as a job option (`params.aggregation: "secure"` of gauss-gd and dpals;
 * docs/protocol.md "Secure aggregation", docs/privacy.md "Secure aggregation"). One SecAgg+ round (agg_secagg.c) per
 * open round of a secure job: the phases' messages come and go on the device routes
 * /v1/jobs/{job}/secagg/{keys,neighbours,shares,inbox,survivors,consistency,requests,reveals}; the masked inputs arrive as the round's
 * reports (POST .../reports, sdk/secure.h's payload) and are never stored as reports; the job view carries "secagg":
 * {round, phase, seed}. A phase closes by itself once every device of the previous phase has acted (the first once
 * min_reports devices advertised), at the round's deadline (agg_secure_deadline), or when the operator closes the
 * round (POST .../round/close: the open phase closes; in the unmask phase the round is unmasked and then finalized, its
 * global step taking the decoded noisy sum). A round that cannot be unmasked (too few devices in a phase, nobody at
 * all by the round's deadline) is finalized with no sum: the model does not move.
 *
 * Where the round lives: on a single-instance state (SQLite), in this instance's memory only: a restart loses the open
 * round's SecAgg state, which then finalizes with no sum at its deadline or when closed (the devices' charges stand).
 * On a state several instances share (PostgreSQL), in the state as a log of the messages that changed it
 * (agg_store_secagg_read), of which each instance keeps a copy: any instance takes any step, and a restarted instance,
 * or one that takes the job's lease, carries on from the log. The log goes with the round's commit.
 *
 * Part of the rounds/ layer (docs/architecture.md); the job's parameters and plan (agg_secure_spec, whether a job
 * is secure) are the protocols' layer's: protocols/agg_secure_spec.h. */
#ifndef DPREC_AGG_SECURE_H
#define DPREC_AGG_SECURE_H

#include <stdint.h>

#include "base/agg_base.h"
#include "protocols/agg_secure_spec.h"
#include "report.h"

int agg_secure_init(dprec_agg *a);
void agg_secure_free(dprec_agg *a);
/* Adds "secagg" {round, phase, seed} to the job view of a secure job (creating the round's state on first sight). 0,
 * or -1 when a shared state's log could not be read (nothing added). */
int agg_secure_view(dprec_agg *a, const agg_job *job, cJSON *view);
/* A device route: what ("keys", ...), the device, the body. Writes the answer (binary or an error). */
int agg_secure_handle(dprec_agg *a, const agg_job *job, int64_t device, const char *what, int is_post,
                      const unsigned char *body, size_t len, dprec_agg_response *resp);
/* A masked input (a report of a secure job): its envelope already parsed. */
int agg_secure_report(dprec_agg *a, const agg_job *job, int64_t device, const dprec_envelope *e,
                      dprec_agg_response *resp);
/* The operator's round close on a secure job: closes the open phase. 1: the round is ready to finalize (unmasked or
 * aborted, or no longer the job's open round), 0: a phase was closed and the round goes on (the answer is the job's
 * phase), -1: a shared state's log failed (nothing closed). */
int agg_secure_close(dprec_agg *a, const agg_job *job);
/* The round's deadline passed (the writer's tick): closes the open phase, as the operator's close does, whatever the
 * count. 1: the round is ready to finalize (unmasked; or with no sum, the model unchanged: nobody joined it, a phase
 * had too few devices, or a restart lost its state); 0: the round goes on to its next phase, which gets a deadline of
 * its own (at most four more: share, mask, consistency, unmask); -1: a shared state's log failed (the next tick tries
 * again). A secure round is never extended otherwise. */
int agg_secure_deadline(dprec_agg *a, const agg_job *job);
/* Drops this instance's copies of job's rounds before `round` (the writer's tick, on a shared state, for a round
 * that another instance finalized: a copy holds the round's masked inputs, n x D words). */
void agg_secure_forget(dprec_agg *a, int64_t job, int64_t round);
/* The finalizer: into *sum the decoded noisy sum of round `round` (plan.d doubles, malloc'd, the caller frees) and the
 * number of survivors; *sum NULL when the round has none (aborted). 0, or -1 when a shared state's log could not be
 * read (*sum NULL: the round must not be finalized as if it had no sum). */
int agg_secure_take_sum(dprec_agg *a, const agg_job *job, int64_t round, double **sum, uint32_t *survivors);

#endif /* DPREC_AGG_SECURE_H */
