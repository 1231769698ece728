# Install rules: `cmake --install build --prefix DIR` puts the SDK where an app's build finds it (docs/sdk.md,
# "Using the SDK"):
#   include/dprec/*.h                      the public headers
#   lib/libdprec.a, lib/libdprec_port_posix.a (and lib/libdprec_transport_curl.a where libcurl was found)
#   lib/cmake/dprec/                       find_package(dprec CONFIG): dprec::dprec, dprec::port_posix
#                                          (and dprec::transport_curl)
#   lib/pkgconfig/dprec.pc, dprec-port-posix.pc
#   bin/                                   dprec-aggregator, dprec-device, dprec-mkrelease, dprec-fleet, if built
# tests/consumer/ is a project of its own that CI builds against such a tree, both ways (tests/consumer.cmake).
# A weakened test build (DPREC_AUDIT_WEAKEN, CMakeLists.txt) is never installed: its first install rule stops the step.
if(DPREC_AUDIT_WEAKEN)
  install(CODE "message(FATAL_ERROR \"DPREC_AUDIT_WEAKEN: this build's privacy mechanisms are weakened for a test; it is never installed\")")
endif()
include(CMakePackageConfigHelpers)
set(DPREC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/dprec)

install(TARGETS dprec dprec_port_posix EXPORT dprecTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/dprec DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT dprecTargets NAMESPACE dprec:: DESTINATION ${DPREC_INSTALL_CMAKEDIR})
if(TARGET dprec_transport_curl)
  set_target_properties(dprec_transport_curl PROPERTIES EXPORT_NAME transport_curl POSITION_INDEPENDENT_CODE ON)
  install(TARGETS dprec_transport_curl EXPORT dprecCurlTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT dprecCurlTargets NAMESPACE dprec:: DESTINATION ${DPREC_INSTALL_CMAKEDIR})
endif()
foreach(tool dprec-aggregator dprec-device dprec-mkrelease dprec-fleet)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
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
        DESTINATION ${DPREC_INSTALL_CMAKEDIR})

# pkg-config: prefix relative to the .pc file, so that an installed tree can be moved. The library is static, so
# its own dependencies are in Libs (a plain `pkg-config --libs` must link).
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
configure_file(${CMAKE_CURRENT_LIST_DIR}/dprec.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/dprec.pc @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/dprec-port-posix.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/dprec-port-posix.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/dprec.pc ${CMAKE_BINARY_DIR}/pkgconfig/dprec-port-posix.pc
        DESTINATION ${DPREC_PC_DIR})
