// CUDA device memory for the scenario tests (compiled only when CUDAToolkit is found).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "memory.hpp"

namespace nvfipc_cxx {
namespace {

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(int64_t local_rank) {
    int count = 0;
    Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (count <= 0) throw std::runtime_error("no CUDA device");
    device_ = static_cast<int>(local_rank % count);
    Check(cudaSetDevice(device_), "cudaSetDevice");
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~DeviceMemory() override {
    if (stream_ != nullptr) {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  nvfipc::MemKind kind() const override { return nvfipc::MemKind::Device; }
  std::string name() const override { return "device" + std::to_string(device_); }
  std::shared_ptr<void> alloc(size_t bytes) override {
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes), "cudaMalloc");
    std::shared_ptr<void> owned(p, [](void* q) { (void)cudaFree(q); });
    Check(cudaMemset(p, 0, bytes), "cudaMemset");
    return owned;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    synchronize();
    Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    synchronize();
    Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  }
  // cudaMemcpy does not wait for device-to-device copies, so queue it and wait for it.
  void put(void* dst, const void* src, size_t bytes) override {
    Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync D2D");
    synchronize();
  }
  void* stream() const override { return stream_; }
  void synchronize() override { Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

bool DeviceMemoryBuilt() { return true; }
std::unique_ptr<Memory> MakeDeviceMemory(int64_t local_rank) {
  return std::make_unique<DeviceMemory>(local_rank);
}

}  // namespace nvfipc_cxx
