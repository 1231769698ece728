# Android cross build: wraps the NDK's own toolchain file (not testable on this machine: the NDK is not a
# Debian package). Usage:
#   cmake -S . -B build-android -DCMAKE_TOOLCHAIN_FILE=toolchains/android.cmake \
#         -DANDROID_NDK=/path/to/ndk -DANDROID_ABI=arm64-v8a   (or armeabi-v7a) \
#         -DDPREC_BUILD_TESTS=OFF -DDPREC_BUILD_EXAMPLES=OFF \
#         -DMBEDTLS_INCLUDE_DIR=/path/to/mbedtls/include -DMBEDCRYPTO_LIBRARY=/path/to/android/libmbedcrypto.a \
#         -DMBEDTLS_LIBRARY=/path/to/android/libmbedtls.a -DMBEDX509_LIBRARY=/path/to/android/libmbedx509.a
# mbedTLS must be cross-built for the same ABI (its CMake project builds with this same NDK toolchain).
if(NOT ANDROID_NDK)
  if(DEFINED ENV{ANDROID_NDK_HOME})
    set(ANDROID_NDK $ENV{ANDROID_NDK_HOME})
  elseif(DEFINED ENV{ANDROID_NDK_ROOT})
    set(ANDROID_NDK $ENV{ANDROID_NDK_ROOT})
  endif()
endif()
if(NOT ANDROID_NDK OR NOT EXISTS "${ANDROID_NDK}/build/cmake/android.toolchain.cmake")
  message(FATAL_ERROR "toolchains/android.cmake: set ANDROID_NDK (or ANDROID_NDK_HOME) to an Android NDK r23+")
endif()
if(NOT ANDROID_ABI)
  set(ANDROID_ABI arm64-v8a)
endif()
if(NOT ANDROID_ABI MATCHES "^(arm64-v8a|armeabi-v7a)$")
  message(FATAL_ERROR "toolchains/android.cmake: ANDROID_ABI must be arm64-v8a or armeabi-v7a")
endif()
if(NOT ANDROID_PLATFORM)
  set(ANDROID_PLATFORM android-24)
endif()
include("${ANDROID_NDK}/build/cmake/android.toolchain.cmake")
