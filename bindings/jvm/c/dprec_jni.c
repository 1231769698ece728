/* dprec — the JNI glue of the Java/Kotlin binding (bindings/jvm, class org.dprec.DprecClient; docs/sdk.md, "From a
 * Java or Kotlin app").
 *
 * Memory: the glue allocates nothing. Java hands over one direct ByteBuffer of DprecClient.requiredSize(config)
 * bytes; its start holds this glue's state (the port table, the POSIX port's state, the client pointer, the call's
 * JNIEnv during a sync), the rest is the client's arena (dprec_client_init), so the SDK's memory bound is the
 * buffer's size. Releases come in as direct ByteBuffers too (a MappedByteBuffer of a release file works), read in
 * place. Errors come back as dprec_status values; the Java side turns each into a DprecException carrying the code
 * and dprec_strerror's text.
 *
 * Threads: the Java methods are synchronized on the client, so one call at a time reaches a client, as the SDK
 * requires. The transport callback runs on the thread that called sync (its JNIEnv is kept for the call).
 *
 * Portable C11 over <jni.h> and the dprec headers only: the same file builds for the desktop JVM (this tree's
 * CMake, when a JDK is present) and for Android with the NDK (docs/sdk.md shows the Gradle/CMake integration; CI
 * compiles it for aarch64 and armhf as well). */
#include <jni.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dprec/dprec.h"
#include "dprec/port_posix.h"
#include "dprec/sync.h"

/* This tree's build generates the Java classes' JNI declarations (javac -h) and includes them here, so that a native
 * method whose C signature drifted from its Java declaration fails to compile. An Android build need not. */
#ifdef DPREC_JNI_GENERATED_HEADERS
#include "org_dprec_DprecClient.h"
#include "org_dprec_DprecClient_Sink.h"
#include "org_dprec_DprecException.h"
#endif

/* What the glue keeps at the start of the app's buffer. */
typedef struct jni_state {
    dprec_port port;
    dprec_port_posix posix;
    dprec_client *client;
    /* during a sync only: the caller's environment and transport */
    JNIEnv *env;
    jobject transport;
    jthrowable thrown; /* what the Java transport threw other than an IOException: rethrown when sync returns */
    char transport_error[256]; /* the exception of the last request that got no answer (dprec_transport.last_error) */
} jni_state;

#define STATE_BYTES ((sizeof(jni_state) + 15u) & ~(size_t)15u)

/* The configuration arrays DprecClient passes (DprecClient.Config.ints() / doubles()); their order is a contract
 * with DprecClient.java. */
enum { CI_NUM_ITEMS, CI_DIM, CI_CAPACITY, CI_MAX_K, CI_ENCRYPT, CI_ALLOW_NON_PRIVATE, CI_LEDGER_JOBS, CI_PENDING_SLOTS,
       CI_MAX_REPORT_BYTES, CI_FW_MAX_RATINGS, CI_SGLD_MAX_RATINGS, CI_SECAGG_MAX_LEN, CI_SECAGG_MIN_COLLUDERS,
       CI_COUNT };
enum { CD_RATING_MIN, CD_RATING_MAX, CD_LAMBDA, CD_CAP_USER_EPS, CD_CAP_USER_DELTA, CD_CAP_RATING_EPS,
       CD_CAP_RATING_DELTA, CD_SGLD_EPSILON, CD_COUNT };
#define STORE_NAME_MAX 48

