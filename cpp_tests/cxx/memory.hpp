// Memory kinds of the scenario tests: the same test code runs on shared-memory host buffers
// (nvfipc_host_alloc, host P2P primitives) and on CUDA device buffers (cudaMalloc, stream P2P).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "nvfuser_ipc.hpp"

namespace nvfipc_cxx {

class Memory {
 public:
  virtual ~Memory() = default;
  virtual nvfipc::MemKind kind() const = 0;
  virtual std::string name() const = 0;
  // A zero-filled buffer that peers can map; freed when the last copy of the pointer goes.
  virtual std::shared_ptr<void> alloc(size_t bytes) = 0;
  // Host data into a buffer, complete on return (after all work queued before it).
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  // Buffer contents to the host, after all work queued before it.
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Synchronous copy between buffers of this kind (e.g. into a peer's mapped buffer).
  virtual void put(void* dst, const void* src, size_t bytes) = 0;
  // The stream P2P work is queued on (nullptr for host memory).
  virtual void* stream() const = 0;
  // Waits for all queued work.
  virtual void synchronize() = 0;
};

// Shared-memory host buffers.
std::unique_ptr<Memory> MakeHostMemory();

// Whether this binary was built with CUDA device memory support.
bool DeviceMemoryBuilt();

// CUDA device memory on device `local_rank % device count`, with its own stream. Throws when the
// binary was built without CUDA or no device is usable.
std::unique_ptr<Memory> MakeDeviceMemory(int64_t local_rank);

inline std::unique_ptr<Memory> MakeMemory(nvfipc::MemKind kind, int64_t local_rank) {
  return kind == nvfipc::MemKind::Host ? MakeHostMemory() : MakeDeviceMemory(local_rank);
}

}  // namespace nvfipc_cxx
