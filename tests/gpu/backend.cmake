# The GPU backend's test: test_gpu_backend (ctest label "gpu"). Exits 77, counted as skipped,
# where no GPU answers.
add_executable(test_gpu_backend ${CMAKE_CURRENT_LIST_DIR}/test_gpu_backend.c)
target_link_libraries(test_gpu_backend PRIVATE convd_gpu convd_testutil PkgConfig::CMOCKA
                                               Threads::Threads)
# The test calls a few runtime functions itself (device count; the IPC peer's allocation and
# handle) in C: the CUDA runtime's C header, or HIP's with CONVD_TEST_AMD. convd_gpu brings the
# runtime library and, on AMD, __HIP_PLATFORM_AMD__.
if(CONVD_GPU_KIND STREQUAL "nvidia")
  target_link_libraries(test_gpu_backend PRIVATE CUDA::cudart_static)
else()
  target_compile_definitions(test_gpu_backend PRIVATE CONVD_TEST_AMD=1)
endif()
add_test(NAME test_gpu_backend COMMAND test_gpu_backend)
set_tests_properties(test_gpu_backend PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
if(CONVD_SANITIZE)
  # ASan's shadow-gap protection makes the CUDA driver's allocations fail, and the driver's own
  # allocations at exit are not ours to report.
  set_tests_properties(test_gpu_backend PROPERTIES
                       ENVIRONMENT "ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0")
endif()
