# client/: the .npy parser, convctl's argument helpers, and libconvd-client against a scripted
# fake daemon over a socketpair.
convd_unit_test(test_npy SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_npy.c LIBS convd_clitools)
convd_unit_test(test_client_args SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_client_args.c
                LIBS convd_clitools)
target_compile_definitions(test_client_args PRIVATE CONVD_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# The static library carries the internals the fake peer needs (cl_connect_fd, the socket and
# wire helpers); convd_common only adds its include directories.
convd_unit_test(test_client_lib SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_client_lib.c
                LIBS convd-client-static convd_common convd_testutil Threads::Threads)
target_include_directories(test_client_lib PRIVATE ${CMAKE_SOURCE_DIR}/client)
