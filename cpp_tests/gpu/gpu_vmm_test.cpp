// VMM and stream-ordered pool memory through the handle cache, on a ring (send to rank+1,
// receive from rank-1): buffers laid out as PyTorch's expandable segments lay them out (several
// physical allocations created with POSIX fd handles, mapped back to back into one reserved
// range, buffers spanning them), buffers of an IPC-capable memory pool, and cudaMalloc buffers,
// mixed in one batch, each checked byte for byte on the importer; imports counted per physical
// allocation; imports == releases after teardown. Real PyTorch tensors (expandable segments,
// the cudaMallocAsync backend) are exercised by tests/gpu/torch_vmm.py.
#include <cstring>
#include <string>
#include <vector>

#include "gpu_common.hpp"

namespace nvfipc_gpu {
namespace {

nvfipc_cuda_vmm_counters VmmCounters() {
  nvfipc_cuda_vmm_counters c{};
  EXPECT_EQ(nvfipc_cuda_vmm_counters_get(&c), NVFIPC_STATUS_OK) << LastError();
  return c;
}

bool VmmSupported() {
  CUdevice dev = 0;
  if (cuDeviceGet(&dev, job().device) != CUDA_SUCCESS) return false;
  int vmm = 0;
  cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  return vmm != 0;
}

// The aligned address windows over which the library widens an exchanged VMM buffer's run
// (src/cuda/vmm_runs.rs): the segments of one window travel as one run.
constexpr size_t kWideWindow = size_t{32} << 20;

// `count` physical allocations of `granularity` bytes each (POSIX fd handles, as expandable
// segments create them), mapped back to back into one reserved range, aligned to the library's
// widening window so that what the exchange widens does not depend on where the driver put the
// range; unmapped and released at scope exit.
class ExpandableSegments {
 public:
  explicit ExpandableSegments(int count) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = job().device;
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (cuMemGetAllocationGranularity(&segment_, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
        CUDA_SUCCESS)
      return;
    size_ = segment_ * count;
    if (cuMemAddressReserve(&va_, size_, kWideWindow, 0, 0) != CUDA_SUCCESS) return;
    for (int i = 0; i < count; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (cuMemCreate(&h, segment_, &prop_, 0) != CUDA_SUCCESS) return;
      handles_.push_back(h);
      if (cuMemMap(va_ + i * segment_, segment_, 0, h, 0) != CUDA_SUCCESS) return;
      mapped_ += segment_;
    }
    CUmemAccessDesc access = {};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ok_ = cuMemSetAccess(va_, size_, &access, 1) == CUDA_SUCCESS;
  }
  ~ExpandableSegments() {
    if (mapped_) cuMemUnmap(va_, mapped_);
    for (auto h : handles_) cuMemRelease(h);
    if (va_) cuMemAddressFree(va_, size_);
  }
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;
  bool ok() const { return ok_; }
  size_t segment() const { return segment_; }
  void* at(size_t offset) const { return reinterpret_cast<void*>(va_ + offset); }

