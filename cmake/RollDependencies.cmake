# Finds every third-party dependency. Debian packages by default; a different
# LibTorch (for example a CUDA build) is picked up through Torch_DIR.
find_package(Threads REQUIRED)

# LibTorch: Debian's libtorch-dev installs TorchConfig.cmake under the
# multiarch cmake dir; any other LibTorch is found with -DTorch_DIR=...
find_package(Torch REQUIRED)
if(TORCH_CXX_FLAGS)
  separate_arguments(_roll_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
endif()
add_library(roll_torch INTERFACE)
target_link_libraries(roll_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(roll_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
if(_roll_torch_flags)
  target_compile_options(roll_torch INTERFACE ${_roll_torch_flags})
endif()

find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_program(ROLL_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
# The PNG of `roll eval --plot` (zlib comes with gRPC and Protobuf).
find_package(ZLIB REQUIRED)
find_package(Gloo QUIET)

# The NCCL communicator is written against NCCL's and CUDA's C APIs, so it
# compiles and links without a GPU or a CUDA LibTorch (its tests skip
# without a device). AUTO builds it wherever the headers and libraries are.
if(ROLL_WITH_NCCL STREQUAL "AUTO")
  find_path(ROLL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include)
  find_library(ROLL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES lib lib64)
  find_path(ROLL_CUDART_INCLUDE_DIR cuda_runtime.h HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include)
  find_library(ROLL_CUDART_LIBRARY cudart HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES lib64 lib)
  if(ROLL_NCCL_INCLUDE_DIR AND ROLL_NCCL_LIBRARY AND ROLL_CUDART_INCLUDE_DIR AND ROLL_CUDART_LIBRARY)
    set(ROLL_WITH_NCCL ON)
  else()
    set(ROLL_WITH_NCCL OFF)
    message(STATUS "roll: NCCL or the CUDA runtime not found (set CUDAToolkit_ROOT): building without the NCCL communicator")
  endif()
endif()
if(ROLL_WITH_NCCL)
  find_path(ROLL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include REQUIRED)
  find_library(ROLL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES lib lib64 REQUIRED)
  message(STATUS "roll: NCCL at ${ROLL_NCCL_LIBRARY}")
endif()

if(ROLL_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