static int config_from(JNIEnv *env, jintArray ints, jdoubleArray dbls, jstring store_name, dprec_config *cfg,
                       char name[STORE_NAME_MAX]) {
    if (ints == NULL || dbls == NULL || (*env)->GetArrayLength(env, ints) != CI_COUNT ||
        (*env)->GetArrayLength(env, dbls) != CD_COUNT)
        return DPREC_ERR_INVALID_ARGUMENT;
    jint i[CI_COUNT];
    jdouble d[CD_COUNT];
    (*env)->GetIntArrayRegion(env, ints, 0, CI_COUNT, i);
    (*env)->GetDoubleArrayRegion(env, dbls, 0, CD_COUNT, d);
    for (int k = 0; k < CI_COUNT; k++)
        if (i[k] < 0) return DPREC_ERR_CONFIG;
    dprec_config_default(cfg);
    cfg->num_items = (uint32_t)i[CI_NUM_ITEMS];
    cfg->dim = (uint32_t)i[CI_DIM];
    cfg->rating_capacity = (uint32_t)i[CI_CAPACITY];
    cfg->max_k = (uint32_t)i[CI_MAX_K];
    cfg->encrypt_at_rest = i[CI_ENCRYPT] != 0;
    cfg->allow_non_private = i[CI_ALLOW_NON_PRIVATE] != 0;
    cfg->ledger_jobs = (uint32_t)i[CI_LEDGER_JOBS];
    cfg->pending_slots = (uint32_t)i[CI_PENDING_SLOTS];
    cfg->max_report_bytes = (uint32_t)i[CI_MAX_REPORT_BYTES];
    cfg->fw_max_ratings = (uint32_t)i[CI_FW_MAX_RATINGS];
    cfg->sgld_max_ratings = (uint32_t)i[CI_SGLD_MAX_RATINGS];
    cfg->secagg_max_len = (uint32_t)i[CI_SECAGG_MAX_LEN];
    cfg->secagg_min_colluders = (uint32_t)i[CI_SECAGG_MIN_COLLUDERS];
    cfg->sgld_epsilon = d[CD_SGLD_EPSILON];
    cfg->rating_min = (float)d[CD_RATING_MIN];
    cfg->rating_max = (float)d[CD_RATING_MAX];
    cfg->lambda = (float)d[CD_LAMBDA];
    cfg->cap_user_epsilon = d[CD_CAP_USER_EPS];
    cfg->cap_user_delta = d[CD_CAP_USER_DELTA];
    cfg->cap_rating_epsilon = d[CD_CAP_RATING_EPS];
    cfg->cap_rating_delta = d[CD_CAP_RATING_DELTA];
    if (store_name != NULL) {
        jsize n = (*env)->GetStringUTFLength(env, store_name);
        if (n <= 0 || n >= STORE_NAME_MAX) return DPREC_ERR_CONFIG;
        (*env)->GetStringUTFRegion(env, store_name, 0, (*env)->GetStringLength(env, store_name), name);
        name[n] = '\0';
        cfg->store_name = name;
    }
    return DPREC_OK;
}

static jni_state *state_of(jlong handle) {
    return (jni_state *)(uintptr_t)handle;
}

/* A direct buffer's first len bytes, or NULL (a heap buffer, or len past its capacity). */
static const void *direct_bytes(JNIEnv *env, jobject buf, jlong len) {
    if (buf == NULL || len < 0) return NULL;
    void *p = (*env)->GetDirectBufferAddress(env, buf);
    jlong cap = (*env)->GetDirectBufferCapacity(env, buf);
    if (p == NULL || cap < len) return NULL;
    return p;
}

/* ---- lifecycle ---------------------------------------------------------------------------------------------- */

JNIEXPORT jlong JNICALL Java_org_dprec_DprecClient_nativeRequiredSize(JNIEnv *env, jclass cls, jintArray ints,
                                                                      jdoubleArray dbls, jstring store_name) {
    (void)cls;
    dprec_config cfg;
    char name[STORE_NAME_MAX];
    int rc = config_from(env, ints, dbls, store_name, &cfg, name);
    if (rc != DPREC_OK) return rc;
    size_t n = dprec_client_required_size(&cfg);
    return n == 0 ? (jlong)DPREC_ERR_CONFIG : (jlong)(STATE_BYTES + 15u + n);
}

/* Creates the client in the buffer and loads its store: the handle (> 0), or a negative dprec_status. *load gets
 * the load's status when it is one a client can go on with (DPREC_OK, _STORE_CORRUPT, _STORE_TRUNCATED). */
