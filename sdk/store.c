/* dprec — the local rating store.
 *
 * Ratings live in memory, sorted by item id, and every change is made durable before it is acknowledged.
 * On storage the store keeps two generations, "<name>.0" and "<name>.1" (generation g lives in slot g % 2),
 * each written by atomic replace: write "<name>.tmp", fsync, rename over the slot (the port makes the
 * rename durable). A crash at any point leaves the slot being replaced either old or new, and the other
 * slot untouched, so a damaged newest generation (bit rot, a bad flash page) still leaves the previous one.
 *
 * File v1, little-endian:
 *   0  magic "DPRS"          4  format version u16 (1)   6  flags u16 (bit 0: encrypted)
 *   8  generation u64        16 catalogue size m u32     20 payload length u32
 *   24 nonce (12 bytes, zero unless encrypted)
 *   36 key check value (8 bytes: the first 8 bytes of AES_K("dprec store kcv\0"), zero unless encrypted),
 *      so that a wrong key (DPREC_ERR_STORE_KEY) is told apart from a damaged file (DPREC_ERR_STORE_CORRUPT)
 *   44 reserved (4 bytes, zero)
 *   48 payload: sections, each [type u16][flags u16][length u32][data]; flags bit 0 = critical (a reader
 *      that does not know the type must refuse the file). Type 1, ratings (critical):
 *      [count u32][reserved u32] then count records [item u32][value f32][timestamp i64], sorted by item.
 *      Type 2, the privacy ledger, and type 3, pending reports (both critical; ledger.c). Type 4, the sync
 *      state: the registration (critical; sync.c; absent in files of older SDKs). Type 32, the trusted release
 *      (non-critical; verify.c; absent when none). Then each protocol's state section, if it keeps one (its
 *      descriptor in sdk/protocol.h: type 5, private-fw, non-critical).
 *   trailer: SHA-256 of header || payload (plain), or the AES-256-GCM tag (encrypted; header is the AAD,
 *      the payload the ciphertext).
 *
 * Writes are refused (DPREC_ERR_STATE) until a load has established what is on storage: a save numbers its
 * generation one above the newest good one, and saving blind could overwrite a newer good generation. */
#include <string.h>

#include "bytes.h"
#include "client_priv.h"
#include "protocol.h"

#define STORE_MAGIC "DPRS"
#define STORE_VERSION 1u
#define STORE_FLAG_ENCRYPTED 0x0001u
#define SECTION_RATINGS 1u
#define SECTION_CRITICAL 0x0001u

/* The protocol whose state lives in section `type`, or NULL. */
static const dprec_proto_state *state_of_section(uint16_t type) {
    for (size_t i = 0; i < dprec_protocol_count; i++) {
        const dprec_proto_state *st = dprec_protocols[i]->state;
        if (st != NULL && st->section != 0 && st->section == type) return st;
    }
    return NULL;
}

size_t dprec_store_image_size(const dprec_config *cfg) {
    size_t states = 0;
    for (size_t i = 0; i < dprec_protocol_count; i++) {
        const dprec_proto_state *st = dprec_protocols[i]->state;
        if (st != NULL && st->section != 0) states += st->section_max(cfg);
    }
    return DPREC_STORE_HEADER_SIZE + DPREC_STORE_SECTION_HEADER + DPREC_STORE_RATINGS_PREFIX +
           (size_t)cfg->rating_capacity * DPREC_STORE_RECORD_SIZE + dprec_ledger_section_max(cfg) +
           dprec_pending_section_max(cfg) + dprec_sync_section_max() + dprec_trust_section_max() +
           dprec_identity_section_max() + states +
           DPREC_STORE_TRAILER_MAX;
}

static const unsigned char KCV_BLOCK[16] = "dprec store kcv";

