/* dprec aggregator core — every internal header of the core at once (not API), for code outside the core that has
 * not yet named the layer it needs (the relay's core). New code includes the layer's own header instead:
 *
 *   base/agg_base.h           shared types, the CSPRNG, the clock, logs, counters, JSON answers and request parsers
 *   state/agg_store.h         the store: the durable state behind functions (SQLite in this build)
 *   train/agg_mf.h            the seed-003 solver (sgld samples with it)
 *   protocols/agg_protocol.h  struct agg_protocol, the table, the budget, each protocol's test-exposed functions
 *   protocols/agg_secure_spec.h  a protocol's secure-aggregation option (params, noise plan)
 *   rounds/agg_rounds.h       the round engine: operations for the writer, the job table, the engine's lifetime
 *   rounds/agg_sign.h         the signing key and signed releases
 *   rounds/agg_secure.h       the secure jobs' open rounds
 *   core/agg_core.h           the assembly's and the request layer's (the signer, the in-process transport)
 *
 * The layers and their order: docs/aggregator-layers.md (tests/layers_check.py keeps it). */
#ifndef DPREC_AGG_PRIV_H
#define DPREC_AGG_PRIV_H

#include "base/agg_base.h"
#include "core/agg_core.h"
#include "protocols/agg_protocol.h"
#include "protocols/agg_secure_spec.h"
#include "rounds/agg_rounds.h"
#include "rounds/agg_secure.h"
#include "rounds/agg_sign.h"
#include "state/agg_store.h"

#endif /* DPREC_AGG_PRIV_H */
