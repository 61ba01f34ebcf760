// Checks for worker processes: a failed check prints rank, expression and the library's message
// to stderr and makes the worker return a non-zero exit code.
#pragma once

#include <cstdio>
#include <string>

#include "test_util.hpp"

#define WORKER_CHECK_OK(expr)                                                              \
  do {                                                                                     \
    nvfipc_status st_ = (expr);                                                            \
    if (st_ != NVFIPC_STATUS_OK) {                                                         \
      std::fprintf(stderr, "rank %lld: %s -> %s\n", static_cast<long long>(env.rank), #expr, \
                   ::nvfipc_test::Describe(st_).c_str());                                  \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

#define WORKER_CHECK(cond, ...)                                                            \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "rank %lld: check failed: %s: %s\n",                           \
                   static_cast<long long>(env.rank), #cond, (std::string() + __VA_ARGS__).c_str()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
