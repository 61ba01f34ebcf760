#include <cstring>
#include <stdexcept>

#include "memory.hpp"

namespace nvfipc_cxx {
namespace {

class HostMemory final : public Memory {
 public:
  nvfipc::MemKind kind() const override { return nvfipc::MemKind::Host; }
  std::string name() const override { return "host"; }
  std::shared_ptr<void> alloc(size_t bytes) override {
    auto buffer = std::make_shared<nvfipc::HostBuffer>(bytes);
    // Aliasing constructor: the pointer is the data, the owner is the HostBuffer.
    return std::shared_ptr<void>(buffer, buffer->data());
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void put(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void* stream() const override { return nullptr; }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<Memory> MakeHostMemory() { return std::make_unique<HostMemory>(); }

#ifndef NVFIPC_CXX_HAVE_CUDA
bool DeviceMemoryBuilt() { return false; }
std::unique_ptr<Memory> MakeDeviceMemory(int64_t) {
  throw std::runtime_error(
      "this test binary was built without CUDA (CUDAToolkit not found at configure time)");
}
#endif

}  // namespace nvfipc_cxx