static int key_check_value(dprec_client *c, unsigned char out[8]) {
    unsigned char block[16];
    if (mbedtls_aes_crypt_ecb(&c->gcm.aes, MBEDTLS_AES_ENCRYPT, KCV_BLOCK, block) != 0) return DPREC_ERR_CRYPTO;
    memcpy(out, block, 8);
    return DPREC_OK;
}

int64_t dprec_store_find(const dprec_client *c, uint32_t item) {
    uint32_t lo = 0, hi = c->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->ratings[mid].item < item) lo = mid + 1;
        else hi = mid;
    }
    if (lo < c->count && c->ratings[lo].item == item) return (int64_t)lo;
    return -(int64_t)lo - 1;
}

static void slot_name(const dprec_client *c, char *out, const char *suffix) {
    size_t n = strlen(c->store_name);
    memcpy(out, c->store_name, n);
    memcpy(out + n, suffix, strlen(suffix) + 1);
}

/* ---- encoding ------------------------------------------------------------------------------------------ */

/* Serializes the client's state into c->image and returns the file length (0 on a crypto failure, with
 * *status). */
static size_t store_encode(dprec_client *c, uint64_t generation, int *status) {
    unsigned char *p = c->image;
    int encrypted = c->cfg.encrypt_at_rest != 0;
    memset(p, 0, DPREC_STORE_HEADER_SIZE);
    memcpy(p, STORE_MAGIC, 4);
    dprec_st16(p + 4, STORE_VERSION);
    dprec_st16(p + 6, encrypted ? STORE_FLAG_ENCRYPTED : 0u);
    dprec_st64(p + 8, generation);
    dprec_st32(p + 16, c->cfg.num_items);
    if (encrypted) {
        /* A fresh random 96-bit nonce per write; 2^32 writes under one key keep the collision
         * probability below 2^-32 (SP 800-38D, 8.3). */
        *status = dprec_rng_bytes(&c->rng, p + 24, DPREC_GCM_IV_SIZE);
        if (*status == DPREC_OK) *status = key_check_value(c, p + 36);
        if (*status != DPREC_OK) return 0;
    }
    unsigned char *s = p + DPREC_STORE_HEADER_SIZE;
    size_t ratings_len = DPREC_STORE_RATINGS_PREFIX + (size_t)c->count * DPREC_STORE_RECORD_SIZE;
    dprec_st16(s, SECTION_RATINGS);
    dprec_st16(s + 2, SECTION_CRITICAL);
    dprec_st32(s + 4, (uint32_t)ratings_len);
    dprec_st32(s + 8, c->count);
    dprec_st32(s + 12, 0);
    unsigned char *r = s + DPREC_STORE_SECTION_HEADER + DPREC_STORE_RATINGS_PREFIX;
    for (uint32_t i = 0; i < c->count; i++, r += DPREC_STORE_RECORD_SIZE) {
        dprec_st32(r, c->ratings[i].item);
        dprec_stf32(r + 4, c->ratings[i].value);
        dprec_st64(r + 8, (uint64_t)c->ratings[i].timestamp);
    }
    unsigned char *end = dprec_identity_encode(
        c, dprec_trust_encode(c, dprec_sync_encode(c, dprec_pending_encode(c, dprec_ledger_encode(c, r)))));
    for (size_t i = 0; i < dprec_protocol_count; i++) {
        const dprec_proto_state *st = dprec_protocols[i]->state;
        if (st != NULL && st->section != 0 && c->proto_state[i] != NULL) end = st->encode(c, end);
    }
    size_t payload = (size_t)(end - s);
    dprec_st32(p + 20, (uint32_t)payload);
    unsigned char *trailer = end;
    if (encrypted) {
        *status = dprec_gcm_encrypt(&c->gcm, p + 24, p, DPREC_STORE_HEADER_SIZE, s, payload, trailer);
        if (*status != DPREC_OK) return 0;
        return DPREC_STORE_HEADER_SIZE + payload + DPREC_GCM_TAG_SIZE;
    }
    *status = dprec_sha256(p, DPREC_STORE_HEADER_SIZE + payload, trailer) == 0 ? DPREC_OK : DPREC_ERR_CRYPTO;
    return *status == DPREC_OK ? DPREC_STORE_HEADER_SIZE + payload + 32u : 0;
}

