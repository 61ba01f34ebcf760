// Driver availability and pointer classification on a real GPU: what legacy CUDA IPC can export
// is accepted, everything else gets a status and a message instead of a crash.
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_common.hpp"

namespace nvfipc_gpu {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(GpuDriver, IsAvailable) {
  bool available = false;
  GPU_ASSERT_OK(nvfipc_cuda_available(&available));
  EXPECT_TRUE(available);
  GPU_EXPECT_OK(nvfipc_cuda_check());
}

TEST(GpuPointer, CudaMallocIsExportable) {
  DeviceBuffer buf(4096);
  ASSERT_NE(buf.get(), nullptr);
  uint64_t base = 0;
  GPU_ASSERT_OK(nvfipc_cuda_check_pointer(static_cast<char*>(buf.get()) + 256, 512, &base));
  EXPECT_EQ(base, buf.addr());

  nvfipc_cuda_ipc_handle handle{};
  uint64_t offset = 0;
  Stopwatch cold;
  GPU_ASSERT_OK(
      nvfipc_cuda_ipc_export(static_cast<char*>(buf.get()) + 256, 512, &handle, &offset));
  double cold_us = cold.micros();
  EXPECT_EQ(offset, 256u);
  nvfipc_cuda_ipc_handle again{};
  Stopwatch warm;
  GPU_ASSERT_OK(nvfipc_cuda_ipc_export(buf.get(), 16, &again, &offset));
  double warm_us = warm.micros();
  EXPECT_EQ(offset, 0u);
  EXPECT_EQ(std::memcmp(handle.bytes, again.bytes, sizeof handle.bytes), 0)
      << "the same allocation must export the same handle";
  PrintTiming("GpuPointer.CudaMallocIsExportable", "export_cold", cold_us);
  PrintTiming("GpuPointer.CudaMallocIsExportable", "export_cached", warm_us);
}

TEST(GpuPointer, RangeBeyondAllocationIsInvalid) {
  DeviceBuffer buf(4096);
  ASSERT_NE(buf.get(), nullptr);
  nvfipc_status st = nvfipc_cuda_check_pointer(buf.get(), uint64_t{1} << 40, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  EXPECT_TRUE(Contains(LastError(), "does not fit")) << LastError();
  st = nvfipc_cuda_check_pointer(buf.get(), 0, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
}

TEST(GpuPointer, HostPointersAreInvalidArguments) {
  void* pageable = std::malloc(4096);
  ASSERT_NE(pageable, nullptr);
  nvfipc_status st = nvfipc_cuda_check_pointer(pageable, 16, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  EXPECT_TRUE(Contains(LastError(), "not device memory")) << LastError();
  nvfipc_cuda_ipc_handle handle{};
  uint64_t offset = 0;
  st = nvfipc_cuda_ipc_export(pageable, 16, &handle, &offset);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  std::free(pageable);

  void* pinned = nullptr;
  CUDA_ASSERT(cudaMallocHost(&pinned, 4096));
  st = nvfipc_cuda_check_pointer(pinned, 16, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  EXPECT_TRUE(Contains(LastError(), "host")) << LastError();
  cudaFreeHost(pinned);

  st = nvfipc_cuda_check_pointer(nullptr, 16, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
}

TEST(GpuPointer, FreedPointerIsInvalidArgument) {
  void* ptr = nullptr;
  CUDA_ASSERT(cudaMalloc(&ptr, 1 << 20));
  CUDA_ASSERT(cudaFree(ptr));
  nvfipc_status st = nvfipc_cuda_check_pointer(ptr, 16, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  char text[32];
  std::snprintf(text, sizeof text, "%#llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr)));
  EXPECT_TRUE(Contains(LastError(), text)) << "message should name " << text << ": " << LastError();
}

TEST(GpuPointer, VmmMemoryIsExportableButNotByLegacyIpc) {
  CUdevice dev = 0;
  DRV_ASSERT(cuDeviceGet(&dev, job().device));
  int vmm = 0;
  DRV_ASSERT(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  if (!vmm) GTEST_SKIP() << "device has no virtual memory management";

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = job().device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as expandable segments
  size_t granularity = 0;
  DRV_ASSERT(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t size = granularity;
  CUmemGenericAllocationHandle handle = 0;
  DRV_ASSERT(cuMemCreate(&handle, size, &prop, 0));
  CUdeviceptr va = 0;
  DRV_ASSERT(cuMemAddressReserve(&va, size, granularity, 0, 0));
  DRV_ASSERT(cuMemMap(va, size, 0, handle, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_ASSERT(cuMemSetAccess(va, size, &access, 1));

  void* ptr = reinterpret_cast<void*>(va + 64);
  uint64_t base = 0;
  GPU_EXPECT_OK(nvfipc_cuda_check_pointer(ptr, 16, &base));
  EXPECT_EQ(base, va);
  int32_t memory = -1;
  GPU_EXPECT_OK(nvfipc_cuda_pointer_memory(ptr, 16, &memory));
  EXPECT_EQ(memory, NVFIPC_DEVICE_MEMORY_VMM);
  // Past the mapped range: the segment walk finds nothing mapped there.
  nvfipc_status st = nvfipc_cuda_pointer_memory(ptr, size, &memory);
  EXPECT_NE(st, NVFIPC_STATUS_OK);
  nvfipc_cuda_ipc_handle ipc{};
  uint64_t offset = 0;
  st = nvfipc_cuda_ipc_export(ptr, 16, &ipc, &offset);
  EXPECT_EQ(st, NVFIPC_STATUS_UNSUPPORTED) << Describe(st);
  EXPECT_TRUE(Contains(LastError(), "handle cache")) << LastError();

  cuMemUnmap(va, size);
  cuMemAddressFree(va, size);
  cuMemRelease(handle);
}

TEST(GpuPointer, P2pPrimitivesRejectBadEndpoints) {
  nvfipc_p2p_endpoint ep = {};
  nvfipc_status st = nvfipc_cuda_endpoint_send_post(&ep, 1, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  st = nvfipc_cuda_endpoint_send_post(nullptr, 1, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  ep.local_ptr = ep.peer_ptr = ep.local_semaphore = ep.peer_semaphore = 0x1000;
  ep.local_bytes = ep.peer_bytes = 16;
  st = nvfipc_cuda_endpoint_recv_post(&ep, 1, 64, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
  st = nvfipc_cuda_endpoint_send_wait(&ep, 0, nullptr);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);
}

}  // namespace
}  // namespace nvfipc_gpu
