// Shared state and utilities of the GPU suites. The binary runs as one rank of an `mpirun -np N`
// job (ranks from OMPI_COMM_WORLD_*, or WORLD_RANK/RANK for other launchers); every rank runs
// the same tests in the same order, so collective steps (barriers, store exchanges) line up.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "nvfuser_ipc.h"

namespace nvfipc_gpu {

// This rank's place in the job and the library context shared by all tests.
struct Job {
  int64_t rank = 0;
  int64_t world = 1;
  int64_t local_rank = 0;
  int device = 0;
  nvfipc_context* ctx = nullptr;
  nvfipc_store* store = nullptr;
  int64_t timeout_ms = 60000;  // bound of every barrier and store wait in the tests
};

Job& job();

inline std::string LastError() { return nvfipc_last_error_message(); }

inline std::string Describe(nvfipc_status st) {
  return std::string(nvfipc_status_name(static_cast<int32_t>(st))) + ": " + LastError();
}

#define GPU_ASSERT_OK(expr)                                                              \
  do {                                                                                   \
    nvfipc_status st_ = (expr);                                                          \
    ASSERT_EQ(st_, NVFIPC_STATUS_OK) << #expr << " -> " << ::nvfipc_gpu::Describe(st_);   \
  } while (0)

#define GPU_EXPECT_OK(expr)                                                              \
  do {                                                                                   \
    nvfipc_status st_ = (expr);                                                          \
    EXPECT_EQ(st_, NVFIPC_STATUS_OK) << #expr << " -> " << ::nvfipc_gpu::Describe(st_);   \
  } while (0)

// CUDA runtime and driver calls checked with ASSERT_EQ, or with EXPECT_EQ where ASSERT cannot
// return (destructors); a failure names the call and the error.
#define GPU_CUDA_CHECK_(CHECK_EQ_, expr)                                                 \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    CHECK_EQ_(err_, cudaSuccess) << #expr << " -> " << cudaGetErrorName(err_) << ": "    \
                                 << cudaGetErrorString(err_);                            \
  } while (0)

#define GPU_DRV_CHECK_(CHECK_EQ_, expr)                                                  \
  do {                                                                                   \
    CUresult res_ = (expr);                                                              \
    const char* name_ = nullptr;                                                         \
    cuGetErrorName(res_, &name_);                                                        \
    CHECK_EQ_(res_, CUDA_SUCCESS) << #expr << " -> " << (name_ ? name_ : "?");           \
  } while (0)

#define CUDA_ASSERT(expr) GPU_CUDA_CHECK_(ASSERT_EQ, expr)
#define CUDA_EXPECT(expr) GPU_CUDA_CHECK_(EXPECT_EQ, expr)
#define DRV_ASSERT(expr) GPU_DRV_CHECK_(ASSERT_EQ, expr)
#define DRV_EXPECT(expr) GPU_DRV_CHECK_(EXPECT_EQ, expr)

// Skips the test (on every rank alike) unless the job has at least `n` ranks.
#define REQUIRE_RANKS(n)                                                                 \
  do {                                                                                   \
    if (::nvfipc_gpu::job().world < (n)) {                                               \
      GTEST_SKIP() << "needs at least " << (n) << " ranks (run under mpirun -np " << (n)  \
                   << " or more)";                                                       \
    }                                                                                    \
  } while (0)

// World barrier bounded by the job timeout.
inline nvfipc_status Barrier() {
  return nvfipc_barrier(job().ctx, nullptr, 0, job().timeout_ms);
}

// A request for a device buffer of this rank.
inline nvfipc_request Request(int64_t peer, int32_t direction, const char* tag, const void* ptr,
                       uint64_t bytes) {
  nvfipc_request r{};
  r.peer = peer;
  r.direction = direction;
  r.kind = NVFIPC_MEM_DEVICE;
  r.tag = tag;
  r.ptr = reinterpret_cast<uint64_t>(ptr);
  r.bytes = bytes;
  return r;
}

inline int64_t SendPeer() { return (job().rank + 1) % job().world; }
inline int64_t RecvPeer() { return (job().world + job().rank - 1) % job().world; }

