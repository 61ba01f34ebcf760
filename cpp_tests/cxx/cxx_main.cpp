// Entry point of the C++ wrapper suites. Started with NVFIPC_TEST_WORKER set, it runs that worker
// (one rank of a multi-process test) instead of the GoogleTest suites.
#include <gtest/gtest.h>

#include "../test_util.hpp"

int main(int argc, char** argv) {
  int worker_exit = nvfipc_test::MaybeRunWorker();
  if (worker_exit >= 0) return worker_exit;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