/* The ratings section's data: validated, and loaded into the client when commit is set. */
static int ratings_decode(dprec_client *c, const unsigned char *d, uint32_t slen, int commit) {
    if (slen < DPREC_STORE_RATINGS_PREFIX) return DPREC_ERR_STORE_CORRUPT;
    uint32_t n = dprec_ld32(d);
    if (dprec_ld32(d + 4) != 0) return DPREC_ERR_STORE_CORRUPT;
    if (n > c->cfg.rating_capacity) return DPREC_ERR_STORE_MISMATCH;
    if ((size_t)slen != DPREC_STORE_RATINGS_PREFIX + (size_t)n * DPREC_STORE_RECORD_SIZE) return DPREC_ERR_STORE_CORRUPT;
    const unsigned char *r = d + DPREC_STORE_RATINGS_PREFIX;
    for (uint32_t i = 0; i < n; i++, r += DPREC_STORE_RECORD_SIZE) {
        uint32_t item = dprec_ld32(r);
        float value = dprec_ldf32(r + 4);
        int64_t ts = (int64_t)dprec_ld64(r + 8);
        /* The checksum proves we wrote it; these checks catch a writer bug or a changed scale. */
        if (item >= c->cfg.num_items || (i > 0 && item <= dprec_ld32(r - DPREC_STORE_RECORD_SIZE)))
            return DPREC_ERR_STORE_CORRUPT;
        if (!(value >= c->cfg.rating_min && value <= c->cfg.rating_max) || ts < 0) return DPREC_ERR_STORE_MISMATCH;
        if (commit) {
            c->ratings[i].item = item;
            c->ratings[i].value = value;
            c->ratings[i].timestamp = ts;
        }
    }
    if (commit) c->count = n;
    return DPREC_OK;
}

/* Walks the sections of a verified payload; with commit = 0 only validates. */
static int sections_decode(dprec_client *c, const unsigned char *s, uint32_t payload, int commit) {
    unsigned char seen[64];
    memset(seen, 0, sizeof seen);
    size_t off = 0;
    while (off < payload) {
        if (payload - off < DPREC_STORE_SECTION_HEADER) return DPREC_ERR_STORE_CORRUPT;
        uint16_t type = dprec_ld16(s + off), sflags = dprec_ld16(s + off + 2);
        uint32_t slen = dprec_ld32(s + off + 4);
        off += DPREC_STORE_SECTION_HEADER;
        if (slen > payload - off) return DPREC_ERR_STORE_CORRUPT;
        const unsigned char *d = s + off;
        int rc = DPREC_OK;
        const dprec_proto_state *st = state_of_section(type);
        int trust = type == DPREC_SECTION_TRUST || type == DPREC_SECTION_TRUST_COMPACT ||
                    type == DPREC_SECTION_TRUST_COLUMNS;
        if (type >= 1 && type < sizeof seen &&
            (type <= DPREC_SECTION_SYNC || trust || type == DPREC_SECTION_IDENTITY || st != NULL)) {
            /* a known section: once at most (the trusted release in one of its three sections) */
            uint16_t once = trust ? (uint16_t)DPREC_SECTION_TRUST : type;
            if (seen[once]) return DPREC_ERR_STORE_CORRUPT;
            seen[once] = 1;
        }
        if (type == SECTION_RATINGS) rc = ratings_decode(c, d, slen, commit);
        else if (type == DPREC_SECTION_LEDGER) rc = dprec_ledger_decode(c, d, slen, commit);
        else if (type == DPREC_SECTION_PENDING) rc = dprec_pending_decode(c, d, slen, commit);
        else if (type == DPREC_SECTION_SYNC) rc = dprec_sync_decode(c, d, slen, commit);
        else if (trust) rc = dprec_trust_decode(c, type, d, slen, commit);
        else if (type == DPREC_SECTION_IDENTITY) rc = dprec_identity_decode(c, d, slen, commit);
        else if (st != NULL) rc = st->decode(c, d, slen, commit);
        else if (sflags & SECTION_CRITICAL) rc = DPREC_ERR_STORE_VERSION; /* a newer SDK's data we must not drop */
        if (rc != DPREC_OK) return rc;
        off += slen;
    }
    return seen[SECTION_RATINGS] ? DPREC_OK : DPREC_ERR_STORE_CORRUPT;
}

