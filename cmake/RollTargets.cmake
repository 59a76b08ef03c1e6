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
endfunction()

# One shared precompiled header for every LibTorch TU; targets reuse it.
function(roll_torch_pch target)
  get_property(_owner GLOBAL PROPERTY ROLL_TORCH_PCH_OWNER)
  if(NOT _owner)
    set_property(GLOBAL PROPERTY ROLL_TORCH_PCH_OWNER ${target})
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM ${_owner})
  endif()
endfunction()
