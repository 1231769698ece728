# Install rules (docs/sdk.md, "Installing the SDK"), by component:
#   sdk (the default; what a plain `cmake --install build --prefix DIR` installs):
#     include/dprec/*.h                    the public headers (a transport's header only where it was built)
#     lib/libdprec.a, lib/libdprec_port_posix.a, and each transport built: lib/libdprec_transport_mbedtls.a
#                                          (every target), lib/libdprec_transport_curl.a (where libcurl was found)
#     lib/cmake/dprec/                     find_package(dprec CONFIG): dprec::dprec, dprec::port_posix,
#                                          dprec::transport_mbedtls, dprec::transport_curl
#     lib/pkgconfig/                       dprec.pc, dprec-port-posix.pc, dprec-transport-mbedtls.pc,
#                                          dprec-transport-curl.pc (each where its library was built)
#     lib/libdprec_jni.so, share/java/dprec.jar   where a JDK was found (bindings/jvm)
#   servers (only when asked for: --component servers): bin/dprec-aggregator, bin/dprec-relay, if built
#   tools (only when asked for: --component tools): bin/dprec-device, dprec-mkrelease, dprec-enroll, dprec-fleet
# tests/consumer/ is a project of its own that CI builds against an SDK-only install, both ways (tests/consumer.cmake).
# A weakened test build (DPREC_AUDIT_WEAKEN, CMakeLists.txt) is never installed: its first install rule stops the step.
if(DPREC_AUDIT_WEAKEN)
  install(CODE "message(FATAL_ERROR \"DPREC_AUDIT_WEAKEN: this build's privacy mechanisms are weakened for a test; it is never installed\")")
endif()
include(CMakePackageConfigHelpers)
set(DPREC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dprec)

install(TARGETS dprec dprec_port_posix EXPORT dprecTargets COMPONENT sdk
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(DPREC_HEADER_EXCLUDES "")
foreach(transport mbedtls curl)
  if(NOT TARGET dprec_transport_${transport})
    list(APPEND DPREC_HEADER_EXCLUDES PATTERN "transport_${transport}.h" EXCLUDE)
  endif()
endforeach()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/dprec DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT sdk
        FILES_MATCHING PATTERN "*.h" ${DPREC_HEADER_EXCLUDES})
install(EXPORT dprecTargets NAMESPACE dprec:: DESTINATION ${DPREC_INSTALL_CMAKEDIR} COMPONENT sdk)
# Each transport in an export set of its own, which the package includes where it was installed.
if(TARGET dprec_transport_mbedtls)
  install(TARGETS dprec_transport_mbedtls EXPORT dprecMbedtlsTargets COMPONENT sdk ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT dprecMbedtlsTargets NAMESPACE dprec:: DESTINATION ${DPREC_INSTALL_CMAKEDIR} COMPONENT sdk)
endif()
if(TARGET dprec_transport_curl)
  set_target_properties(dprec_transport_curl PROPERTIES EXPORT_NAME transport_curl POSITION_INDEPENDENT_CODE ON)
  install(TARGETS dprec_transport_curl EXPORT dprecCurlTargets COMPONENT sdk ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT dprecCurlTargets NAMESPACE dprec:: DESTINATION ${DPREC_INSTALL_CMAKEDIR} COMPONENT sdk)
endif()
# The servers and the tools are not the SDK: installed only when their component is asked for.
foreach(tool dprec-aggregator dprec-relay)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT servers EXCLUDE_FROM_ALL)
  endif()
endforeach()
foreach(tool dprec-device dprec-mkrelease dprec-enroll dprec-fleet)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools EXCLUDE_FROM_ALL)
  endif()
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dprecConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/dprecConfig.cmake
                              INSTALL_DESTINATION ${DPREC_INSTALL_CMAKEDIR})
# While the major version is 0 a minor version may change the ABI (docs/sdk.md, "Compatibility"): an app asking for
# 0.2 gets 0.2.x only. From 1.0 on, the same major version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(DPREC_VERSION_COMPATIBILITY SameMinorVersion)
else()
  set(DPREC_VERSION_COMPATIBILITY SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/dprecConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${DPREC_VERSION_COMPATIBILITY})
install(FILES ${CMAKE_BINARY_DIR}/cmake/dprecConfig.cmake ${CMAKE_BINARY_DIR}/cmake/dprecConfigVersion.cmake
        DESTINATION ${DPREC_INSTALL_CMAKEDIR} COMPONENT sdk)

# pkg-config: prefix relative to the .pc file, so that an installed tree can be moved. The libraries are static, so
# their own dependencies are in Libs (a plain `pkg-config --libs` must link); a transport's .pc requires dprec's.
set(DPREC_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH DPREC_PC_TO_PREFIX /root/${DPREC_PC_DIR} /root)
string(REGEX REPLACE "/$" "" DPREC_PC_TO_PREFIX "${DPREC_PC_TO_PREFIX}")
set(DPREC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(DPREC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "dprec's pkg-config files need CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
set(DPREC_PC_MATH "")
if(MATH_LIBRARY)
  set(DPREC_PC_MATH " -lm")
endif()
set(DPREC_PC_FILES dprec dprec-port-posix)
if(TARGET dprec_transport_mbedtls)
  list(APPEND DPREC_PC_FILES dprec-transport-mbedtls)
endif()
if(TARGET dprec_transport_curl)
  list(APPEND DPREC_PC_FILES dprec-transport-curl)
endif()
foreach(pc ${DPREC_PC_FILES})
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${DPREC_PC_DIR} COMPONENT sdk)
endforeach()
