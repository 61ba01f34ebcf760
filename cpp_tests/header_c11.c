/* The public header must compile as strict C11 with every warning as an error, and its version
 * macro must match the library that gets loaded. */
#include "nvfuser_ipc.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  nvfipc_status status = NVFIPC_STATUS_OK;
  nvfipc_store* store = NULL;
  nvfipc_bytes span = {NULL, 0};
  nvfipc_buffer buffer = {NULL, 0};
  (void)span;
  if (nvfipc_store_free(store) != NVFIPC_STATUS_OK) return 1;
  if (nvfipc_buffer_free(buffer.data, buffer.len) != status) return 1;
  if (strcmp(nvfipc_version(), NVFIPC_VERSION) != 0) {
    fprintf(stderr, "header %s, library %s\n", NVFIPC_VERSION, nvfipc_version());
    return 1;
  }
  if (NVFIPC_VERSION_MAJOR < 0 || NVFIPC_VERSION_MINOR < 0 || NVFIPC_VERSION_PATCH < 0) return 1;
  printf("nvfuser_ipc %s (C11)\n", nvfipc_version());
  return 0;
}