/* Verifies the file image in c->image[0..len) (decrypting it in place) and validates every section; with
 * commit set, then loads it into the client (that step cannot fail). *generation gets its generation. */
static int store_decode(dprec_client *c, size_t len, int commit, uint64_t *generation) {
    unsigned char *p = c->image;
    if (len < DPREC_STORE_HEADER_SIZE) return len >= 4 && memcmp(p, STORE_MAGIC, 4) != 0 ? DPREC_ERR_STORE_CORRUPT
                                                                                           : DPREC_ERR_STORE_TRUNCATED;
    if (memcmp(p, STORE_MAGIC, 4) != 0) return DPREC_ERR_STORE_CORRUPT;
    uint16_t version = dprec_ld16(p + 4), flags = dprec_ld16(p + 6);
    uint32_t payload = dprec_ld32(p + 20);
    int encrypted = (flags & STORE_FLAG_ENCRYPTED) != 0;
    size_t trailer = encrypted ? DPREC_GCM_TAG_SIZE : 32u;
    /* The checksum covers the header, so first make sure the claimed lengths are sane, then verify, and
     * only then trust any field beyond the magic. */
    if ((size_t)payload > c->image_cap - DPREC_STORE_HEADER_SIZE - trailer) {
        /* Longer than any file this configuration could have written: a larger one, or garbage. */
        return len > c->image_cap ? DPREC_ERR_STORE_MISMATCH : DPREC_ERR_STORE_CORRUPT;
    }
    size_t need = DPREC_STORE_HEADER_SIZE + (size_t)payload + trailer;
    if (len < need) return DPREC_ERR_STORE_TRUNCATED;
    if (len > need) return DPREC_ERR_STORE_CORRUPT;
    unsigned char *s = p + DPREC_STORE_HEADER_SIZE;
    if (encrypted) {
        if (!c->cfg.encrypt_at_rest) return DPREC_ERR_STORE_KEY; /* encrypted file, no key configured */
        unsigned char kcv[8];
        int rc = key_check_value(c, kcv);
        if (rc != DPREC_OK) return rc;
        if (memcmp(kcv, p + 36, 8) != 0) return DPREC_ERR_STORE_KEY;
        rc = dprec_gcm_decrypt(&c->gcm, p + 24, p, DPREC_STORE_HEADER_SIZE, s, payload, s + payload);
        if (rc == DPREC_ERR_STORE_KEY) return DPREC_ERR_STORE_CORRUPT; /* right key, wrong tag: damage */
        if (rc != DPREC_OK) return rc;
    } else {
        unsigned char digest[32];
        if (dprec_sha256(p, DPREC_STORE_HEADER_SIZE + payload, digest) != 0) return DPREC_ERR_CRYPTO;
        unsigned char diff = 0;
        for (int i = 0; i < 32; i++) diff |= (unsigned char)(digest[i] ^ s[payload + (size_t)i]);
        if (diff != 0) return DPREC_ERR_STORE_CORRUPT;
        /* A plaintext file where encryption is required would let someone with disk access swap in data of
         * their choosing (a smaller ledger, say): refuse it. */
        if (c->cfg.encrypt_at_rest) return DPREC_ERR_STORE_KEY;
    }
    if (version != STORE_VERSION) return DPREC_ERR_STORE_VERSION;
    if ((flags & ~STORE_FLAG_ENCRYPTED) != 0) return DPREC_ERR_STORE_VERSION;
    for (int i = 44; i < 48; i++)
        if (p[i] != 0) return DPREC_ERR_STORE_CORRUPT;
    if (!encrypted)
        for (int i = 24; i < 44; i++)
            if (p[i] != 0) return DPREC_ERR_STORE_CORRUPT;
    if (dprec_ld32(p + 16) != c->cfg.num_items) return DPREC_ERR_STORE_MISMATCH;
    int rc = sections_decode(c, s, payload, 0);
    if (rc != DPREC_OK) return rc;
    if (commit) {
        c->count = 0;
        c->ledger_count = 0;
        c->pending_count = 0;
        dprec_sync_reset(c); /* a file without a sync section (older SDK): not registered */
        dprec_identity_reset(c); /* nor an identity */
        memset(&c->trusted, 0, sizeof c->trusted); /* nor a trusted release */
        for (size_t i = 0; i < dprec_protocol_count; i++) /* a file without a protocol's section: no state */
            if (c->proto_state[i] != NULL) dprec_protocols[i]->state->reset(c);
        (void)sections_decode(c, s, payload, 1);
    }
    *generation = dprec_ld64(p + 8);
    return DPREC_OK;
}

