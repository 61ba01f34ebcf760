# Adds nvfipc_hostir_driver (hostir_driver.cpp) to nvFuser's build, compiled and linked exactly
# like nvFuser's own test binaries (add_test_without_main: codegen_internal's objects, torch,
# GoogleTest, -Wall -Werror). Include it at the end of nvFuser's CMakeLists.txt, after the tests:
#
#   include(/path/to/nvfuser-ipc/integrations/nvfuser/hostir_driver/hostir_driver.cmake)
#
# It builds against whichever csrc/multidevice/ipc_handle.{h,cpp} the tree holds (nvFuser's own
# or the drop-in), so the same program runs over both.
if(NOT COMMAND add_test_without_main)
  message(FATAL_ERROR "hostir_driver.cmake must be included after nvFuser defines "
                      "add_test_without_main (BUILD_TEST=ON, at the end of CMakeLists.txt)")
endif()
add_test_without_main(nvfipc_hostir_driver
  "${CMAKE_CURRENT_LIST_DIR}/hostir_driver.cpp" "")