JNIEXPORT jlong JNICALL Java_org_dprec_DprecClient_nativeOpen(JNIEnv *env, jclass cls, jobject mem, jintArray ints,
                                                              jdoubleArray dbls, jstring store_name, jstring dir,
                                                              jbyteArray key, jintArray load) {
    (void)cls;
    if (mem == NULL || dir == NULL || load == NULL || (*env)->GetArrayLength(env, load) < 1)
        return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char *base = (*env)->GetDirectBufferAddress(env, mem);
    jlong cap = (*env)->GetDirectBufferCapacity(env, mem);
    if (base == NULL || cap < 0) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char *aligned = base + ((16u - ((uintptr_t)base & 15u)) & 15u);
    if ((size_t)cap < (size_t)(aligned - base) + STATE_BYTES) return DPREC_ERR_NO_MEMORY;
    jni_state *st = (jni_state *)(void *)aligned;
    memset(st, 0, sizeof *st);

    dprec_config cfg;
    char name[STORE_NAME_MAX];
    int rc = config_from(env, ints, dbls, store_name, &cfg, name);
    if (rc != DPREC_OK) return rc;
    const char *d = (*env)->GetStringUTFChars(env, dir, NULL);
    if (d == NULL) return DPREC_ERR_NO_MEMORY; /* an OutOfMemoryError is pending */
    rc = dprec_port_posix_init(&st->port, &st->posix, d);
    (*env)->ReleaseStringUTFChars(env, dir, d);
    if (rc != DPREC_OK) return rc;
    if (key != NULL) {
        if ((*env)->GetArrayLength(env, key) != 32) return DPREC_ERR_INVALID_ARGUMENT;
        unsigned char k[32];
        (*env)->GetByteArrayRegion(env, key, 0, 32, (jbyte *)k);
        dprec_port_posix_set_key(&st->posix, k);
        memset(k, 0, sizeof k);
    }
    unsigned char *arena = aligned + STATE_BYTES;
    size_t arena_size = (size_t)cap - (size_t)(arena - base);
    rc = dprec_client_init(&st->client, &cfg, &st->port, arena, arena_size);
    if (rc != DPREC_OK) return rc;
    int lr = dprec_store_load(st->client);
    if (lr != DPREC_OK && lr != DPREC_ERR_STORE_CORRUPT && lr != DPREC_ERR_STORE_TRUNCATED) {
        dprec_client_free(st->client);
        st->client = NULL;
        return lr;
    }
    jint l = lr;
    (*env)->SetIntArrayRegion(env, load, 0, 1, &l);
    return (jlong)(uintptr_t)st;
}

JNIEXPORT void JNICALL Java_org_dprec_DprecClient_nativeClose(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    jni_state *st = state_of(h);
    if (st == NULL) return;
    dprec_client_free(st->client); /* wipes the ratings and keys, releases the store's lock */
    memset(st, 0, sizeof *st);
}

JNIEXPORT jlong JNICALL Java_org_dprec_DprecClient_nativeMemoryUsed(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    return (jlong)(STATE_BYTES + dprec_client_memory_used(state_of(h)->client));
}

JNIEXPORT jstring JNICALL Java_org_dprec_DprecClient_nativeVersion(JNIEnv *env, jclass cls) {
    (void)cls;
    return (*env)->NewStringUTF(env, dprec_version());
}

JNIEXPORT jstring JNICALL Java_org_dprec_DprecException_nativeStatusName(JNIEnv *env, jclass cls, jint status) {
    (void)cls;
    return (*env)->NewStringUTF(env, dprec_status_name(status));
}

JNIEXPORT jstring JNICALL Java_org_dprec_DprecException_nativeStrerror(JNIEnv *env, jclass cls, jint status) {
    (void)cls;
    return (*env)->NewStringUTF(env, dprec_strerror(status));
}

/* The direct buffer's address, so that Java can refuse a buffer (or a slice of one) that a live client uses. */
JNIEXPORT jlong JNICALL Java_org_dprec_DprecClient_nativeAddress(JNIEnv *env, jclass cls, jobject buf) {
    (void)cls;
    void *p = buf != NULL ? (*env)->GetDirectBufferAddress(env, buf) : NULL;
    return (jlong)(uintptr_t)p;
}

/* ---- diagnostics: the last call's failure (dprec_client_last_error_info) -------------------------------------- */

