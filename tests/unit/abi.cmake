# The client library's ABI: the public headers from C++ (g++ with -Wall -Wextra -Werror: the
# *_INIT macros must compile without warnings) and from strict C99, and the symbols and versions
# the shared library exports (check_abi.sh against abi-symbols.txt).
if(NOT TARGET convd-client)
  return()
endif()

add_executable(test_c_header ${CMAKE_CURRENT_LIST_DIR}/test_c_header.c)
target_link_libraries(test_c_header PRIVATE convd-client)
set_target_properties(test_c_header PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
target_compile_options(test_c_header PRIVATE -Wall -Wextra -Werror -pedantic
                                             -Wmissing-field-initializers)
add_test(NAME test_c_header COMMAND test_c_header)
set_tests_properties(test_c_header PROPERTIES LABELS unit)

# C++ only for this test: a build without a GPU has no other C++ code.
include(CheckLanguage)
check_language(CXX)
if(CMAKE_CXX_COMPILER)
  enable_language(CXX)
  add_executable(test_cxx_header ${CMAKE_CURRENT_LIST_DIR}/test_cxx_header.cpp)
  target_link_libraries(test_cxx_header PRIVATE convd-client)
  set_target_properties(test_cxx_header PROPERTIES CXX_STANDARD 11 CXX_STANDARD_REQUIRED ON
                                                   CXX_EXTENSIONS OFF)
  target_compile_options(test_cxx_header PRIVATE -Wall -Wextra -Werror -pedantic)
  add_test(NAME test_cxx_header COMMAND test_cxx_header)
  set_tests_properties(test_cxx_header PROPERTIES LABELS unit)
else()
  message(WARNING "no C++ compiler: test_cxx_header (convd.h from C++) is not built")
endif()

# A program of convd 0.1's ABI: the old struct convd_problem, bound to the CONVD_0 symbols that
# client/compat.c keeps, against a daemon it starts.
if(TARGET convd)
  add_executable(test_abi_v0 ${CMAKE_CURRENT_LIST_DIR}/test_abi_v0.c)
  target_link_libraries(test_abi_v0 PRIVATE convd-client PkgConfig::CMOCKA)
  target_compile_definitions(test_abi_v0 PRIVATE CONVD_DAEMON_PATH="$<TARGET_FILE:convd>")
  add_test(NAME test_abi_v0 COMMAND test_abi_v0)
  set_tests_properties(test_abi_v0 PROPERTIES LABELS unit)
endif()

find_program(CONVD_READELF readelf)
if(CONVD_READELF)
  add_test(NAME check_abi
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_abi.sh $<TARGET_FILE:convd-client>
                   ${CMAKE_CURRENT_LIST_DIR}/abi-symbols.txt)
  set_tests_properties(check_abi PROPERTIES LABELS unit)
else()
  message(WARNING "no readelf: check_abi (the library's exported symbols) is not run")
endif()
