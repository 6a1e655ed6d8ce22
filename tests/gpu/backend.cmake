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

# The whole serving path on the GPU: test_gpu_daemon starts a real convd --backend gpu and drives
# it through the client library with host regions and with device memory of its own (IPC
# handles), several client processes for batching. ctest label "gpu"; exits 77, counted as
# skipped, where no GPU answers. It reuses the integration harness's helpers (cases, metrics,
# stopping the daemon) but starts the daemon itself.
if(TARGET convd AND TARGET convd-client-static AND TARGET convd_it_harness)
  add_executable(test_gpu_daemon ${CMAKE_CURRENT_LIST_DIR}/test_gpu_daemon.c)
  target_link_libraries(test_gpu_daemon PRIVATE convd_it_harness convd-client-static convd_testutil
                                                PkgConfig::CMOCKA Threads::Threads)
  target_compile_definitions(test_gpu_daemon PRIVATE CONVD_DAEMON_PATH="$<TARGET_FILE:convd>")
  # The test runs the daemon binary, so building the test builds it first.
  add_dependencies(test_gpu_daemon convd)
  # The test's own runtime calls (the probe, its device allocation and IPC handle), in C.
  if(CONVD_GPU_KIND STREQUAL "nvidia")
    target_link_libraries(test_gpu_daemon PRIVATE CUDA::cudart_static)
  else()
    target_compile_definitions(test_gpu_daemon PRIVATE CONVD_TEST_AMD=1 __HIP_PLATFORM_AMD__=1)
    target_link_libraries(test_gpu_daemon PRIVATE ${CONVD_AMDHIP64})
  endif()
  add_test(NAME test_gpu_daemon COMMAND test_gpu_daemon)
  set_tests_properties(test_gpu_daemon PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900)
  if(CONVD_SANITIZE)
    # The daemon inherits this too: the CUDA driver's allocations fail under ASan's shadow-gap
    # protection, and the driver's own allocations at exit are not ours to report.
    set_tests_properties(test_gpu_daemon PROPERTIES
                         ENVIRONMENT "ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0")
  endif()
endif()

# Fault injection on the GPU backend (issue 17): tests/fault/fault_daemon.c built with FAULT_GPU,
# the daemon in process on the GPU backend, with the CUDA runtime calls of fault_cuda.c failed in
# turn and a lost context simulated. NVIDIA only (the wrappers use the CUDA runtime's names).
# ctest label "gpu"; exits 77, counted as skipped, where no GPU answers.
if(CONVD_GPU_KIND STREQUAL "nvidia" AND TARGET convd_fault)
  set(CONVD_FAULT_CUDA_WRAPPED cudaMalloc cudaMemcpyAsync cudaMemsetAsync cudaHostRegister
      cudaStreamCreateWithFlags cudaEventCreateWithFlags cudaEventRecord cudaEventQuery
      cudaStreamSynchronize cudaLaunchHostFunc cudaGetLastError cudaStreamQuery
      cudaGetDriverEntryPointByVersion)
  add_executable(fault_gpu ${PROJECT_SOURCE_DIR}/tests/fault/fault_daemon.c
                           ${CMAKE_CURRENT_LIST_DIR}/fault_cuda.c)
  target_compile_definitions(fault_gpu PRIVATE FAULT_GPU=1)
  target_include_directories(fault_gpu PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(fault_gpu PRIVATE convd_fault convd_testsrv convd-client CUDA::cudart_static)
  target_link_options(fault_gpu PRIVATE ${CONVD_FAULT_WRAP_OPTIONS})
  foreach(fn ${CONVD_FAULT_CUDA_WRAPPED})
    target_link_options(fault_gpu PRIVATE -Wl,--wrap=${fn})
  endforeach()
  add_test(NAME fault_gpu COMMAND fault_gpu)
  # Each run opens a GPU backend (a context, streams, the warm-up): at most 24 runs per call.
  set(fault_gpu_env "CONVD_FAULT_MAX=24")
  if(CONVD_SANITIZE)
    list(APPEND fault_gpu_env "ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0")
  endif()
  set_tests_properties(fault_gpu PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900
                                            ENVIRONMENT "${fault_gpu_env}")
endif()
