# Install-time part of systemd/: writes the units and the configuration for the prefix the install
# actually uses, which `cmake --install build --prefix P` (and CPack) may set to another one than
# the build was configured with. Run from install(CODE) in systemd/CMakeLists.txt, which sets:
#   CONVD_UNITS_SRC      systemd/ in the source tree
#   CONVD_UNITS_OUT      where the rendered units go before they are installed (build tree)
#   CONVD_REL_BINDIR, CONVD_REL_SYSCONFDIR, CONVD_REL_DOCDIR, CONVD_REL_UNITDIR
#                        the install directories as configured (relative to the prefix, or not)
#   CONVD_BUILT_CONFIG   the configuration path compiled into convd
include("${CMAKE_CURRENT_LIST_DIR}/ConvdInstallDirs.cmake")

convd_full_dir(convd_bindir "${CMAKE_INSTALL_PREFIX}" "${CONVD_REL_BINDIR}" BINDIR)
convd_full_dir(convd_sysconfdir "${CMAKE_INSTALL_PREFIX}" "${CONVD_REL_SYSCONFDIR}" SYSCONFDIR)
convd_full_dir(convd_docdir "${CMAKE_INSTALL_PREFIX}" "${CONVD_REL_DOCDIR}" DOCDIR)
convd_full_dir(convd_unitdir "${CMAKE_INSTALL_PREFIX}" "${CONVD_REL_UNITDIR}" UNITDIR)

# Variables of convd.service.in and convd.socket.in.
set(CONVD_BINDIR "${convd_bindir}")
set(CONVD_DOCDIR "${convd_docdir}")
set(CONVD_CONFIG "${convd_sysconfdir}/convd/convd.conf")

# The daemon of the machine: the configured backend and device, /run/convd/convd.sock.
set(CONVD_UNIT_DESCRIPTION "convd convolution daemon")
set(CONVD_SOCKET_DESCRIPTION "convd convolution daemon socket")
set(CONVD_UNIT_SERVICE "convd.service")
set(CONVD_UNIT_SOCKET "convd.socket")
set(CONVD_UNIT_SOCKET_PATH "/run/convd/convd.sock")
set(CONVD_UNIT_ARGS "")
configure_file("${CONVD_UNITS_SRC}/convd.service.in" "${CONVD_UNITS_OUT}/convd.service" @ONLY)
configure_file("${CONVD_UNITS_SRC}/convd.socket.in" "${CONVD_UNITS_OUT}/convd.socket" @ONLY)

# One daemon per GPU: the instance is the GPU ordinal. The GPU backend only (no silent fall-back
# to the CPU behind a socket named for a GPU), and the socket of that GPU also when the service is
# started without its socket unit (socket activation overrides --socket).
set(CONVD_UNIT_DESCRIPTION "convd convolution daemon for GPU %i")
set(CONVD_SOCKET_DESCRIPTION "convd convolution daemon socket for GPU %i")
set(CONVD_UNIT_SERVICE "convd@%i.service")
set(CONVD_UNIT_SOCKET "convd@%i.socket")
set(CONVD_UNIT_SOCKET_PATH "/run/convd/gpu%i.sock")
set(CONVD_UNIT_ARGS " --backend gpu --device %i --socket /run/convd/gpu%i.sock")
configure_file("${CONVD_UNITS_SRC}/convd.service.in" "${CONVD_UNITS_OUT}/convd@.service" @ONLY)
configure_file("${CONVD_UNITS_SRC}/convd.socket.in" "${CONVD_UNITS_OUT}/convd@.socket" @ONLY)

# file(INSTALL) puts $DESTDIR in front itself and records the files in install_manifest.txt.
file(INSTALL DESTINATION "${convd_unitdir}" TYPE FILE FILES
     "${CONVD_UNITS_OUT}/convd.service" "${CONVD_UNITS_OUT}/convd.socket"
     "${CONVD_UNITS_OUT}/convd@.service" "${CONVD_UNITS_OUT}/convd@.socket")

# The configuration goes to <sysconfdir>/convd only when none is there yet: an upgrade must not
# overwrite the administrator's (the Debian package marks it a conffile as well).
if(EXISTS "$ENV{DESTDIR}${CONVD_CONFIG}")
  message(STATUS "Keeping existing $ENV{DESTDIR}${CONVD_CONFIG}")
else()
  file(INSTALL DESTINATION "${convd_sysconfdir}/convd" TYPE FILE FILES
       "${CONVD_UNITS_SRC}/convd.conf")
endif()

if(NOT CONVD_CONFIG STREQUAL CONVD_BUILT_CONFIG)
  message(WARNING
    "convd was configured for another prefix: without --config it reads ${CONVD_BUILT_CONFIG}, "
    "not ${CONVD_CONFIG}. The installed units pass --config ${CONVD_CONFIG}; to change the "
    "built-in path as well, configure with -DCMAKE_INSTALL_PREFIX=${CMAKE_INSTALL_PREFIX}.")
endif()
