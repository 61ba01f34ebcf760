# Adds nvfipc_main_driver (main_driver.cpp) to nvFuser main's build (NVIDIA/Fuser 81c4b22fd),
# compiled and linked exactly like its test binaries: add_test_without_main (codegen_internal,
# torch, GoogleTest, tests/cpp/utils.cpp and validator.cpp, -Wall -Werror). Include it at the end
# of nvFuser's CMakeLists.txt, after the tests:
#
#   include(/path/to/nvfuser-ipc/integrations/nvfuser/main/driver/main_driver.cmake)
#
# It builds against whichever csrc/multidevice/ipc_handle.{h,cpp} the tree holds (nvFuser's own
# or the drop-in), so the same program times both.
if(NOT COMMAND add_test_without_main OR NOT BUILD_TEST)
  message(FATAL_ERROR "main_driver.cmake must be included at the end of nvFuser main's "
                      "CMakeLists.txt, with BUILD_TEST=ON (it uses add_test_without_main and GTest)")
endif()
add_test_without_main(nvfipc_main_driver "${CMAKE_CURRENT_LIST_DIR}/main_driver.cpp" "")