// Publishes `bytes` under `key` in the job's store.
inline nvfipc_status Put(const std::string& key, const void* data, size_t len) {
  return nvfipc_store_set(job().store, key.c_str(), static_cast<const uint8_t*>(data), len);
}

// Waits for `key` and copies exactly `len` bytes of its value to `out`.
nvfipc_status Get(const std::string& key, void* out, size_t len);

// Prints one timing line, tagged with the rank, for the run summary (no assertions on time).
void PrintTiming(const std::string& test, const std::string& what, double micros);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double micros() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Waits for `stream` like cudaStreamSynchronize, but bounded (NVFIPC_GPU_STREAM_TIMEOUT_MS,
// default 30 s): a semaphore wait that is never satisfied would otherwise hang the job until the
// launcher's timeout. On timeout the rank prints what it was waiting for and exits with code 3,
// which makes mpirun end the whole job.
cudaError_t SyncStream(cudaStream_t stream, const char* what);

// Reads the library's IPC counters.
inline nvfipc_cuda_ipc_counters Counters() {
  nvfipc_cuda_ipc_counters c{};
  nvfipc_cuda_ipc_counters_get(&c);
  return c;
}

// Whether DeviceBuffer allocates VMM memory (NVFIPC_GPU_DEVICE_MEMORY=vmm: one physical
// allocation exportable as a POSIX fd, as PyTorch's expandable segments make) instead of
// cudaMalloc, so that the cache suites run over either.
bool VmmBuffers();

// A device buffer freed at scope exit: cudaMalloc'd, or VMM (see VmmBuffers).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (VmmBuffers()) {
      AllocVmm();
    } else if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (!ptr_) return;
    if (handle_) {
      cuMemUnmap(reinterpret_cast<CUdeviceptr>(ptr_), reserved_);
      cuMemRelease(handle_);
      cuMemAddressFree(reinterpret_cast<CUdeviceptr>(ptr_), reserved_);
    } else {
      cudaFree(ptr_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void AllocVmm() {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = job().device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t g = 0;
    if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
      return;
    reserved_ = (bytes_ + g - 1) / g * g;
    CUdeviceptr va = 0;
    if (cuMemAddressReserve(&va, reserved_, g, 0, 0) != CUDA_SUCCESS) return;
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cuMemCreate(&handle_, reserved_, &prop, 0) != CUDA_SUCCESS ||
        cuMemMap(va, reserved_, 0, handle_, 0) != CUDA_SUCCESS ||
        cuMemSetAccess(va, reserved_, &access, 1) != CUDA_SUCCESS) {
      if (handle_) {
        cuMemUnmap(va, reserved_);
        cuMemRelease(handle_);
      }
      handle_ = 0;
      cuMemAddressFree(va, reserved_);
      return;
    }
    ptr_ = reinterpret_cast<void*>(va);
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  size_t reserved_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
};

// A cache with its own scope, torn down collectively: everyone's streams are drained and every
// rank is done with its peers' buffers before any cache is freed, and every cache is freed
// before the test frees its buffers (declare it after them). `retained` >= 0 sets how many
// replaced mappings per peer it keeps (0: every replacement releases the old mapping).
class ScopedCache {
 public:
  explicit ScopedCache(const std::string& scope, int64_t retained = -1) {
    status_ = nvfipc_cache_create_scoped(job().ctx, scope.c_str(), &cache_);
    if (status_ == NVFIPC_STATUS_OK && retained >= 0) {
      status_ = nvfipc_cache_set_retained_mappings(cache_, static_cast<uint32_t>(retained));
    }
  }
  ~ScopedCache() { Free(); }
  ScopedCache(const ScopedCache&) = delete;
  ScopedCache& operator=(const ScopedCache&) = delete;
  nvfipc_status status() const { return status_; }
  nvfipc_cache* get() const { return cache_; }
  // Collective teardown; safe to call twice.
  void Free() {
    if (!cache_) return;
    cudaDeviceSynchronize();
    GPU_EXPECT_OK(Barrier());
    GPU_EXPECT_OK(nvfipc_cache_free(cache_));
    cache_ = nullptr;
    GPU_EXPECT_OK(Barrier());
  }

 private:
  nvfipc_cache* cache_ = nullptr;
  nvfipc_status status_ = NVFIPC_STATUS_OK;
};

}  // namespace nvfipc_gpu