/* nums gets {cause, http_status}; the answer is {detail line, request, server code, message}. */
JNIEXPORT jobjectArray JNICALL Java_org_dprec_DprecClient_nativeLastError(JNIEnv *env, jclass cls, jlong h,
                                                                          jintArray nums) {
    (void)cls;
    jni_state *st = state_of(h);
    dprec_error_info info;
    DPREC_STRUCT_INIT(&info);
    char line[DPREC_ERROR_REQUEST_MAX + DPREC_ERROR_CODE_MAX + DPREC_ERROR_MESSAGE_MAX + 64];
    line[0] = '\0';
    if (st == NULL || st->client == NULL || dprec_client_last_error_info(st->client, &info) != DPREC_OK) return NULL;
    (void)dprec_client_last_error_detail(st->client, line, sizeof line);
    if (nums != NULL && (*env)->GetArrayLength(env, nums) >= 2) {
        jint v[2] = {info.cause, info.http_status};
        (*env)->SetIntArrayRegion(env, nums, 0, 2, v);
    }
    jclass scls = (*env)->FindClass(env, "java/lang/String");
    jobjectArray out = scls != NULL ? (*env)->NewObjectArray(env, 4, scls, NULL) : NULL;
    if (out == NULL) return NULL;
    const char *parts[4] = {line, info.request, info.server_code, info.message}; /* printable ASCII: valid UTF-8 */
    for (jsize i = 0; i < 4; i++) {
        jstring s = (*env)->NewStringUTF(env, parts[i]);
        if (s == NULL) return NULL;
        (*env)->SetObjectArrayElement(env, out, i, s);
        (*env)->DeleteLocalRef(env, s);
    }
    return out;
}

/* ---- the privacy ledger and the trusted release ---------------------------------------------------------------- */

/* A ledger line as DprecClient.LedgerEntry reads it: n {job, unit, model, reports, rounds, last_round, max_rounds},
 * d {epsilon, delta, user_epsilon, user_delta}. */
