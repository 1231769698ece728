# Cross build for aarch64-linux-gnu on Debian, tested under qemu-user (scripts/cross-test.sh).
# Needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user and the multiarch
# -dev packages libmbedtls-dev:arm64 and libcmocka-dev:arm64 (bash scripts/setup.sh installs them all).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# The cross libc sysroot, then Debian's multiarch directories for the libraries we link.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs each test through qemu-user: the cross sysroot's dynamic loader, and the multiarch library
# directory for libmbedcrypto and libcmocka.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu)
