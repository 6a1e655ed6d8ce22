# Debian packages through CPack, one per install component (cmake/ConvdInstall.cmake):
#   convd               the daemon, convctl, units, sysusers.d, tmpfiles.d, the configuration (a
#                       conffile), man pages, documentation; maintainer scripts in cmake/deb/
#   libconvd-client0    the shared library
#   libconvd-client-dev headers, .so link, static library, convd.pc, the CMake package
# Build them from a tree configured for the prefix /usr, the one the packages install to:
#   cmake -S . -B build-deb -G Ninja -DCMAKE_INSTALL_PREFIX=/usr -DCONVD_BUILD_TESTS=OFF
#   cmake --build build-deb --target package      (or: cd build-deb && cpack -G DEB)
# Dependencies on other packages come from dpkg-shlibdeps (apt-get install dpkg-dev file), plus
# those no binary shows (below).
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "convd")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "convd")
set(CPACK_PACKAGE_CONTACT "convd maintainers <convd@localhost>")
# Each package's description: the first line is its summary, the others the long text.
# Every install() names one of these; anything else would be left out of the packages silently.
set(CPACK_COMPONENTS_ALL daemon lib dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
# The install scripts see the real prefix (/usr) and DESTDIR, as with `DESTDIR=... cmake
# --install`: systemd/ writes the units and the configuration for that prefix.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME "convd")
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION "misc")
# postinst makes the user with systemd-sysusers, or with adduser where that is missing.
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "systemd-sysusers | adduser, procps")
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
    "grouped 2-D convolution daemon for local processes
convd owns one GPU (or serves from its CPU backend) and runs grouped 2-D forward convolutions
(fp32, fp16, bf16; NCHW, NHWC; bias, ReLU) for local processes connected to its Unix socket,
batching compatible requests of all clients. This package holds the daemon, convctl, the
systemd units (convd.socket, convd.service, and convd@.socket, convd@.service for one daemon
per GPU) and the configuration. Installing it enables and starts nothing.")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME "libconvd-client${PROJECT_VERSION_MAJOR}")
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_LIB_DESCRIPTION
    "client library of convd, the grouped-convolution daemon
libconvd-client connects to convd, registers shared or GPU memory and submits grouped 2-D
convolutions, synchronously or through submission and completion rings.")
# shlibs (for the one package with a shared library): packages built against it depend on it at
# this version or later.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libconvd-client-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
# convd.pc requires libprotobuf-c (privately) and convd::client_static links it.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libprotobuf-c-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "client library of convd, the grouped-convolution daemon: development files
Headers, the static library, convd.pc for pkg-config and the CMake package
(find_package(convd): convd::client, convd::client_static), and a minimal example program.")

# Maintainer scripts and conffiles of convd, with the paths of the prefix /usr.
convd_full_dir(convd_deb_sysusersdir "/usr" "${CONVD_SYSUSERSDIR}" OTHER)
convd_full_dir(convd_deb_tmpfilesdir "/usr" "${CONVD_TMPFILESDIR}" OTHER)
convd_full_dir(convd_deb_sysconfdir "/usr" "${CMAKE_INSTALL_SYSCONFDIR}" SYSCONFDIR)
set(CONVD_DEB_SYSUSERS "${convd_deb_sysusersdir}/convd.conf")
set(CONVD_DEB_TMPFILES "${convd_deb_tmpfilesdir}/convd.conf")
set(CONVD_DEB_CONFIG "${convd_deb_sysconfdir}/convd/convd.conf")
foreach(f postinst prerm postrm)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/deb/${f}.in ${PROJECT_BINARY_DIR}/deb/${f} @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                  WORLD_READ WORLD_EXECUTE)
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/deb/conffiles.in ${PROJECT_BINARY_DIR}/deb/conffiles @ONLY)
set(convd_deb_control postinst prerm postrm conffiles)
list(TRANSFORM convd_deb_control PREPEND ${PROJECT_BINARY_DIR}/deb/)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA "${convd_deb_control}")

# A package is only right from a tree configured for /usr: the daemon's built-in configuration
# path and the library directory (lib/<multiarch> on Debian) are fixed at configure time.
set(CPACK_CONVD_CONFIGURED_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/ConvdCPackCheck.cmake)

include(CPack)
cpack_add_component(daemon DISPLAY_NAME "convd")
cpack_add_component(lib DISPLAY_NAME "libconvd-client")
cpack_add_component(dev DISPLAY_NAME "libconvd-client development files" DEPENDS lib)