static void ledger_out(JNIEnv *env, const dprec_ledger_entry *e, jlongArray n, jdoubleArray d) {
    jlong nv[7] = {(jlong)e->job_id, e->unit, e->model, e->reports, e->rounds, (jlong)e->last_round,
                   (jlong)e->max_rounds};
    jdouble dv[4] = {e->epsilon, e->delta, e->user_epsilon, e->user_delta};
    if (n != NULL && (*env)->GetArrayLength(env, n) >= 7) (*env)->SetLongArrayRegion(env, n, 0, 7, nv);
    if (d != NULL && (*env)->GetArrayLength(env, d) >= 4) (*env)->SetDoubleArrayRegion(env, d, 0, 4, dv);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeLedgerCount(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    return (jint)dprec_ledger_count(state_of(h)->client);
}

/* index >= 0: the index-th line; index < 0: the line of job. */
JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeLedgerLine(JNIEnv *env, jclass cls, jlong h, jint index,
                                                                   jlong job, jlongArray n, jdoubleArray d) {
    (void)cls;
    dprec_ledger_entry e;
    int rc = index >= 0 ? dprec_ledger_at(state_of(h)->client, (uint32_t)index, &e)
                        : dprec_ledger_job(state_of(h)->client, (uint64_t)job, &e);
    if (rc == DPREC_OK) ledger_out(env, &e, n, d);
    return rc;
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeLedgerTotal(JNIEnv *env, jclass cls, jlong h, jint unit,
                                                                    jdoubleArray out) {
    (void)cls;
    double eps = 0.0, delta = 0.0;
    if (out == NULL || (*env)->GetArrayLength(env, out) < 2) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_ledger_total(state_of(h)->client, (dprec_unit)unit, &eps, &delta);
    if (rc == DPREC_OK) {
        jdouble v[2] = {eps, delta};
        (*env)->SetDoubleArrayRegion(env, out, 0, 2, v);
    }
    return rc;
}

/* ---- the rating store --------------------------------------------------------------------------------------- */

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeRate(JNIEnv *env, jclass cls, jlong h, jint item, jfloat value,
                                                             jlong timestamp) {
    (void)env;
    (void)cls;
    if (item < 0) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    return dprec_store_put(state_of(h)->client, (uint32_t)item, value, (int64_t)timestamp);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeRemove(JNIEnv *env, jclass cls, jlong h, jint item) {
    (void)env;
    (void)cls;
    if (item < 0) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    return dprec_store_remove(state_of(h)->client, (uint32_t)item);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeCount(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    return (jint)dprec_store_count(state_of(h)->client);
}

/* The index-th rating: item into out_item[0], value into out_value[0], timestamp into out_ts[0]. */
JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeRatingAt(JNIEnv *env, jclass cls, jlong h, jint index,
                                                                 jintArray out_item, jfloatArray out_value,
                                                                 jlongArray out_ts) {
    (void)cls;
    if (index < 0) return DPREC_ERR_INVALID_ARGUMENT;
    dprec_rating r;
    int rc = dprec_store_at(state_of(h)->client, (uint32_t)index, &r);
    if (rc != DPREC_OK) return rc;
    jint item = (jint)r.item;
    jfloat value = r.value;
    jlong ts = (jlong)r.timestamp;
    (*env)->SetIntArrayRegion(env, out_item, 0, 1, &item);
    (*env)->SetFloatArrayRegion(env, out_value, 0, 1, &value);
    (*env)->SetLongArrayRegion(env, out_ts, 0, 1, &ts);
    return DPREC_OK;
}

/* ---- releases ------------------------------------------------------------------------------------------------ */

/* info as DprecClient.ReleaseInfo reads it: {format_version, flags, release_version, job_id, m, d, sig_len,
 * total_size}, and its digest. */
static void info_out(JNIEnv *env, const dprec_release_info *info, jlongArray out, jbyteArray digest) {
    if (out != NULL && (*env)->GetArrayLength(env, out) >= 8) {
        jlong v[8] = {info->format_version, info->flags, (jlong)info->release_version, (jlong)info->job_id,
                      info->num_items, info->dim, info->sig_len, (jlong)info->total_size};
        (*env)->SetLongArrayRegion(env, out, 0, 8, v);
    }
    if (digest != NULL && (*env)->GetArrayLength(env, digest) >= (jsize)DPREC_RELEASE_DIGEST_SIZE)
        (*env)->SetByteArrayRegion(env, digest, 0, DPREC_RELEASE_DIGEST_SIZE, (const jbyte *)info->digest);
}

/* Copies the pinned key out of its Java array into key (at most cap bytes); its length, or -1. */
static jsize key_in(JNIEnv *env, jbyteArray key, unsigned char *buf, jsize cap) {
    if (key == NULL) return 0;
    jsize n = (*env)->GetArrayLength(env, key);
    if (n > cap) return -1;
    (*env)->GetByteArrayRegion(env, key, 0, n, (jbyte *)buf);
    return n;
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeVerify(JNIEnv *env, jclass cls, jlong h, jobject release,
                                                               jlong len, jbyteArray key, jint flags,
                                                               jlongArray out, jbyteArray digest) {
    (void)cls;
    const void *rel = direct_bytes(env, release, len);
    if (rel == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char k[512];
    jsize kn = key_in(env, key, k, (jsize)sizeof k);
    if (kn < 0) return DPREC_ERR_CONFIG;
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = kn > 0 ? k : NULL;
    vc.release_key_len = (size_t)kn;
    vc.flags = (uint32_t)flags;
    dprec_release_info info;
    int rc = dprec_release_verify(state_of(h)->client, rel, (size_t)len, &vc, &info);
    if (rc == DPREC_OK) info_out(env, &info, out, digest);
    return rc;
}

/* The client's trusted release: info and digest as for nativeVerify, insecure[0] 1 if trusted without a signature check. */
JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeTrusted(JNIEnv *env, jclass cls, jlong h, jlongArray out,
                                                                jbyteArray digest, jintArray insecure) {
    (void)cls;
    dprec_release_info info;
    int ins = 0;
    int rc = dprec_release_trusted(state_of(h)->client, &info, &ins);
    if (rc == DPREC_OK) {
        info_out(env, &info, out, digest);
        jint v = ins;
        if (insecure != NULL && (*env)->GetArrayLength(env, insecure) >= 1)
            (*env)->SetIntArrayRegion(env, insecure, 0, 1, &v);
    }
    return rc;
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeVerifyBegin(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    return dprec_verify_begin(state_of(h)->client);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeVerifyFeed(JNIEnv *env, jclass cls, jlong h, jobject chunk,
                                                                   jint len) {
    (void)cls;
    const void *p = direct_bytes(env, chunk, len);
    if (p == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    return dprec_verify_feed(state_of(h)->client, p, (size_t)len);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeVerifyEnd(JNIEnv *env, jclass cls, jlong h, jbyteArray key,
                                                                  jint flags, jlongArray out, jbyteArray digest) {
    (void)cls;
    unsigned char k[512];
    jsize kn = key_in(env, key, k, (jsize)sizeof k);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.release_key = kn > 0 ? k : NULL;
    vc.release_key_len = kn > 0 ? (size_t)kn : 0u;
    vc.flags = (uint32_t)flags;
    dprec_release_info info;
    int rc = dprec_verify_end(state_of(h)->client, &vc, &info);
    if (kn < 0) return DPREC_ERR_CONFIG; /* the stream is ended either way */
    if (rc == DPREC_OK) info_out(env, &info, out, digest);
    return rc;
}

/* The top-K goes into `out`, a direct buffer of at least 8 k bytes in the platform's byte order that Java allocated
 * with the client (dprec_recommendation: item u32, score f32), and Java reads it from there. */
JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeRecommend(JNIEnv *env, jclass cls, jlong h, jobject release,
                                                                  jlong len, jint k, jobject out) {
    (void)cls;
    const void *rel = direct_bytes(env, release, len);
    void *o = k > 0 ? (void *)direct_bytes(env, out, (jlong)k * (jlong)sizeof(dprec_recommendation)) : NULL;
    if (rel == NULL || o == NULL || ((uintptr_t)o % _Alignof(dprec_recommendation)) != 0)
        return DPREC_ERR_INVALID_ARGUMENT;
    uint32_t n = 0;
    int rc = dprec_recommend(state_of(h)->client, rel, (size_t)len, (uint32_t)k, (dprec_recommendation *)o, &n);
    return rc != DPREC_OK ? rc : (jint)n; /* >= 0: the number of items */
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativePredict(JNIEnv *env, jclass cls, jlong h, jobject release,
                                                                jlong len, jint item, jfloatArray score) {
    (void)cls;
    const void *rel = direct_bytes(env, release, len);
    if (rel == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    if (item < 0) return DPREC_ERR_ITEM_OUT_OF_RANGE;
    float s = 0.0f;
    int rc = dprec_predict(state_of(h)->client, rel, (size_t)len, (uint32_t)item, &s);
    if (rc == DPREC_OK) {
        jfloat v = s;
        (*env)->SetFloatArrayRegion(env, score, 0, 1, &v);
    }
    return rc;
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeFit(JNIEnv *env, jclass cls, jlong h, jobject release,
                                                            jlong len) {
    (void)cls;
    const void *rel = direct_bytes(env, release, len);
    if (rel == NULL) return DPREC_ERR_INVALID_ARGUMENT;
    return dprec_fit(state_of(h)->client, rel, (size_t)len);
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeUserVector(JNIEnv *env, jclass cls, jlong h, jfloatArray out) {
    (void)cls;
    float u[DPREC_MAX_DIM];
    jsize n = (*env)->GetArrayLength(env, out);
    if (n <= 0 || n > (jsize)DPREC_MAX_DIM) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_user_vector(state_of(h)->client, u, (uint32_t)n);
    if (rc == DPREC_OK) (*env)->SetFloatArrayRegion(env, out, 0, n, u);
    return rc;
}

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeIdentityKey(JNIEnv *env, jclass cls, jlong h, jbyteArray out) {
    (void)cls;
    unsigned char pk[DPREC_IDENTITY_KEY_SIZE];
    if (out == NULL || (*env)->GetArrayLength(env, out) != (jsize)sizeof pk) return DPREC_ERR_INVALID_ARGUMENT;
    int rc = dprec_identity_key(state_of(h)->client, pk);
    if (rc == DPREC_OK) (*env)->SetByteArrayRegion(env, out, 0, (jsize)sizeof pk, (const jbyte *)pk);
    return rc;
}

/* ---- sync: the transport is a Java object (org.dprec.Transport) ---------------------------------------------- */

/* The sink the SDK gave for one response, as org.dprec.DprecClient.Sink holds it (two longs: the function and its
 * user pointer), and the first non-zero status it returned (which aborts the request). */
typedef struct sink_call {
    dprec_http_sink fn;
    void *user;
    int aborted;
} sink_call;

JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_00024Sink_nativeWrite(JNIEnv *env, jclass cls, jlong call,
                                                                         jbyteArray b, jint off, jint len) {
    (void)cls;
    sink_call *s = (sink_call *)(uintptr_t)call;
    if (s == NULL || b == NULL || off < 0 || len < 0 || off > (*env)->GetArrayLength(env, b) - len)
        return DPREC_ERR_INVALID_ARGUMENT;
    if (s->aborted != 0) return s->aborted;
    unsigned char buf[8192];
    while (len > 0) {
        jint n = len < (jint)sizeof buf ? len : (jint)sizeof buf;
        (*env)->GetByteArrayRegion(env, b, off, n, (jbyte *)buf);
        int rc = s->fn(s->user, buf, (size_t)n);
        if (rc != 0) {
            s->aborted = rc;
            return rc;
        }
        off += n;
        len -= n;
    }
    return 0;
}

static jstring utf_or_null(JNIEnv *env, const char *s) {
    return s != NULL ? (*env)->NewStringUTF(env, s) : NULL;
}

/* Keeps ex.toString() ("javax.net.ssl.SSLHandshakeException: ...") as the text of a request that got no answer. */
static void keep_error_text(JNIEnv *env, jni_state *st, jthrowable ex) {
    st->transport_error[0] = '\0';
    jclass ocls = (*env)->FindClass(env, "java/lang/Object");
    jmethodID to_string = ocls != NULL ? (*env)->GetMethodID(env, ocls, "toString", "()Ljava/lang/String;") : NULL;
    jstring s = to_string != NULL ? (jstring)(*env)->CallObjectMethod(env, ex, to_string) : NULL;
    if ((*env)->ExceptionCheck(env)) (*env)->ExceptionClear(env);
    if (s == NULL) return;
    const char *u = (*env)->GetStringUTFChars(env, s, NULL);
    if (u != NULL) {
        size_t n = strlen(u);
        if (n >= sizeof st->transport_error) n = sizeof st->transport_error - 1;
        memcpy(st->transport_error, u, n); /* the SDK keeps printable ASCII of it */
        st->transport_error[n] = '\0';
        (*env)->ReleaseStringUTFChars(env, s, u);
    }
}

static const char *java_last_error(void *ctx) {
    return ((jni_state *)ctx)->transport_error;
}

/* dprec_transport.request over Transport.request(method, path, bearer, contentType, body, sink), which returns a
 * Transport.Response {status, retryAfterSeconds}. An IOException is "no response" (DPREC_ERR_NETWORK; javax.net.ssl.SSLException:
 * DPREC_ERR_TLS); a sink that aborted returns its own status. */
static int java_request(void *ctx, const dprec_http_request *req, dprec_http_sink sink, void *sink_user,
                        dprec_http_response *resp) {
    jni_state *st = ctx;
    JNIEnv *env = st->env;
    int rc = DPREC_ERR_NETWORK;
    st->transport_error[0] = '\0';
    if ((*env)->PushLocalFrame(env, 16) != 0) return DPREC_ERR_NO_MEMORY;
    jclass tcls = (*env)->GetObjectClass(env, st->transport);
    jmethodID mid = (*env)->GetMethodID(env, tcls, "request",
                                        "(Ljava/lang/String;Ljava/lang/String;Ljava/lang/String;Ljava/lang/String;"
                                        "[BLjava/io/OutputStream;)Lorg/dprec/Transport$Response;");
    jclass scls = (*env)->FindClass(env, "org/dprec/DprecClient$Sink");
    jmethodID sinit = scls != NULL ? (*env)->GetMethodID(env, scls, "<init>", "(J)V") : NULL;
    if (mid == NULL || sinit == NULL) { /* not a Transport: the pending NoSuchMethodError is kept for the caller */
        jthrowable ex = (*env)->ExceptionOccurred(env);
        (*env)->ExceptionClear(env);
        if (ex != NULL && st->thrown == NULL) st->thrown = (*env)->NewGlobalRef(env, ex);
        (*env)->PopLocalFrame(env, NULL);
        return DPREC_ERR_INTERNAL;
    }
    sink_call call = {sink, sink_user, 0};
    jobject jsink = (*env)->NewObject(env, scls, sinit, (jlong)(uintptr_t)&call);
    jbyteArray body = NULL;
    if (req->body != NULL && req->body_len > 0) {
        if (req->body_len > (size_t)INT32_MAX || (body = (*env)->NewByteArray(env, (jsize)req->body_len)) == NULL) {
            (*env)->ExceptionClear(env);
            (*env)->PopLocalFrame(env, NULL);
            return DPREC_ERR_NO_MEMORY;
        }
        (*env)->SetByteArrayRegion(env, body, 0, (jsize)req->body_len, (const jbyte *)req->body);
    }
    jobject r = jsink == NULL ? NULL
                              : (*env)->CallObjectMethod(env, st->transport, mid, utf_or_null(env, req->method),
                                                         utf_or_null(env, req->path), utf_or_null(env, req->bearer),
                                                         utf_or_null(env, req->content_type), body, jsink);
    jthrowable ex = (*env)->ExceptionOccurred(env);
    if (ex != NULL) {
        (*env)->ExceptionClear(env);
        keep_error_text(env, st, ex);
        jclass ssl = (*env)->FindClass(env, "javax/net/ssl/SSLException");
        jclass io = (*env)->FindClass(env, "java/io/IOException");
        if (call.aborted != 0) rc = call.aborted;
        else if (ssl != NULL && (*env)->IsInstanceOf(env, ex, ssl)) rc = DPREC_ERR_TLS;
        else if (io != NULL && (*env)->IsInstanceOf(env, ex, io)) rc = DPREC_ERR_NETWORK;
        else { /* a bug in the app's transport: the sync stops, and the caller gets this exception */
            if (st->thrown == NULL) st->thrown = (*env)->NewGlobalRef(env, ex);
            rc = DPREC_ERR_INTERNAL;
        }
        (*env)->ExceptionClear(env);
    } else if (call.aborted != 0) {
        rc = call.aborted;
    } else if (r == NULL) {
        rc = DPREC_ERR_PROTOCOL; /* the transport answered no Response */
    } else {
        jclass rcls = (*env)->GetObjectClass(env, r);
        jfieldID fs = (*env)->GetFieldID(env, rcls, "status", "I");
        jfieldID fr = (*env)->GetFieldID(env, rcls, "retryAfterSeconds", "I");
        if (fs == NULL || fr == NULL) {
            (*env)->ExceptionClear(env);
            rc = DPREC_ERR_INTERNAL;
        } else {
            jint retry = (*env)->GetIntField(env, r, fr);
            resp->status = (*env)->GetIntField(env, r, fs);
            resp->retry_after = retry > 0 ? (uint32_t)retry : 0u;
            rc = DPREC_OK;
        }
    }
    (*env)->PopLocalFrame(env, NULL);
    return rc;
}

/* One step of the sync loop: out gets {outcome, retry_after_ms, round, release_version, job_done, last_error}. */
JNIEXPORT jint JNICALL Java_org_dprec_DprecClient_nativeSync(JNIEnv *env, jclass cls, jlong h, jobject transport,
                                                             jlong job, jbyteArray key, jbyteArray token,
                                                             jlongArray out) {
    (void)cls;
    jni_state *st = state_of(h);
    if (transport == NULL || key == NULL || out == NULL || (*env)->GetArrayLength(env, out) < 6)
        return DPREC_ERR_INVALID_ARGUMENT;
    unsigned char k[512], tok[512];
    jsize kn = key_in(env, key, k, (jsize)sizeof k);
    if (kn <= 0) return DPREC_ERR_CONFIG;
    jsize tn = 0;
    if (token != NULL) {
        tn = key_in(env, token, tok, (jsize)sizeof tok);
        if (tn <= 0) return DPREC_ERR_ENROLLMENT; /* empty, or longer than any token */
    }
    dprec_transport t;
    DPREC_STRUCT_INIT(&t);
    t.ctx = st;
    t.request = java_request;
    t.last_error = java_last_error;
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    sc.job_id = (uint64_t)job;
    sc.release_key = k;
    sc.release_key_len = (size_t)kn;
    sc.enrollment_token = tn > 0 ? tok : NULL;
    sc.enrollment_token_len = (size_t)tn;
    st->env = env;
    st->transport = transport;
    st->thrown = NULL;
    dprec_sync_result res;
    memset(&res, 0, sizeof res);
    int rc = dprec_client_sync(st->client, &t, &sc, &res);
    st->env = NULL;
    st->transport = NULL;
    if (st->thrown != NULL) { /* the transport's own exception, as the app's code threw it */
        (*env)->Throw(env, st->thrown);
        (*env)->DeleteGlobalRef(env, st->thrown);
        st->thrown = NULL;
        return DPREC_ERR_INTERNAL;
    }
    /* filled on a failure too: its outcome says whether to retry (RETRY_LATER with a backoff, or FAILED) */
    jlong v[6] = {res.outcome, res.retry_after_ms, (jlong)res.round, (jlong)res.release_version, res.job_done,
                  res.last_error};
    (*env)->SetLongArrayRegion(env, out, 0, 6, v);
    return rc;
}
