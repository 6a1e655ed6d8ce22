# What `cmake --install` puts where, in three components that are also the three Debian packages
# (cmake/ConvdPackage.cmake):
#   daemon  convd, convctl, the systemd units, sysusers.d and tmpfiles.d snippets, the
#           configuration, the man pages and the operations and protocol documents   (convd)
#   lib     libconvd-client.so.0                                                     (libconvd-client0)
#   dev     headers, libconvd-client.so and .a, convd.pc, the CMake package
#           (find_package(convd): convd::client, convd::client_static), the example  (libconvd-client-dev)
# `cmake --install build --component dev` installs one of them. systemd/ and man/ install their
# own files into the daemon component.
include(CMakePackageConfigHelpers)

install(TARGETS convd convctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
if(NOT CONVD_INSTALL_RPATH STREQUAL "")
  set_target_properties(convd convctl PROPERTIES INSTALL_RPATH "${CONVD_INSTALL_RPATH}")
endif()
install(FILES ${PROJECT_SOURCE_DIR}/docs/protocol.md ${PROJECT_SOURCE_DIR}/docs/operations.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)

# The library: the versioned file and its soname link for programs, the plain .so link for the
# linker only with the headers.
set_target_properties(convd-client PROPERTIES EXPORT_NAME client)
set_target_properties(convd-client-static PROPERTIES EXPORT_NAME client_static)
install(TARGETS convd-client EXPORT convdTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev)
install(TARGETS convd-client-static EXPORT convdTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/convd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/client/convd.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/client/examples/minimal.c
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT dev)

# find_package(convd [0.1] [COMPONENTS client static]). The files find their prefix from their own
# place, so that they stay right for `--prefix`, DESTDIR and a moved tree. Versions are compatible
# within a major version, as the library's soname is (libconvd-client.so.0).
set(CONVD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/convd)
install(EXPORT convdTargets NAMESPACE convd:: DESTINATION ${CONVD_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/convdConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/convdConfig.cmake
                              INSTALL_DESTINATION ${CONVD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/convdConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/convdConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/convdConfigVersion.cmake
        DESTINATION ${CONVD_CMAKE_DIR} COMPONENT dev)

# The same names inside this build, for a project that adds convd with add_subdirectory().
add_library(convd::client ALIAS convd-client)
add_library(convd::client_static ALIAS convd-client-static)
