/* A consumer of an installed dprec (tests/consumer.cmake builds it with CMake's find_package and with pkg-config):
 * checks that the library is the version of its headers, then rates, verifies a release it wrote itself and
 * recommends, through the public headers only. Prints "consumer: ok <version> <item>" on success.
 * usage: consumer DIR */
#include <stdio.h>
#include <string.h>

#include <dprec/dprec.h>
#include <dprec/port_posix.h>

enum { M = 50, D = 4 };

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: consumer DIR\n");
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
    printf("consumer: ok %s %u\n", dprec_version(), (unsigned)top[0].item);
    return 0;
}
