/* A consumer of an installed dprec (tests/consumer.cmake builds it with CMake's find_package and with pkg-config):
 * checks that the library is the version of its headers, rates, verifies a release it wrote itself and recommends,
 * through the public headers only; then, given an aggregator, syncs with it over pinned HTTPS through the installed
 * transport (mbedTLS's; libcurl's when built with -DCONSUMER_CURL). Prints "consumer: ok <version> <item>" and, after
 * a sync, " reported round <r>".
 * usage: consumer DIR [URL CA_FILE PIN_FILE JOB RELEASE_KEY_DER]   (the catalogue has 20 items) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dprec/dprec.h>
#include <dprec/port_posix.h>
#ifdef CONSUMER_CURL
#include <dprec/transport_curl.h>
#else
#include <dprec/transport_mbedtls.h>
#endif

enum { M = 20, D = 4 };

static size_t read_file(const char *path, void *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f != NULL ? fread(buf, 1, cap - 1, f) : 0;
    if (f != NULL) fclose(f);
    ((char *)buf)[n] = '\0';
    return n;
}

/* One sync with the aggregator at argv[2..6], as a device of the private bias model (d = 1) with a user budget. */
static int sync_once(dprec_port *port, dprec_port_posix *posix, char **argv, dprec_sync_result *res) {
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = M;
    cfg.dim = 1;
    cfg.cap_user_epsilon = 2.0;
    cfg.cap_user_delta = 1e-5;
    static unsigned char mem[DPREC_CLIENT_MEMORY_BOUND(1, 1000, 100)];
    dprec_client *c = NULL;
    int rc = dprec_client_init(&c, &cfg, port, mem, sizeof mem);
    if (rc == DPREC_OK) rc = dprec_store_load(c);
    static char pin[256];
    static unsigned char key[512];
    (void)read_file(argv[4], pin, sizeof pin); /* tls-pin.txt as it is, final newline included */
    size_t key_len = read_file(argv[6], key, sizeof key);
    dprec_transport t;
#ifdef CONSUMER_CURL
    dprec_transport_curl state;
    dprec_curl_options opt;
    DPREC_STRUCT_INIT(&opt);
    opt.ca_file = argv[3];
    opt.pinned_public_key = pin;
    (void)posix;
    if (rc == DPREC_OK) rc = dprec_transport_curl_init(&t, &state, argv[2], &opt);
#else
    dprec_net net;
    dprec_transport_mbedtls state;
    dprec_mbedtls_options opt;
    DPREC_STRUCT_INIT(&opt);
    opt.ca_file = argv[3];
    opt.pinned_public_key = pin;
    if (rc == DPREC_OK) rc = dprec_net_posix_init(&net, posix);
    if (rc == DPREC_OK) rc = dprec_transport_mbedtls_init(&t, &state, argv[2], port, &net, &opt);
#endif
    int transport_up = rc == DPREC_OK;
    dprec_sync_config sc;
    DPREC_STRUCT_INIT(&sc);
    sc.job_id = strtoull(argv[5], NULL, 10);
    sc.release_key = key;
    sc.release_key_len = key_len;
    if (rc == DPREC_OK) rc = dprec_client_sync(c, &t, &sc, res);
    if (rc == DPREC_OK && res->outcome != DPREC_SYNC_REPORTED) rc = res->last_error != 0 ? res->last_error : DPREC_ERR_STATE;
    if (rc != DPREC_OK) {
#ifdef CONSUMER_CURL
        fprintf(stderr, "consumer: sync: %s\n", transport_up ? dprec_transport_curl_last_error(&state) : "");
#else
        fprintf(stderr, "consumer: sync: %s\n", transport_up ? dprec_transport_mbedtls_last_error(&state) : "");
#endif
    }
    if (transport_up) {
#ifdef CONSUMER_CURL
        dprec_transport_curl_cleanup(&state);
#else
        dprec_transport_mbedtls_cleanup(&state);
#endif
    }
    dprec_client_free(c);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 7) {
        fprintf(stderr, "usage: consumer DIR [URL CA_FILE PIN_FILE JOB RELEASE_KEY_DER]\n");
        return 2;
    }
    if (strcmp(dprec_version(), DPREC_VERSION_STRING) != 0 || dprec_version_number() != DPREC_VERSION_NUMBER) {
        fprintf(stderr, "consumer: headers %s, library %s\n", DPREC_VERSION_STRING, dprec_version());
        return 1;
    }
    dprec_port port;
    dprec_port_posix posix;
    int rc = dprec_port_posix_init(&port, &posix, argv[1]);
    dprec_config cfg;
    dprec_config_default(&cfg);
    cfg.num_items = M;
    cfg.dim = D;
    static unsigned char mem[DPREC_CLIENT_MEMORY_BOUND(D, 1000, 100)];
    dprec_client *c = NULL;
    if (rc == DPREC_OK) rc = dprec_client_init(&c, &cfg, &port, mem, sizeof mem);
    if (rc == DPREC_OK) rc = dprec_store_load(c);
    if (rc == DPREC_OK) rc = dprec_store_put(c, 3, 5.0f, DPREC_TIMESTAMP_NOW);

    /* a release of M items: item j's profile is j/M in every coordinate */
    static float v[M * D];
    for (int j = 0; j < M; j++)
        for (int k = 0; k < D; k++) v[j * D + k] = (float)j / M;
    static unsigned char rel[8192];
    dprec_release_info info;
    memset(&info, 0, sizeof info);
    info.num_items = M;
    info.dim = D;
    info.rating_min = 1.0f;
    info.rating_max = 5.0f;
    size_t len = 0;
    if (rc == DPREC_OK) rc = dprec_release_write(rel, sizeof rel, &info, v, NULL, &len);
    dprec_verify_config vc;
    dprec_verify_config_init(&vc);
    vc.flags = DPREC_VERIFY_INSECURE_UNSIGNED; /* a release made here, unsigned: test data */
    if (rc == DPREC_OK) rc = dprec_release_verify(c, rel, len, &vc, NULL);
    dprec_recommendation top[3];
    uint32_t n = 0;
    if (rc == DPREC_OK) rc = dprec_recommend(c, rel, len, 3, top, &n);
    dprec_client_free(c);
    if (rc != DPREC_OK || n != 3) {
        fprintf(stderr, "consumer: %s (%s)\n", dprec_status_name(rc), dprec_strerror(rc));
        return 1;
    }
    printf("consumer: ok %s %u", dprec_version(), (unsigned)top[0].item);
    if (argc == 7) {
        dprec_sync_result res;
        memset(&res, 0, sizeof res);
        rc = sync_once(&port, &posix, argv, &res);
        if (rc != DPREC_OK) {
            printf("\n");
            fprintf(stderr, "consumer: sync: %s (%s)\n", dprec_status_name(rc), dprec_strerror(rc));
            return 1;
        }
        printf(" reported round %llu", (unsigned long long)res.round);
    }
    printf("\n");
    return 0;
}
