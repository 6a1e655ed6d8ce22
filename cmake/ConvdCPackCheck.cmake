# CPACK_PROJECT_CONFIG_FILE of convd: cpack reads it before it packs. The packages install to
# /usr; a tree configured for another prefix would put a wrong configuration path into convd and
# the library into lib/ instead of lib/<multiarch>, so it is refused with the command that works.
if(NOT CPACK_CONVD_CONFIGURED_PREFIX STREQUAL "/usr")
  message(FATAL_ERROR
    "The Debian packages install to /usr, but this build is configured for "
    "${CPACK_CONVD_CONFIGURED_PREFIX}. Configure a build for them with "
    "-DCMAKE_INSTALL_PREFIX=/usr (cmake/ConvdPackage.cmake).")
endif()
