# Where an installed convd finds its parts. Included twice: by CMakeLists.txt at configure time
# (after GNUInstallDirs, before the targets), and by the install scripts of systemd/ at install
# time, where the prefix may be another one (`cmake --install build --prefix P`). Only the
# function is meant for install time; the rest needs a configured project.

# convd_full_dir(<out> <prefix> <dir> <kind>): the absolute directory for the GNUInstallDirs
# directory <dir> (relative to <prefix>, or absolute) under <prefix>, by the rules
# GNUInstallDirs_get_absolute_install_dir follows, so that configure time and install time agree:
# SYSCONFDIR (and LOCALSTATEDIR, RUNSTATEDIR) is /etc for the prefixes / and /usr and
# /etc/opt/<...> for a prefix /opt/<...>; everything else moves under /usr for the prefix /.
function(convd_full_dir out prefix dir kind)
  string(REGEX REPLACE "(.)/+$" "\\1" prefix "${prefix}")
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(kind MATCHES "^(SYSCONFDIR|LOCALSTATEDIR|RUNSTATEDIR)$")
    if(prefix STREQUAL "/" OR prefix STREQUAL "/usr")
      set(full "/${dir}")
    elseif(prefix MATCHES "^/opt/" AND NOT prefix MATCHES "^/opt/homebrew/")
      set(full "/${dir}${prefix}")
    else()
      set(full "${prefix}/${dir}")
    endif()
  elseif(prefix STREQUAL "/")
    if(dir MATCHES "^usr/")
      set(full "/${dir}")
    else()
      set(full "/usr/${dir}")
    endif()
  else()
    set(full "${prefix}/${dir}")
  endif()
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED PROJECT_NAME)
  return()
endif()

# The configuration file convd reads without --config, compiled into the daemon and shown by
# `convd --help`. It follows the prefix given at configure time; an install to another prefix
# says so (systemd/ConvdInstallUnits.cmake), and the units always pass --config.
set(CONVD_DEFAULT_CONFIG "${CMAKE_INSTALL_FULL_SYSCONFDIR}/convd/convd.conf")

# Installed programs find the installed libconvd-client without ldconfig and without
# LD_LIBRARY_PATH: a run path relative to the program ($ORIGIN/../lib, or
# $ORIGIN/../lib/x86_64-linux-gnu), which stays right for `--prefix` and DESTDIR too.
# cmake/ConvdInstall.cmake gives it to the installed programs. Not for a library directory the
# linker searches anyway (the prefix /usr, as the Debian packages use): Debian forbids a run path
# there, and it would change nothing.
set(CONVD_INSTALL_RPATH "")
if(NOT IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}" AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  list(FIND CMAKE_C_IMPLICIT_LINK_DIRECTORIES "${CMAKE_INSTALL_FULL_LIBDIR}" convd_libdir_implicit)
  if(convd_libdir_implicit EQUAL -1)
    file(RELATIVE_PATH convd_bin_to_lib "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
    set(CONVD_INSTALL_RPATH "$ORIGIN/${convd_bin_to_lib}")
  endif()
endif()