/* ---- file I/O through the port --------------------------------------------------------------------- */

/* Reads a whole file into c->image. *len gets its length; a file longer than the image is reported as
 * image_cap + 1 bytes (the decoder then refuses it without reading more). */
static int store_read_file(dprec_client *c, const char *name, size_t *len) {
    void *f = NULL;
    int rc = c->port.open(c->port.ctx, name, DPREC_PORT_READ, &f);
    if (rc != DPREC_OK) return dprec_client_port_error(c, rc);
    size_t total = 0;
    for (;;) {
        unsigned char extra;
        unsigned char *dst = total < c->image_cap ? c->image + total : &extra;
        size_t room = total < c->image_cap ? c->image_cap - total : 1;
        size_t got = 0;
        rc = c->port.read(c->port.ctx, f, dst, room, &got);
        if (rc != DPREC_OK) break;
        if (got == 0) break;
        total += got;
        if (total > c->image_cap) break;
    }
    int crc = c->port.close(c->port.ctx, f);
    if (rc == DPREC_OK) rc = crc;
    if (rc != DPREC_OK) return dprec_client_port_error(c, rc);
    *len = total;
    return DPREC_OK;
}

/* *at_rename is set when the failure came from the rename, which a port may have applied before failing
 * (the directory fsync after it): the storage then holds an unknown one of the two states. */
static int store_write_file(dprec_client *c, const char *name, size_t len, int *at_rename) {
    char tmp[DPREC_PORT_NAME_MAX];
    slot_name(c, tmp, ".tmp");
    void *f = NULL;
    int rc = c->port.open(c->port.ctx, tmp, DPREC_PORT_WRITE_NEW, &f);
    if (rc != DPREC_OK) return dprec_client_port_error(c, rc);
    rc = c->port.write(c->port.ctx, f, c->image, len);
    if (rc == DPREC_OK) rc = c->port.sync(c->port.ctx, f);
    int crc = c->port.close(c->port.ctx, f);
    if (rc == DPREC_OK) rc = crc;
    *at_rename = 0;
    if (rc == DPREC_OK) {
        rc = c->port.rename(c->port.ctx, tmp, name);
        *at_rename = rc != DPREC_OK;
    }
    if (rc != DPREC_OK) {
        rc = dprec_client_port_error(c, rc);
        (void)c->port.remove(c->port.ctx, tmp); /* best effort; a stale temp file is ignored on load */
    }
    return rc;
}

/* Writes the in-memory state as generation c->generation + 1. After a failure at the rename stage the
 * storage may hold either state, so writes are blocked until dprec_store_load re-reads it. */
