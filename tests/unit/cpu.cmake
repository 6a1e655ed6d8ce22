# Unit tests of the kernel library's CPU side: problem checks and shape math, fp16/bf16
# conversion, the CPU convolution against the reference, and the CPU backend.
convd_unit_test(test_problem SOURCES test_problem.c LIBS convd_core)
convd_unit_test(test_half SOURCES test_half.c LIBS convd_core m)
convd_unit_test(test_cpu_conv SOURCES test_cpu_conv.c LIBS convd_cpu convd_testutil)
convd_unit_test(test_cpu_backend SOURCES test_cpu_backend.c LIBS convd_cpu convd_testutil)
# test_half checks the CPU kernels' inline conversions against half.c; the conv and backend tests
# reach the pool and the per-ISA variants through the CPU internals.
foreach(t test_half test_cpu_conv test_cpu_backend)
  target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/kernels/cpu)
endforeach()
