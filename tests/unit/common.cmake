# common/: wire conversions, the SOCK_SEQPACKET helpers, the typo hints, integer mixing and why_fail.
convd_unit_test(test_wire SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_wire.c LIBS convd_common)
convd_unit_test(test_sock SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sock.c LIBS convd_common)
convd_unit_test(test_suggest SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_suggest.c LIBS convd_common)
convd_unit_test(test_mix SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mix.c LIBS convd_core)
