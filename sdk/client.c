/* dprec — client lifecycle: configuration, memory layout, CSPRNG and storage key. */
#include <stddef.h>
#include <string.h>

#include "abi.h"
#include "bytes.h"
#include "client_priv.h"
#include "linalg.h"
#include "protocol.h"
#include "secure.h"

/* dprec_config's layouts: 0.2's ends before reserved_0_3 (its tail padding, if any, is where reserved_0_3 now lies);
 * secagg_min_colluders came in 0.3 and lies past every 0.2 struct, so a 0.2 app's struct gets its default. */
#define CONFIG_BASE_SIZE offsetof(dprec_config, reserved_0_3)
#define CONFIG_HAS_COLLUDERS(size) ((size) >= offsetof(dprec_config, secagg_min_colluders) + sizeof(uint32_t))
#define SECAGG_MIN_COLLUDERS_DEFAULT 1u
_Static_assert(offsetof(dprec_config, secagg_min_colluders) >= offsetof(dprec_config, secagg_max_len) + 8u,
               "secagg_min_colluders must lie past the 0.2 layout's end, tail padding included");

int dprec_config_default_sized(dprec_config *cfg, size_t size) {
    if (cfg == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    /* the app's struct is size bytes: write all of them (zero: the defaults of fields newer than this library)
     * and our fields, which come first in every later layout; an older layout gets the fields it has */
    if (size < CONFIG_BASE_SIZE || size > sizeof *cfg + DPREC_ABI_MAX_GROWTH) return DPREC_ERR_STRUCT_SIZE;
    memset(cfg, 0, size);
    cfg->struct_size = (uint32_t)size;
    cfg->dim = 16;
    cfg->rating_capacity = 1000;
    cfg->max_k = 100;
    cfg->rating_min = 1.0f;
    cfg->rating_max = 5.0f;
    cfg->lambda = 0.1f;
    cfg->ledger_jobs = 8;
    cfg->pending_slots = 1;
    cfg->max_report_bytes = 4096;
    if (CONFIG_HAS_COLLUDERS(size)) cfg->secagg_min_colluders = SECAGG_MIN_COLLUDERS_DEFAULT;
    return DPREC_OK;
}

static int is_cap(double x) {
    return !dprec_nan_f64(x) && x >= 0.0; /* +inf allowed: "no cap" must be said explicitly */
}

static int is_finite(float x) {
    return dprec_finite_f32(x);
}

static int config_check(const dprec_config *cfg) {
    if (cfg->num_items == 0 || cfg->num_items > DPREC_MAX_ITEMS) return DPREC_ERR_CONFIG;
    if (cfg->dim == 0 || cfg->dim > DPREC_MAX_DIM) return DPREC_ERR_CONFIG;
    if (cfg->rating_capacity == 0 || cfg->rating_capacity > DPREC_MAX_CAPACITY) return DPREC_ERR_CONFIG;
    if (cfg->max_k == 0 || cfg->max_k > DPREC_MAX_K) return DPREC_ERR_CONFIG;
    if (!is_finite(cfg->rating_min) || !is_finite(cfg->rating_max) || !(cfg->rating_min < cfg->rating_max))
        return DPREC_ERR_CONFIG;
    if (!is_finite(cfg->lambda) || !(cfg->lambda > 0.0f)) return DPREC_ERR_CONFIG;
    if (cfg->store_name != NULL) {
        size_t n = strlen(cfg->store_name);
        if (n == 0 || n >= DPREC_STORE_NAME_MAX - 4) return DPREC_ERR_CONFIG;
        for (size_t i = 0; i < n; i++) { /* a plain file name: no separators, nothing a port could misread */
            char ch = cfg->store_name[i];
            int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                     ch == '-' || ch == '_' || (ch == '.' && i > 0);
            if (!ok) return DPREC_ERR_CONFIG;
        }
    }
    if (!is_cap(cfg->cap_user_epsilon) || !is_cap(cfg->cap_rating_epsilon) || !is_cap(cfg->cap_user_delta) ||
        !is_cap(cfg->cap_rating_delta) || cfg->cap_user_delta >= 1.0 || cfg->cap_rating_delta >= 1.0)
        return DPREC_ERR_CONFIG;
    if (cfg->ledger_jobs == 0 || cfg->ledger_jobs > DPREC_MAX_LEDGER_JOBS) return DPREC_ERR_CONFIG;
    if (cfg->pending_slots == 0 || cfg->pending_slots > DPREC_MAX_PENDING_SLOTS) return DPREC_ERR_CONFIG;
    if (cfg->max_report_bytes < 16 || cfg->max_report_bytes > DPREC_MAX_REPORT_BYTES) return DPREC_ERR_CONFIG;
    if (cfg->fw_max_ratings > 65535u) return DPREC_ERR_CONFIG;
    if (cfg->sgld_max_ratings > 65535u || !is_cap(cfg->sgld_epsilon)) return DPREC_ERR_CONFIG;
    if (cfg->secagg_max_len > DPREC_DDG_MAX_DIM) return DPREC_ERR_CONFIG;
    if (cfg->secagg_min_colluders >= DPREC_SECAGG_MAX_NEIGHBOURS) return DPREC_ERR_CONFIG; /* 2t - k - 1 <= k - 1 */
    if (cfg->allow_non_private != 0 && cfg->allow_non_private != 1) return DPREC_ERR_CONFIG;
    return DPREC_OK;
}

/* The app's configuration, read by the size it was compiled with (abi.h), then checked. */
static int config_in(const dprec_config *app, dprec_config *cfg) {
    if (app == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_abi_copy_in(cfg, sizeof *cfg, app, CONFIG_BASE_SIZE);
    if (rc != DPREC_OK) return rc;
    cfg->reserved_0_3 = 0;
    /* a field the app's headers do not have takes its default, which for this one is not zero */
    if (!CONFIG_HAS_COLLUDERS(dprec_abi_app_size(app, CONFIG_BASE_SIZE)))
        cfg->secagg_min_colluders = SECAGG_MIN_COLLUDERS_DEFAULT;
    return config_check(cfg);
}

/* The blocks a client takes, in allocation order. required_size and init both walk this list, so the
 * size the app is told and the memory init takes cannot drift apart. */
enum { BLK_CLIENT, BLK_RATINGS, BLK_IMAGE, BLK_A, BLK_B, BLK_U, BLK_TOPK, BLK_LEDGER, BLK_PENDING, BLK_ROWS, BLK_COUNT };

/* The protocols' state blocks (protocol.h), each rounded to the arena's alignment, inside the rows' block. */
static size_t proto_state_bytes(const dprec_config *cfg) {
    size_t total = 0;
    for (size_t i = 0; i < dprec_protocol_count; i++) {
        const dprec_proto_state *st = dprec_protocols[i]->state;
        if (st != NULL) total += dprec_heap_round(st->memory(cfg));
    }
    return total;
}

static void client_layout(const dprec_config *cfg, size_t sizes[BLK_COUNT]) {
    size_t d = cfg->dim;
    sizes[BLK_CLIENT] = sizeof(struct dprec_client);
    sizes[BLK_RATINGS] = (size_t)cfg->rating_capacity * sizeof(dprec_rating);
    sizes[BLK_IMAGE] = dprec_store_image_size(cfg);
    sizes[BLK_A] = d * d * sizeof(double);
    sizes[BLK_B] = d * sizeof(double);
    sizes[BLK_U] = DPREC_GRAM_SCRATCH(d) * sizeof(double) + 2u * d * sizeof(float); /* the fit's scratch, u, u_pred */
    sizes[BLK_TOPK] = (size_t)cfg->max_k * sizeof(dprec_recommendation);
    sizes[BLK_LEDGER] = (size_t)cfg->ledger_jobs * sizeof(ledger_line);
    sizes[BLK_PENDING] = (size_t)cfg->pending_slots * dprec_pending_stride(cfg);
    /* the protocols' state shares the rows' block (after the rows, each part aligned): no new block */
    sizes[BLK_ROWS] = dprec_heap_round((size_t)cfg->rating_capacity * (d + 1) * sizeof(float)) +
                      dprec_heap_round((size_t)cfg->rating_capacity * 2u * sizeof(float)) + proto_state_bytes(cfg) +
                      dprec_heap_round(dprec_secure_memory(cfg));
}

_Static_assert(sizeof(struct dprec_client) <= DPREC_CLIENT_FIXED_BYTES,
               "the documented fixed part must hold the client struct");
_Static_assert(sizeof(dprec_rating) == 16, "the memory bound counts 16 bytes a rating");
_Static_assert(sizeof(dprec_recommendation) == 8, "the memory bound counts 8 bytes a top-K slot");
_Static_assert(BLK_COUNT <= 10, "the memory bound's slack covers 10 blocks");
_Static_assert(sizeof(ledger_line) == 88, "the memory bound counts 88 bytes a ledger line");

static size_t required_size(const dprec_config *cfg) {
    size_t sizes[BLK_COUNT];
    client_layout(cfg, sizes);
    size_t total = DPREC_HEAP_ALIGN - 1; /* the app's buffer may start unaligned */
    for (int i = 0; i < BLK_COUNT; i++) total += dprec_heap_round(sizes[i]);
    return total;
}

size_t dprec_client_required_size(const dprec_config *app) {
    dprec_config cfg;
    return config_in(app, &cfg) == DPREC_OK ? required_size(&cfg) : 0;
}

int dprec_client_port_error(dprec_client *c, int status) {
    c->last_cause = (c->port.last_cause != NULL) ? c->port.last_cause(c->port.ctx) : 0;
    return status;
}

void dprec_client_log(const dprec_client *c, dprec_log_level level, const char *a, const char *b) {
    if (c->port.log == NULL) return;
    char line[160];
    size_t n = 0;
    const char *parts[3] = {"dprec: ", a, b};
    for (int i = 0; i < 3; i++)
        for (const char *p = parts[i]; p != NULL && *p != '\0' && n + 1 < sizeof line; p++) line[n++] = *p;
    line[n] = '\0';
    c->port.log(c->port.ctx, level, line);
}

static int client_create(dprec_client **out, const dprec_config *cfg, const dprec_port *port, dprec_heap *heap) {
    size_t sizes[BLK_COUNT];
    client_layout(cfg, sizes);
    void *blocks[BLK_COUNT];
    for (int i = 0; i < BLK_COUNT; i++) {
        blocks[i] = dprec_heap_alloc(heap, sizes[i]);
        if (blocks[i] == NULL) {
            dprec_heap_release(heap);
            return DPREC_ERR_NO_MEMORY;
        }
    }
    dprec_client *c = (dprec_client *)blocks[BLK_CLIENT];
    c->heap = *heap;
    c->cfg = *cfg;
    const char *name = cfg->store_name ? cfg->store_name : "dprec-ratings";
    memcpy(c->store_name, name, strlen(name) + 1);
    c->cfg.store_name = c->store_name;
    c->port = *port;
    c->ratings = (dprec_rating *)blocks[BLK_RATINGS];
    c->image = (unsigned char *)blocks[BLK_IMAGE];
    c->image_cap = sizes[BLK_IMAGE];
    c->a = (double *)blocks[BLK_A];
    c->b = (double *)blocks[BLK_B];
    c->scratch = (double *)blocks[BLK_U];
    c->u = (float *)(void *)(c->scratch + DPREC_GRAM_SCRATCH(cfg->dim));
    c->u_pred = c->u + cfg->dim;
    c->topk_slots = (dprec_recommendation *)blocks[BLK_TOPK];
    c->ledger = (ledger_line *)blocks[BLK_LEDGER];
    c->pending = (unsigned char *)blocks[BLK_PENDING];
    c->pending_stride = dprec_pending_stride(cfg);
    c->rows = (float *)blocks[BLK_ROWS];
    unsigned char *state = (unsigned char *)blocks[BLK_ROWS] +
                           dprec_heap_round((size_t)cfg->rating_capacity * (cfg->dim + 1u) * sizeof(float));
    c->keep = (float *)(void *)state; /* the rated items' shrinkage, after their rows */
    state += dprec_heap_round((size_t)cfg->rating_capacity * 2u * sizeof(float));
    for (size_t i = 0; i < dprec_protocol_count; i++) {
        const dprec_proto_state *st = dprec_protocols[i]->state;
        size_t n = st != NULL ? st->memory(cfg) : 0;
        c->proto_state[i] = n > 0 ? state : NULL;
        state += dprec_heap_round(n);
        if (n > 0) st->reset(c);
    }
    c->secure = dprec_secure_memory(cfg) > 0 ? state : NULL; /* secure aggregation's area (sdk/secure.h) */
    c->pending_skip = UINT32_MAX;

    /* always the port's entropy: the SDK has no test mode that could make a device's noise predictable (tests and
     * the simulator reproduce runs through a port of their own) */
    int rc = dprec_rng_init(&c->rng, &c->port, NULL, 0, "dprec client v1");
    if (rc == DPREC_OK && cfg->encrypt_at_rest) {
        unsigned char key[32];
        if (port->get_storage_key == NULL) {
            rc = DPREC_ERR_PORT_MISSING;
        } else {
            rc = port->get_storage_key(port->ctx, key);
            if (rc == DPREC_OK) rc = dprec_gcm_setkey(&c->gcm, key);
            else rc = DPREC_ERR_STORE_KEY;
        }
        dprec_wipe(key, sizeof key);
    }
    if (rc != DPREC_OK) {
        dprec_client_free(c);
        return rc;
    }
    *out = c;
    return DPREC_OK;
}

/* The app's port table, read by the size it was compiled with (a port of older headers has the newer, optional
 * functions NULL), then checked. */
static int port_in(const dprec_port *app, dprec_port *port) {
    if (app == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = DPREC_ABI_COPY_IN(port, app);
    if (rc != DPREC_OK) return rc;
    if (!port->open || !port->read || !port->write || !port->sync || !port->close || !port->rename ||
        !port->remove || !port->entropy)
        return DPREC_ERR_PORT_MISSING;
    return DPREC_OK;
}

int dprec_client_init(dprec_client **out, const dprec_config *app_cfg, const dprec_port *app_port, void *mem,
                      size_t mem_size) {
    if (out == NULL || mem == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    *out = NULL;
    dprec_config cfg;
    dprec_port port;
    int rc = config_in(app_cfg, &cfg);
    if (rc == DPREC_OK) rc = port_in(app_port, &port);
    if (rc != DPREC_OK) return rc;
    if (mem_size < required_size(&cfg)) return DPREC_ERR_NO_MEMORY;
    dprec_heap heap;
    dprec_heap_init_arena(&heap, mem, mem_size);
    return client_create(out, &cfg, &port, &heap);
}

int dprec_client_init_with_allocator(dprec_client **out, const dprec_config *app_cfg, const dprec_port *app_port,
                                     const dprec_allocator *app_alloc) {
    if (out == NULL || app_alloc == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    *out = NULL;
    dprec_allocator alloc;
    dprec_config cfg;
    dprec_port port;
    int rc = DPREC_ABI_COPY_IN(&alloc, app_alloc);
    if (rc != DPREC_OK) return rc;
    if (alloc.alloc == NULL || alloc.free == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    rc = config_in(app_cfg, &cfg);
    if (rc == DPREC_OK) rc = port_in(app_port, &port);
    if (rc != DPREC_OK) return rc;
    dprec_heap heap;
    dprec_heap_init_hooks(&heap, &alloc);
    return client_create(out, &cfg, &port, &heap);
}

void dprec_client_free(dprec_client *c) {
    if (c == NULL) return;
    dprec_heap heap = c->heap;
    if (c->store_locked && c->port.unlock != NULL) c->port.unlock(c->port.ctx, c->store_lock);
    dprec_rng_free(&c->rng);
    dprec_gcm_free(&c->gcm);
    /* Ratings, the user vector and keys are personal data: leave none of it in the app's memory. */
    size_t sizes[BLK_COUNT];
    client_layout(&c->cfg, sizes);
    dprec_wipe(c->ratings, sizes[BLK_RATINGS]);
    dprec_wipe(c->image, sizes[BLK_IMAGE]);
    dprec_wipe(c->a, sizes[BLK_A]);
    dprec_wipe(c->b, sizes[BLK_B]);
    dprec_wipe(c->scratch, sizes[BLK_U]);
    dprec_wipe(c->topk_slots, sizes[BLK_TOPK]);
    dprec_wipe(c->ledger, sizes[BLK_LEDGER]);
    dprec_wipe(c->pending, sizes[BLK_PENDING]);
    dprec_wipe(c->rows, sizes[BLK_ROWS]); /* rated items' rows, and the protocols' state */
    dprec_wipe(c, sizeof *c);
    dprec_heap_release(&heap);
}

size_t dprec_client_memory_used(const dprec_client *c) {
    return c ? c->heap.used : 0;
}

int dprec_client_last_cause(const dprec_client *c) {
    if (c == NULL) return 0;
    return c->last_cause != 0 ? c->last_cause : c->rng.last_cause;
}

int dprec_client_random(dprec_client *c, void *out, size_t len) {
    dprec_diag_begin(c);
    if (c == NULL || (out == NULL && len > 0)) return DPREC_ERR_INVALID_ARGUMENT;
    return dprec_rng_bytes(&c->rng, out, len);
}
