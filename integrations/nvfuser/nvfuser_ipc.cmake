# Links nvfuser-ipc into nvFuser's build (NVIDIA/Fuser at 3fe1c32124ea83f90253496cecbe5becf46c9df0).
# See README.md in this directory. In nvFuser's CMakeLists.txt, after
# `add_library(nvfuser_codegen SHARED $<TARGET_OBJECTS:codegen_internal>)` (and before the tests),
# add:
#
#   include(/path/to/nvfuser-ipc/integrations/nvfuser/nvfuser_ipc.cmake)
#
# with csrc/multidevice/ipc_handle.{h,cpp} replaced by the files of this directory.
#
# Where the library comes from, first match wins:
#   -DNVFUSER_IPC_SOURCE_DIR=<nvfuser-ipc tree>    add_subdirectory (builds it with cargo, or uses
#                                                  -DNVFIPC_PREBUILT_LIB_DIR=<dir with the .so>)
#   otherwise find_package(nvfuser_ipc)            an installed copy (CMAKE_PREFIX_PATH)

if(NOT TARGET nvfuser_ipc::nvfuser_ipc)
  if(NVFUSER_IPC_SOURCE_DIR)
    set(NVFIPC_BUILD_TESTS OFF CACHE BOOL "" FORCE)
    add_subdirectory("${NVFUSER_IPC_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/nvfuser_ipc" EXCLUDE_FROM_ALL)
  else()
    find_package(nvfuser_ipc 0.5 REQUIRED)
  endif()
endif()

if(NOT TARGET codegen_internal OR NOT TARGET nvfuser_codegen)
  message(FATAL_ERROR "nvfuser_ipc.cmake must be included after codegen_internal and "
                      "nvfuser_codegen are defined")
endif()

# codegen_internal (an OBJECT library) compiles ipc_handle.cpp, so it needs the headers; PUBLIC
# also reaches everything that links it (test binaries, nvf_py_internal, the Python module).
target_link_libraries(codegen_internal PUBLIC nvfuser_ipc::nvfuser_ipc)
# What the two drop-ins share (common/nvfuser_ipc_dropin.h), included by ipc_handle.cpp from here,
# so that only ipc_handle.{h,cpp} are copied into nvFuser's tree.
target_include_directories(codegen_internal PRIVATE "${CMAKE_CURRENT_LIST_DIR}/common")
# nvfuser_codegen is made from codegen_internal's objects, not by linking the target, so it
# needs the library itself.
target_link_libraries(nvfuser_codegen PRIVATE nvfuser_ipc::nvfuser_ipc)

# libnvfuser_codegen.so finds libnvfuser_ipc.so next to it once installed, and at its build
# location before.
get_target_property(_nvfipc_lib nvfuser_ipc::nvfuser_ipc IMPORTED_LOCATION)
get_filename_component(_nvfipc_lib_dir "${_nvfipc_lib}" DIRECTORY)
set_property(TARGET nvfuser_codegen APPEND PROPERTY BUILD_RPATH "${_nvfipc_lib_dir}")
set_property(TARGET nvfuser_codegen APPEND PROPERTY INSTALL_RPATH "$ORIGIN")
install(FILES "${_nvfipc_lib}" DESTINATION lib)
