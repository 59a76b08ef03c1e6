# roll_library(NAME name SOURCES ... DEPS ... [TORCH]) declares one module
# library roll_<name> with alias roll::<name>. TORCH marks libraries whose
# translation units use the full LibTorch API: they get a precompiled header.
function(roll_library)
  cmake_parse_arguments(ARG "TORCH" "NAME" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(roll_${ARG_NAME} STATIC ${ARG_SOURCES})
  add_library(roll::${ARG_NAME} ALIAS roll_${ARG_NAME})
  target_include_directories(roll_${ARG_NAME}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(roll_${ARG_NAME} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(roll_${ARG_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(ARG_TORCH AND ROLL_USE_PCH)
    roll_torch_pch(roll_${ARG_NAME})
  endif()
  # A source that registers itself (ROLL_REGISTER_PIPELINE) stays its own
  # object file: in a unity batch it would be linked whenever anything else
  # of the batch is, and a binary would get registrations it did not ask for.
  foreach(_src IN LISTS ARG_SOURCES)
    file(STRINGS ${_src} _registers REGEX "^ROLL_REGISTER_" LIMIT_COUNT 1)
    if(_registers)
      set_property(SOURCE ${_src} PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endforeach()
endfunction()

# One shared precompiled header for the LibTorch TUs; targets reuse it. Only
# the sources that include <torch/torch.h> themselves get it: loading the
# precompiled header costs a TU that does not need LibTorch more than the TU
# itself (13 s against 5 s for src/common/logging.cc, measured with -g).
function(roll_torch_pch target)
  get_target_property(_srcs ${target} SOURCES)
  get_target_property(_dir ${target} SOURCE_DIR)
  foreach(_src IN LISTS _srcs)
    get_filename_component(_abs ${_src} ABSOLUTE BASE_DIR ${_dir})
    if(NOT _abs MATCHES "\\.(cc|cpp)$")
      continue()
    endif()
    file(STRINGS ${_abs} _uses_torch REGEX "^#include <torch/torch.h>" LIMIT_COUNT 1)
    if(NOT _uses_torch)
      set_property(SOURCE ${_abs} TARGET_DIRECTORY ${target} PROPERTY SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  get_property(_owner GLOBAL PROPERTY ROLL_TORCH_PCH_OWNER)
  if(NOT _owner)
    set_property(GLOBAL PROPERTY ROLL_TORCH_PCH_OWNER ${target})
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM ${_owner})
  endif()
endfunction()