int dprec_store_save(dprec_client *c) {
    if (!c->loaded) return dprec_diag_unloaded(c);
    uint64_t next = c->generation + 1;
    int status = DPREC_OK;
    size_t len = store_encode(c, next, &status);
    if (len == 0) return status;
    char name[DPREC_PORT_NAME_MAX];
    slot_name(c, name, (next & 1u) ? ".1" : ".0");
    int at_rename = 0;
    status = store_write_file(c, name, len, &at_rename);
    dprec_wipe(c->image, len); /* no plaintext ratings left lying in the buffer */
    if (status == DPREC_OK) {
        c->generation = next;
        c->mirror_needed = 0; /* this generation and the previous one both hold every charge made before */
    } else if (at_rename) {
        c->loaded = 0;
        c->unloaded_why = DPREC_UNLOADED_RENAME;
        dprec_client_log(c, DPREC_LOG_ERROR, "store rename failed; reload before writing: ", dprec_status_name(status));
    }
    return status;
}

/* ---- public API ------------------------------------------------------------------------------------ */

static int damage(int status) {
    return status == DPREC_ERR_STORE_CORRUPT || status == DPREC_ERR_STORE_TRUNCATED;
}

/* One client per store: the port's lock (platform.h), taken by the first load and kept until the client is
 * freed. Without it, two clients would each save their own view over the other's, ratings and ledger charges
 * included; a port without a lock leaves that to the app. */
static int store_lock(dprec_client *c) {
    if (c->store_locked || c->port.lock == NULL) return DPREC_OK;
    char name[DPREC_PORT_NAME_MAX];
    slot_name(c, name, ".lock");
    void *handle = NULL;
    int rc = c->port.lock(c->port.ctx, name, &handle);
    if (rc == DPREC_ERR_STORE_LOCKED) {
        dprec_client_log(c, DPREC_LOG_WARN, "store in use by another client: ", c->store_name);
        c->last_cause = 0;
        if (!c->loaded) c->unloaded_why = rc;
        return rc;
    }
    if (rc != DPREC_OK) return dprec_client_port_error(c, rc);
    c->store_lock = handle;
    c->store_locked = 1;
    return DPREC_OK;
}

int dprec_store_load(dprec_client *c) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    int lrc = store_lock(c);
    if (lrc != DPREC_OK) return lrc; /* nothing read; writes stay refused (DPREC_ERR_STATE) */
    int status[2];
    uint64_t gen[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        char name[DPREC_PORT_NAME_MAX];
        slot_name(c, name, s ? ".1" : ".0");
        size_t len = 0;
        status[s] = store_read_file(c, name, &len);
        if (status[s] == DPREC_OK) status[s] = store_decode(c, len, 0, &gen[s]);
        /* Generation g must sit in slot g % 2: the next save goes to the other slot, and must never
         * overwrite the only good generation (a file copied into the wrong slot would make it). */
        if (status[s] == DPREC_OK && (gen[s] & 1u) != (uint64_t)s) status[s] = DPREC_ERR_STORE_CORRUPT;
        if (status[s] != DPREC_OK && status[s] != DPREC_ERR_NOT_FOUND)
            dprec_client_log(c, DPREC_LOG_WARN, s ? "store slot 1 refused: " : "store slot 0 refused: ",
                             dprec_status_name(status[s]));
    }
    int best = -1;
    for (int s = 0; s < 2; s++)
        if (status[s] == DPREC_OK && (best < 0 || gen[s] > gen[best])) best = s;
    int result = DPREC_OK, blocking = DPREC_OK, writable = 1, damaged = 0;
    for (int s = 0; s < 2; s++) {
        if (status[s] == DPREC_OK || status[s] == DPREC_ERR_NOT_FOUND) continue;
        if (damage(status[s])) {
            damaged = 1;
            if (result == DPREC_OK) result = status[s];
        } else {
            /* An I/O error, a wrong key, a newer format or another configuration may hide a newer good
             * generation: writing now could destroy it. */
            writable = 0;
            if (blocking == DPREC_OK) blocking = status[s];
        }
    }
    /* The status says whether writes are allowed (dprec.h): a refusal that blocks them wins over damage in the
     * other slot (found by tests/fuzz/fuzz_store.c: a damaged slot 0 and another configuration's slot 1 returned
     * _CORRUPT, and the writes it promises were refused). */
    if (blocking != DPREC_OK) result = blocking;

    c->count = 0;
    c->ledger_count = 0;
    c->pending_count = 0;
    c->generation = 0;
    c->fitted = 0;
    c->mirror_needed = 0;
    c->loaded = 0;
    c->ledger_lost = 0;
    dprec_sync_reset(c);
    dprec_identity_reset(c);
    memset(&c->trusted, 0, sizeof c->trusted);
    if (best >= 0) {
        char name[DPREC_PORT_NAME_MAX];
        slot_name(c, name, best ? ".1" : ".0");
        size_t len = 0;
        int rc = store_read_file(c, name, &len);
        if (rc == DPREC_OK) rc = store_decode(c, len, 1, &c->generation);
        dprec_wipe(c->image, c->image_cap);
        if (rc != DPREC_OK) { /* changed or unreadable between the two reads */
            c->count = c->ledger_count = c->pending_count = 0;
            c->generation = 0;
            dprec_sync_reset(c);
            dprec_identity_reset(c);
            memset(&c->trusted, 0, sizeof c->trusted);
            c->unloaded_why = rc;
            return rc;
        }
    } else if (damaged) {
        /* Files existed and none could be read: whatever the ledger held is gone. */
        c->ledger_lost = 1;
    }
    c->loaded = writable;
    c->unloaded_why = writable ? 0 : blocking;
    return result;
}

