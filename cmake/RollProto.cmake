# roll_proto_library(NAME name PROTOS a.proto ...) generates C++ message and
# gRPC service code at build time and wraps it in a static library.
function(roll_proto_library)
  cmake_parse_arguments(ARG "" "NAME" "PROTOS" ${ARGN})
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${_out}/roll/rpc)
  set(_srcs)
  foreach(_proto IN LISTS ARG_PROTOS)
    get_filename_component(_abs ${_proto} ABSOLUTE)
    get_filename_component(_dir ${_abs} DIRECTORY)
    get_filename_component(_we ${_proto} NAME_WE)
    set(_gen ${_out}/roll/rpc/${_we}.pb.cc ${_out}/roll/rpc/${_we}.pb.h
             ${_out}/roll/rpc/${_we}.grpc.pb.cc ${_out}/roll/rpc/${_we}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${_gen}
      COMMAND protobuf::protoc
        --proto_path=${_dir}
        --cpp_out=${_out}/roll/rpc
        --grpc_out=${_out}/roll/rpc
        --plugin=protoc-gen-grpc=${ROLL_GRPC_CPP_PLUGIN}
        ${_abs}
      DEPENDS ${_abs}
      COMMENT "protoc ${_proto}")
    list(APPEND _srcs ${_gen})
  endforeach()
  add_library(${ARG_NAME} STATIC ${_srcs})
  target_include_directories(${ARG_NAME} PUBLIC ${_out} ${_out}/roll/rpc)
  target_link_libraries(${ARG_NAME} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
