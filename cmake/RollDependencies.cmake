# Finds every third-party dependency. Debian packages by default; a different
# LibTorch (for example a CUDA build) is picked up through Torch_DIR.
find_package(Threads REQUIRED)
# Protobuf before LibTorch: a wheel's Caffe2Config otherwise defines
# protobuf::libprotobuf for its own bundled copy (3.13) before
# FindProtobuf runs, and gRPC's generated code would see those headers.
find_package(Protobuf REQUIRED)

# LibTorch. scripts/setup installs PyPI's torch wheel, which carries LibTorch
# (headers, libtorch_cpu, libc10, libtorch_cuda, share/cmake/Torch), into the
# project's .venv and passes its Torch_DIR; any other LibTorch or PyTorch
# install is used with -DTorch_DIR=<prefix>/share/cmake/Torch (for PyTorch:
# python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' + /Torch).
if(NOT Torch_DIR AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  execute_process(
    COMMAND "${PROJECT_SOURCE_DIR}/.venv/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _roll_torch_cmake OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _roll_rc)
  if(_roll_rc EQUAL 0 AND EXISTS "${_roll_torch_cmake}/Torch/TorchConfig.cmake")
    set(Torch_DIR "${_roll_torch_cmake}/Torch" CACHE PATH "LibTorch's CMake package (share/cmake/Torch)")
  endif()
endif()
add_library(roll_torch INTERFACE)
if(Torch_DIR)
  get_filename_component(_roll_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
endif()
# The CPU configuration links libtorch_cpu and libc10 alone, straight from
# the install: a CUDA build's TorchConfig insists on a CUDA toolkit and puts
# libtorch_cuda (and with it cuDNN, cuBLAS, NCCL) into every binary. The CUDA
# configuration (ROLL_WITH_CUDA) takes TorchConfig's full set of libraries.
if(NOT ROLL_WITH_CUDA AND _roll_torch_prefix AND EXISTS "${_roll_torch_prefix}/lib/libtorch_cpu.so"
   AND EXISTS "${_roll_torch_prefix}/include/torch/csrc/api/include/torch/torch.h")
  set(TORCH_INSTALL_PREFIX "${_roll_torch_prefix}")
  find_library(ROLL_TORCH_CPU_LIBRARY torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
  find_library(ROLL_C10_LIBRARY c10 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
  set(TORCH_LIBRARIES ${ROLL_TORCH_CPU_LIBRARY} ${ROLL_C10_LIBRARY})
  set(TORCH_INCLUDE_DIRS "${TORCH_INSTALL_PREFIX}/include" "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
  # libtorch_cpu finds its own dependencies (libgomp, and in a CUDA wheel the
  # CUDA runtime) by its RPATH; the binaries find it by theirs.
  list(APPEND CMAKE_BUILD_RPATH "${TORCH_INSTALL_PREFIX}/lib")
  list(APPEND CMAKE_INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")
else()
  # TorchConfig looks for its libraries and its Caffe2 package on the system
  # paths before its own, so a system LibTorch (Debian's libtorch-dev) would
  # win: the chosen install's prefix is searched first.
  if(_roll_torch_prefix)
    list(PREPEND CMAKE_PREFIX_PATH "${_roll_torch_prefix}")
    set(Caffe2_DIR "${_roll_torch_prefix}/share/cmake/Caffe2" CACHE PATH "LibTorch's Caffe2 package")
  endif()
  find_package(Torch REQUIRED)
  if(NOT TORCH_INSTALL_PREFIX)
    set(TORCH_INSTALL_PREFIX "${_roll_torch_prefix}")
  endif()
  if(TORCH_CXX_FLAGS)
    separate_arguments(_roll_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
    target_compile_options(roll_torch INTERFACE ${_roll_torch_flags})
  endif()
endif()
set(ROLL_TORCH_VERSION "")
foreach(_h torch/headeronly/version.h torch/csrc/api/include/torch/version.h)
  if(NOT ROLL_TORCH_VERSION AND EXISTS "${TORCH_INSTALL_PREFIX}/include/${_h}")
    file(STRINGS "${TORCH_INSTALL_PREFIX}/include/${_h}" _roll_tv REGEX "define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" ROLL_TORCH_VERSION "${_roll_tv}")
  endif()
endforeach()
message(STATUS "roll: LibTorch ${ROLL_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX} (${TORCH_LIBRARIES})")
# The shared libraries libtorch_cpu loads (readelf), which tell how it was
# built: with the system's libblas (RollBlas.cmake) and libgloo, or with
# both inside (PyPI's wheel: MKL, and gloo's symbols exported from it).
set(ROLL_TORCH_NEEDED "")
find_program(ROLL_READELF readelf)
file(GLOB _roll_torch_cpu "${TORCH_INSTALL_PREFIX}/lib/libtorch_cpu.so" "${TORCH_INSTALL_PREFIX}/lib/*/libtorch_cpu.so")
if(ROLL_READELF AND _roll_torch_cpu)
  list(GET _roll_torch_cpu 0 _roll_torch_cpu)
  execute_process(COMMAND ${ROLL_READELF} -d "${_roll_torch_cpu}" OUTPUT_VARIABLE ROLL_TORCH_NEEDED ERROR_QUIET)
endif()
# A wheel ships copies of some third-party headers (Protobuf 3.13, fmt 12)
# that differ from the system's, which gRPC and spdlog are built against.
# Links to the system's copies are searched before LibTorch's include root.
set(_roll_shadow "${CMAKE_BINARY_DIR}/roll-torch-shadow")
file(REMOVE_RECURSE "${_roll_shadow}")
file(MAKE_DIRECTORY "${_roll_shadow}")
foreach(_n google fmt)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/include/${_n}" AND EXISTS "/usr/include/${_n}")
    file(CREATE_LINK "/usr/include/${_n}" "${_roll_shadow}/${_n}" SYMBOLIC)
  endif()
endforeach()
target_link_libraries(roll_torch INTERFACE ${TORCH_LIBRARIES})
if(ROLL_WITH_CUDA)
  target_compile_definitions(roll_torch INTERFACE ROLL_WITH_CUDA=1)
endif()
target_include_directories(roll_torch SYSTEM INTERFACE "${_roll_shadow}" ${TORCH_INCLUDE_DIRS})

find_package(gRPC CONFIG REQUIRED)
find_program(ROLL_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
# The PNG of `roll eval --plot` (zlib comes with gRPC and Protobuf).
find_package(ZLIB REQUIRED)
# Gloo: c10d's headers include gloo's. A LibTorch that loads the system's
# libgloo (Debian's) needs it linked; one that carries gloo (PyPI's) must
# not have a second copy in the process, so only the headers are used.
if(ROLL_TORCH_NEEDED MATCHES "libgloo\\.so")
  find_package(Gloo REQUIRED)
  set(ROLL_GLOO_LINK gloo)
else()
  find_path(ROLL_GLOO_INCLUDE_DIR gloo/config.h REQUIRED)
  set(ROLL_GLOO_LINK "")
endif()

# The NCCL communicator is written against NCCL's and CUDA's C APIs, so it
# compiles and links without a GPU (its tests skip without a device). AUTO
# builds it in the CUDA configuration wherever the headers and libraries are.
if(ROLL_WITH_NCCL STREQUAL "AUTO" AND NOT ROLL_WITH_CUDA)
  set(ROLL_WITH_NCCL OFF)
elseif(ROLL_WITH_NCCL STREQUAL "AUTO")
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
  # The NCCL that PyPI's libtorch_cuda loads (the nvidia-nccl wheel beside
  # torch) comes first, so the process holds one NCCL.
  set(_roll_wheel_nccl "${TORCH_INSTALL_PREFIX}/../nvidia/nccl")
  if(ROLL_WITH_CUDA AND EXISTS "${_roll_wheel_nccl}/include/nccl.h")
    find_path(ROLL_NCCL_INCLUDE_DIR nccl.h PATHS "${_roll_wheel_nccl}/include" NO_DEFAULT_PATH)
    find_library(ROLL_NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${_roll_wheel_nccl}/lib" NO_DEFAULT_PATH)
  endif()
  find_path(ROLL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include REQUIRED)
  find_library(ROLL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES lib lib64 REQUIRED)
  message(STATUS "roll: NCCL at ${ROLL_NCCL_LIBRARY}")
endif()

if(ROLL_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