 private:
  CUmemAllocationProp prop_ = {};
  size_t segment_ = 0, size_ = 0, mapped_ = 0;
  CUdeviceptr va_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  bool ok_ = false;
};

// An IPC-capable stream-ordered pool (POSIX fd handles) and one allocation from it.
class PoolBuffer {
 public:
  explicit PoolBuffer(size_t bytes) : bytes_(bytes) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = job().device;
    if (cudaMemPoolCreate(&pool_, &props) != cudaSuccess) return;
    if (cudaMallocFromPoolAsync(&ptr_, bytes, pool_, nullptr) != cudaSuccess) ptr_ = nullptr;
    cudaStreamSynchronize(nullptr);
  }
  ~PoolBuffer() {
    if (ptr_) cudaFreeAsync(ptr_, nullptr);
    cudaStreamSynchronize(nullptr);
    if (pool_) cudaMemPoolDestroy(pool_);
  }
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  cudaMemPool_t pool_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Byte `i` of buffer `which` of rank `rank`.
uint8_t Pattern(int64_t rank, int which, size_t i) {
  return static_cast<uint8_t>((i * 131u + static_cast<size_t>(rank) * 29u + which * 7u) & 0xff);
}

void Fill(void* dst, size_t bytes, int64_t rank, int which) {
  std::vector<uint8_t> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = Pattern(rank, which, i);
  ASSERT_EQ(cudaMemcpy(dst, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

// Reads `bytes` at the peer pointer and counts the bytes that differ from the peer's pattern.
size_t Mismatches(uint64_t peer_ptr, size_t bytes, int64_t peer, int which) {
  std::vector<uint8_t> host(bytes);
  if (cudaMemcpy(host.data(), reinterpret_cast<void*>(peer_ptr), bytes, cudaMemcpyDeviceToHost) !=
      cudaSuccess)
    return bytes;
  size_t bad = 0;
  for (size_t i = 0; i < bytes; ++i) bad += host[i] != Pattern(peer, which, i);
  return bad;
}

int PointerMemory(const void* ptr, size_t bytes) {
  int32_t kind = -1;
  nvfipc_status st = nvfipc_cuda_pointer_memory(ptr, bytes, &kind);
  EXPECT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
  return kind;
}

TEST(GpuVmm, MixedBatchOfVmmPoolAndLegacyBuffersIsExchangedByteForByte) {
  REQUIRE_RANKS(2);
  if (!VmmSupported()) GTEST_SKIP() << "device has no virtual memory management";
  const std::string test = "GpuVmm.MixedBatch";
  const int64_t me = job().rank, prev = RecvPeer();
  ExpandableSegments segs(4);
  ASSERT_TRUE(segs.ok()) << "cuMemCreate/cuMemMap of 4 segments failed";
  const size_t g = segs.segment();
  PoolBuffer pool(1 << 20);
  ASSERT_NE(pool.get(), nullptr) << "an IPC-capable memory pool could not be created";
  DeviceBuffer legacy(1 << 20);
  ASSERT_NE(legacy.get(), nullptr);

  // "big" spans segments 0..2 and starts inside segment 0, "small" lies inside segment 3.
  struct Buf {
    const char* tag;
    void* ptr;
    size_t bytes;
    int memory;
  };
  const Buf bufs[] = {
      {"vmm_big", segs.at(64), 2 * g + g / 2, NVFIPC_DEVICE_MEMORY_VMM},
      {"vmm_small", segs.at(3 * g + 4096), 8192, NVFIPC_DEVICE_MEMORY_VMM},
      {"pool", pool.get(), pool.bytes(), NVFIPC_DEVICE_MEMORY_POOL},
      {"legacy", legacy.get(), legacy.bytes(), NVFIPC_DEVICE_MEMORY_LEGACY},
  };
  const int n = sizeof bufs / sizeof bufs[0];
  for (int b = 0; b < n; ++b) {
    EXPECT_EQ(PointerMemory(bufs[b].ptr, bufs[b].bytes), bufs[b].memory) << bufs[b].tag;
    Fill(bufs[b].ptr, bufs[b].bytes, me, b);
  }
  CUDA_ASSERT(cudaDeviceSynchronize());

  const nvfipc_cuda_vmm_counters before = VmmCounters();
  ScopedCache cache("vmm_mixed");
  GPU_ASSERT_OK(cache.status());
  // Every rank sends its buffers to the next rank and receives the previous rank's into the
  // same local buffers' places (the receive side only maps; nothing is written).
  std::vector<nvfipc_request> batch;
  for (int b = 0; b < n; ++b) {
    batch.push_back(Request(SendPeer(), NVFIPC_DIRECTION_SEND, bufs[b].tag, bufs[b].ptr,
                            bufs[b].bytes));
    batch.push_back(Request(prev, NVFIPC_DIRECTION_RECV, bufs[b].tag, bufs[b].ptr,
                            bufs[b].bytes));
  }
  Stopwatch sw;
  GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), batch.data(), batch.size()));
  PrintTiming(test, "exchange_cold_mixed", sw.micros());
  for (int b = 0; b < n; ++b) {
    nvfipc_p2p_handle h{};
    GPU_ASSERT_OK(nvfipc_cache_get(cache.get(), &batch[2 * b + 1], &h));
    ASSERT_NE(h.peer_ptr, 0u) << bufs[b].tag;
    EXPECT_EQ(h.peer_bytes, bufs[b].bytes) << bufs[b].tag;
    EXPECT_EQ(Mismatches(h.peer_ptr, bufs[b].bytes, prev, b), 0u)
        << bufs[b].tag << ": bytes differ from rank " << prev << "'s buffer";
  }
  const nvfipc_cuda_vmm_counters cold = VmmCounters();
  // Both sides of a channel map each other's buffer: a rank imports from the next rank (its
  // send channels) and the previous one (its receives), one process when the world is 2.
  const uint64_t peers = job().world == 2 ? 1 : 2;
  // One import per remote physical allocation (3 for big, 1 for small); big and small lie in
  // one window of 4 segments, so both travel as that run: one map per peer.
  EXPECT_EQ(cold.segment_imports - before.segment_imports, 4u * peers);
  EXPECT_EQ(cold.maps - before.maps, 1u * peers);
  EXPECT_EQ(cold.pool_imports - before.pool_imports, peers);

  // New buffers inside imported segments: one inside "small"'s segment, one inside segment 1
  // alone: the same widened run, so nothing to import or map.
  GPU_ASSERT_OK(Barrier());
  const Buf fresh[] = {
      {"vmm_inside", segs.at(3 * g + 65536), 4096, NVFIPC_DEVICE_MEMORY_VMM},
      {"vmm_inner", segs.at(g + 1024), 16384, NVFIPC_DEVICE_MEMORY_VMM},
  };
  for (int b = 0; b < 2; ++b) Fill(fresh[b].ptr, fresh[b].bytes, me, 10 + b);
  CUDA_ASSERT(cudaDeviceSynchronize());
  GPU_ASSERT_OK(Barrier());
  std::vector<nvfipc_request> again;
  for (int b = 0; b < 2; ++b) {
    again.push_back(Request(SendPeer(), NVFIPC_DIRECTION_SEND, fresh[b].tag, fresh[b].ptr,
                            fresh[b].bytes));
    again.push_back(Request(prev, NVFIPC_DIRECTION_RECV, fresh[b].tag, fresh[b].ptr,
                            fresh[b].bytes));
  }
  Stopwatch sw2;
  GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), again.data(), again.size()));
  PrintTiming(test, "exchange_inside_imported_segments", sw2.micros());
  for (int b = 0; b < 2; ++b) {
    nvfipc_p2p_handle h{};
    GPU_ASSERT_OK(nvfipc_cache_get(cache.get(), &again[2 * b + 1], &h));
    EXPECT_EQ(Mismatches(h.peer_ptr, fresh[b].bytes, prev, 10 + b), 0u) << fresh[b].tag;
  }
  const nvfipc_cuda_vmm_counters inside = VmmCounters();
  EXPECT_EQ(inside.segment_imports, cold.segment_imports) << "no import for imported segments";
  EXPECT_EQ(inside.maps, cold.maps) << "both are served by mappings made before";
  EXPECT_EQ(inside.inside_mapped, cold.inside_mapped)
      << "the run itself serves them, not a mapping around it";

  // Writes through the mapping reach the exporter's memory.
  nvfipc_p2p_handle big{};
  GPU_ASSERT_OK(nvfipc_cache_get(cache.get(), &batch[1], &big));
  const uint32_t mark = 0xabc00000u + static_cast<uint32_t>(me);
  CUDA_ASSERT(cudaMemcpy(reinterpret_cast<void*>(big.peer_ptr + 2 * g), &mark, sizeof mark,
                         cudaMemcpyHostToDevice));
  CUDA_ASSERT(cudaDeviceSynchronize());
  GPU_ASSERT_OK(Barrier());
  uint32_t got = 0;
  CUDA_ASSERT(cudaMemcpy(&got, segs.at(64 + 2 * g), sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 0xabc00000u + static_cast<uint32_t>(SendPeer()))
      << "the next rank's write into segment 2 through its mapping";

  cache.Free();
  GPU_EXPECT_OK(nvfipc_cuda_ipc_flush_releases(job().timeout_ms));
  const nvfipc_cuda_vmm_counters after = VmmCounters();
  EXPECT_EQ(after.segment_imports - before.segment_imports,
            after.segment_releases - before.segment_releases);
  EXPECT_EQ(after.maps - before.maps, after.unmaps - before.unmaps);
  EXPECT_EQ(after.pool_imports - before.pool_imports, after.pool_frees - before.pool_frees);
  EXPECT_EQ(after.live_segments, 0u);
  EXPECT_EQ(after.live_maps, 0u);
  GPU_ASSERT_OK(Barrier());
}

