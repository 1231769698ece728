# iOS cross build (not testable on this machine: it needs macOS with Xcode). Usage, on a Mac:
#   cmake -S . -B build-ios -G Xcode -DCMAKE_TOOLCHAIN_FILE=toolchains/ios.cmake \
#         -DDPREC_IOS_PLATFORM=iphoneos   (or iphonesimulator) \
#         -DDPREC_BUILD_TESTS=OFF -DDPREC_BUILD_EXAMPLES=OFF \
#         -DMBEDTLS_INCLUDE_DIR=... -DMBEDCRYPTO_LIBRARY=.../libmbedcrypto.a \
#         -DMBEDTLS_LIBRARY=.../libmbedtls.a -DMBEDX509_LIBRARY=.../libmbedx509.a   (the mbedTLS transport)
# Builds the static SDK (libdprec.a) and the POSIX port, which works unchanged on iOS (files in the app's
# sandbox directory, getentropy-free: /dev/urandom is available to apps).
set(CMAKE_SYSTEM_NAME iOS)
if(NOT DPREC_IOS_PLATFORM)
  set(DPREC_IOS_PLATFORM iphoneos)
endif()
if(DPREC_IOS_PLATFORM STREQUAL "iphoneos")
  set(CMAKE_OSX_SYSROOT iphoneos)
  set(CMAKE_OSX_ARCHITECTURES arm64)
elseif(DPREC_IOS_PLATFORM STREQUAL "iphonesimulator")
  set(CMAKE_OSX_SYSROOT iphonesimulator)
  set(CMAKE_OSX_ARCHITECTURES "arm64;x86_64")
else()
  message(FATAL_ERROR "toolchains/ios.cmake: DPREC_IOS_PLATFORM must be iphoneos or iphonesimulator")
endif()
set(CMAKE_OSX_DEPLOYMENT_TARGET 13.0 CACHE STRING "Minimum iOS version")
set(CMAKE_XCODE_ATTRIBUTE_ONLY_ACTIVE_ARCH NO)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