int dprec_store_flush(dprec_client *c) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    return dprec_store_save(c);
}

static int check_rating(const dprec_client *c, uint32_t item, float value) {
    if (item >= c->cfg.num_items) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    if (!dprec_finite_f32(value)) return DPREC_ERR_VALUE_NOT_FINITE; /* NaN, +-Inf */
    if (value < c->cfg.rating_min || value > c->cfg.rating_max) return DPREC_ERR_VALUE_OUT_OF_SCALE;
    return DPREC_OK;
}

int dprec_store_put(dprec_client *c, uint32_t item, float value, int64_t timestamp) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    int rc = check_rating(c, item, value);
    if (rc != DPREC_OK) return rc;
    if (!c->loaded) return dprec_diag_unloaded(c);
    if (timestamp == DPREC_TIMESTAMP_NOW) {
        if (c->port.wall_clock_s == NULL) return DPREC_ERR_PORT_MISSING;
        timestamp = c->port.wall_clock_s(c->port.ctx);
    }
    if (timestamp < 0) return DPREC_ERR_BAD_TIMESTAMP;

    int64_t at = dprec_store_find(c, item);
    dprec_rating fresh = {item, value, timestamp};
    if (at >= 0) {
        dprec_rating old = c->ratings[at];
        c->ratings[at] = fresh;
        rc = dprec_store_save(c);
        if (rc != DPREC_OK) c->ratings[at] = old;
    } else {
        if (c->count >= c->cfg.rating_capacity) return DPREC_ERR_STORE_FULL;
        size_t pos = (size_t)(-(at + 1));
        memmove(&c->ratings[pos + 1], &c->ratings[pos], (c->count - pos) * sizeof c->ratings[0]);
        c->ratings[pos] = fresh;
        c->count++;
        rc = dprec_store_save(c);
        if (rc != DPREC_OK) {
            c->count--;
            memmove(&c->ratings[pos], &c->ratings[pos + 1], (c->count - pos) * sizeof c->ratings[0]);
        }
    }
    if (rc == DPREC_OK) c->fitted = 0; /* the user vector no longer reflects the ratings */
    return rc;
}

