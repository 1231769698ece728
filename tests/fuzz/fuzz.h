/* The fuzz targets' common entry points (libFuzzer's names). Every target is built twice: with clang's
 * -fsanitize=fuzzer for scripts/fuzz.sh (a bounded libFuzzer run in CI), and with standalone.c's main(), which
 * runs the target once on each file or directory it is given: tests/CMakeLists.txt runs every target over its
 * seeds (fuzz_seeds.c) and over tests/fuzz/regressions/<target>/ (inputs that once crashed) in every build,
 * cross and sanitizer builds included. A target reports a broken invariant by abort(). */
#ifndef DPREC_FUZZ_H
#define DPREC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz invariant broken at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