TEST(GpuVmm, NonShareableVmmAndDefaultPoolMemoryAreRefusedWithARemedy) {
  if (!VmmSupported()) GTEST_SKIP() << "device has no virtual memory management";
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = job().device;
  size_t g = 0;
  DRV_ASSERT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle handle = 0;
  DRV_ASSERT(cuMemCreate(&handle, g, &prop, 0));
  CUdeviceptr va = 0;
  DRV_ASSERT(cuMemAddressReserve(&va, g, g, 0, 0));
  DRV_ASSERT(cuMemMap(va, g, 0, handle, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_ASSERT(cuMemSetAccess(va, g, &access, 1));
  nvfipc_status st = nvfipc_cuda_check_pointer(reinterpret_cast<void*>(va), 16, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_UNSUPPORTED) << Describe(st);
  EXPECT_NE(LastError().find("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"), std::string::npos)
      << LastError();
  cuMemUnmap(va, g);
  cuMemAddressFree(va, g);
  cuMemRelease(handle);

  // The default pool is not IPC-capable: classified as pool memory, refused at export.
  REQUIRE_RANKS(2);
  void* ptr = nullptr;
  CUDA_ASSERT(cudaMallocAsync(&ptr, 1 << 16, nullptr));
  CUDA_ASSERT(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(PointerMemory(ptr, 16), NVFIPC_DEVICE_MEMORY_POOL);
  {
    ScopedCache cache("vmm_default_pool");
    GPU_ASSERT_OK(cache.status());
    nvfipc_request r[2] = {Request(SendPeer(), NVFIPC_DIRECTION_SEND, "pool", ptr, 16),
                           Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "pool", ptr, 16)};
    st = nvfipc_exchange_handles_timeout(cache.get(), r, 2, 2000);
    EXPECT_EQ(st, NVFIPC_STATUS_UNSUPPORTED) << Describe(st);
    EXPECT_NE(LastError().find("backend:cudaMallocAsync"), std::string::npos) << LastError();
  }
  cudaFreeAsync(ptr, nullptr);
  cudaStreamSynchronize(nullptr);
}

}  // namespace
}  // namespace nvfipc_gpu
