# Imports an already built libnvfuser_ipc.so as nvfuser_ipc::nvfuser_ipc, for test directories
# configured on their own (`cmake -S cpp_tests/<dir>`) on machines without cargo.
#   nvfipc_import_prebuilt(<what>)   <what> names the caller in the error message
# Reads the cache variable NVFIPC_PREBUILT_LIB_DIR; headers come from this repository's include/.
function(nvfipc_import_prebuilt what)
  set(NVFIPC_PREBUILT_LIB_DIR "" CACHE PATH "Directory with a prebuilt libnvfuser_ipc.so")
  set(lib
      "${NVFIPC_PREBUILT_LIB_DIR}/${CMAKE_SHARED_LIBRARY_PREFIX}nvfuser_ipc${CMAKE_SHARED_LIBRARY_SUFFIX}")
  if(NOT NVFIPC_PREBUILT_LIB_DIR OR NOT EXISTS "${lib}")
    message(FATAL_ERROR "standalone ${what} need -DNVFIPC_PREBUILT_LIB_DIR=<dir holding "
                        "libnvfuser_ipc.so> (not found: '${lib}')")
  endif()
  add_library(nvfuser_ipc::nvfuser_ipc SHARED IMPORTED GLOBAL)
  set_target_properties(nvfuser_ipc::nvfuser_ipc PROPERTIES
    IMPORTED_LOCATION "${lib}"
    INTERFACE_INCLUDE_DIRECTORIES "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include")
endfunction()
