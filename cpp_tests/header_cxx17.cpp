// The public header must compile as C++17 with every warning as an error (extern "C" linkage,
// no C-only constructs), and link against the library.
#include "nvfuser_ipc.h"

#include <cstdio>
#include <cstring>
#include <type_traits>

static_assert(std::is_same<decltype(&nvfipc_store_free), nvfipc_status (*)(nvfipc_store*)>::value,
              "C linkage declarations are visible with C++ types");
static_assert(NVFIPC_STATUS_OK == 0, "success is zero");

int main() {
  if (std::strcmp(nvfipc_version(), NVFIPC_VERSION) != 0) return 1;
  if (nvfipc_context_free(nullptr) != NVFIPC_STATUS_OK) return 1;
  std::printf("nvfuser_ipc %s (C++17)\n", nvfipc_version());
  return 0;
}
