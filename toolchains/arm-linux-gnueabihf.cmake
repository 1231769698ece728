# Cross build for arm-linux-gnueabihf on Debian, tested under qemu-user (scripts/cross-test.sh).
# Needs gcc-arm-linux-gnueabihf, libc6-dev-armhf-cross, qemu-user and the multiarch
# -dev packages libmbedtls-dev:armhf and libcmocka-dev:armhf (bash scripts/setup.sh installs them all).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-linux-gnueabihf-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE arm-linux-gnueabihf)

# The cross libc sysroot, then Debian's multiarch directories for the libraries we link.
set(CMAKE_FIND_ROOT_PATH /usr/arm-linux-gnueabihf)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs each test through qemu-user: the cross sysroot's dynamic loader, and the multiarch library
# directory for libmbedcrypto and libcmocka.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-arm -L /usr/arm-linux-gnueabihf -E LD_LIBRARY_PATH=/usr/lib/arm-linux-gnueabihf)
