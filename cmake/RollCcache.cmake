# Use ccache for every compile when it is installed.
find_program(ROLL_CCACHE ccache)
if(ROLL_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${ROLL_CCACHE})
  message(STATUS "roll: compiling through ccache (${ROLL_CCACHE})")
endif()