int dprec_store_put_many(dprec_client *c, const dprec_rating *ratings, uint32_t n) {
    dprec_diag_begin(c);
    if (c == NULL || (n > 0 && ratings == NULL)) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    int64_t now = 0;
    int need_now = 0;
    for (uint32_t i = 0; i < n; i++) { /* every rating checked before anything changes */
        int rc = check_rating(c, ratings[i].item, ratings[i].value);
        if (rc != DPREC_OK) return rc;
        if (ratings[i].timestamp == DPREC_TIMESTAMP_NOW) need_now = 1;
        else if (ratings[i].timestamp < 0) return DPREC_ERR_BAD_TIMESTAMP;
    }
    if (!c->loaded) return dprec_diag_unloaded(c);
    if (need_now) {
        if (c->port.wall_clock_s == NULL) return DPREC_ERR_PORT_MISSING;
        now = c->port.wall_clock_s(c->port.ctx);
        if (now < 0) return DPREC_ERR_BAD_TIMESTAMP;
    }
    if (n == 0) return DPREC_OK;
    /* Applied in order (a later rating of the same item wins, as with successive puts), then written once. On
     * a full store or a failed write the last durable generation is read back, so that memory matches storage
     * again (it holds the state before this call); if even that fails, writes wait for dprec_store_load. */
    int rc = DPREC_OK;
    for (uint32_t i = 0; i < n && rc == DPREC_OK; i++) {
        dprec_rating fresh = ratings[i];
        if (fresh.timestamp == DPREC_TIMESTAMP_NOW) fresh.timestamp = now;
        int64_t at = dprec_store_find(c, fresh.item);
        if (at >= 0) {
            c->ratings[at] = fresh;
        } else if (c->count >= c->cfg.rating_capacity) {
            rc = DPREC_ERR_STORE_FULL;
        } else {
            size_t pos = (size_t)(-(at + 1));
            memmove(&c->ratings[pos + 1], &c->ratings[pos], (c->count - pos) * sizeof c->ratings[0]);
            c->ratings[pos] = fresh;
            c->count++;
        }
    }
    c->fitted = 0;
    if (rc == DPREC_OK) rc = dprec_store_save(c);
    if (rc != DPREC_OK) (void)dprec_store_load(c); /* its own rules decide whether writes may go on */
    return rc;
}

int dprec_store_remove(dprec_client *c, uint32_t item) {
    dprec_diag_begin(c);
    if (c == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (c->stream != STREAM_NONE) return dprec_diag_stream(c);
    if (item >= c->cfg.num_items) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    int64_t at = dprec_store_find(c, item);
    if (at < 0) return DPREC_ERR_NOT_RATED;
    if (!c->loaded) return dprec_diag_unloaded(c);
    size_t pos = (size_t)at;
    dprec_rating old = c->ratings[pos];
    c->count--;
    memmove(&c->ratings[pos], &c->ratings[pos + 1], (c->count - pos) * sizeof c->ratings[0]);
    int rc = dprec_store_save(c);
    if (rc != DPREC_OK) {
        memmove(&c->ratings[pos + 1], &c->ratings[pos], (c->count - pos) * sizeof c->ratings[0]);
        c->ratings[pos] = old;
        c->count++;
    } else {
        c->fitted = 0;
    }
    return rc;
}

int dprec_store_get(const dprec_client *c, uint32_t item, dprec_rating *out) {
    dprec_diag_begin(c);
    if (c == NULL || out == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (item >= c->cfg.num_items) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    int64_t at = dprec_store_find(c, item);
    if (at < 0) return DPREC_ERR_NOT_RATED;
    *out = c->ratings[at];
    return DPREC_OK;
}

uint32_t dprec_store_count(const dprec_client *c) {
    return c ? c->count : 0;
}

int dprec_store_at(const dprec_client *c, uint32_t index, dprec_rating *out) {
    dprec_diag_begin(c);
    if (c == NULL || out == NULL || index >= c->count) return DPREC_ERR_INVALID_ARGUMENT;
    *out = c->ratings[index];
    return DPREC_OK;
}
