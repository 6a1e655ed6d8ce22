# The daemon's GPU backend (convd_gpu_backend_ops, host code only), part of the convd_gpu library.
# Included at the end of kernels/gpu/CMakeLists.txt, in that directory's scope (source properties
# are per directory); .hip sources are compiled like the kernels: as CUDA by nvcc on NVIDIA, as HIP
# through hipcc (LANGUAGE CXX, -x hip from the target) on AMD.
set(CONVD_GPU_BACKEND_SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu.hip)
target_sources(convd_gpu PRIVATE ${CONVD_GPU_BACKEND_SOURCES})
if(CONVD_GPU_KIND STREQUAL "nvidia")
  set_source_files_properties(${CONVD_GPU_BACKEND_SOURCES} PROPERTIES LANGUAGE CUDA)
else()
  set_source_files_properties(${CONVD_GPU_BACKEND_SOURCES} PROPERTIES LANGUAGE CXX)
endif()
# The backend's locks. No libcuda: cuMemGetAddressRange comes through the runtime's
# cudaGetDriverEntryPointByVersion, so a GPU build still starts (on the CPU backend) where no
# driver is installed.
target_link_libraries(convd_gpu PRIVATE Threads::Threads)
