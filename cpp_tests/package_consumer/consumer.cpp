// Links nvfuser_ipc::nvfuser_ipc and round-trips a key through an embedded store.
#include <nvfuser_ipc.h>

#include <cstdio>
#include <cstring>

int main() {
  nvfipc_server* server = nullptr;
  nvfipc_store* store = nullptr;
  uint16_t port = 0;
  uint8_t* value = nullptr;
  size_t len = 0;
  if (nvfipc_store_serve("127.0.0.1", 0, &port, &server) != NVFIPC_STATUS_OK ||
      nvfipc_store_connect("127.0.0.1", port, 5000, 0, &store) != NVFIPC_STATUS_OK ||
      nvfipc_store_set(store, "k", reinterpret_cast<const uint8_t*>("v"), 1) != NVFIPC_STATUS_OK ||
      nvfipc_store_get(store, "k", 1000, &value, &len) != NVFIPC_STATUS_OK) {
    std::fprintf(stderr, "consumer: %s\n", nvfipc_last_error_message());
    return 1;
  }
  const bool ok = len == 1 && value[0] == 'v';
  nvfipc_buffer_free(value, len);
  nvfipc_store_free(store);
  nvfipc_server_free(server, 1000);
  std::printf("consumer: nvfuser_ipc %s %s\n", nvfipc_version(), ok ? "ok" : "WRONG VALUE");
  return ok ? 0 : 1;
}
