# Daemon unit tests: config parsing, regions on real memfds (mmap failures injected with
# -Wl,--wrap), request validation, the scheduler, and an in-process daemon driven over its socket.
if(NOT TARGET convd_daemon OR NOT TARGET convd_cpu)
  message(STATUS "daemon unit tests skipped: convd_daemon or convd_cpu not defined")
  return()
endif()

convd_unit_test(test_daemon_config SOURCES test_daemon_config.c LIBS convd_daemon)
# It reads what convd.conf(5) and docs/operations.md say SIGHUP applies.
target_compile_definitions(test_daemon_config PRIVATE CONVD_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
convd_unit_test(test_daemon_scheduler SOURCES test_daemon_scheduler.c
                LIBS convd_daemon convd_testutil)
convd_unit_test(test_daemon_regions SOURCES test_daemon_regions.c LIBS convd_daemon convd_testutil)
target_link_options(test_daemon_regions PRIVATE -Wl,--wrap=mmap)
convd_unit_test(test_daemon_request SOURCES test_daemon_request.c LIBS convd_daemon convd_testutil)
convd_unit_test(test_daemon_server SOURCES test_daemon_server.c
                LIBS convd_daemon convd_testsrv convd_testraw convd_testutil)
convd_unit_test(test_daemon_pbscan SOURCES test_daemon_pbscan.c LIBS convd_daemon convd_testutil)
convd_unit_test(test_daemon_ring SOURCES test_daemon_ring.c LIBS convd_daemon convd_testutil)
convd_unit_test(test_daemon_doorbell SOURCES test_daemon_doorbell.c LIBS convd_daemon)
