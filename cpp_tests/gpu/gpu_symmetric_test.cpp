// Symmetric memory on a real GPU (nvfipc_symmetric_rendezvous / _contiguous_view / _release):
// cudaMalloc and VMM buffers of the whole world, checked byte for byte through every member's
// mapping (and, for VMM, through the contiguous view); a subset of the world while the other
// ranks take no part; two disjoint groups at once under one tag; and a member that really dies
// mid-rendezvous (a job of three child processes started by rank 0), whose peers must get a
// status naming it within their timeout instead of hanging.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.hpp"

extern char** environ;

namespace nvfipc_gpu {
namespace {

// Written into out_ptrs/out_bytes beyond the members: a rendezvous must leave them alone.
constexpr uint64_t kUntouched = 0xdeadbeefcafef00dull;
// The environment variable that marks a process of the dying-member child job.
constexpr const char* kChildVar = "NVFIPC_GPU_CHILD";

bool ChildMode() {
  const char* v = std::getenv(kChildVar);
  return v != nullptr && std::string(v) == "1";
}

// The byte rank `rank` fills its buffer with in step `salt`: distinct for ranks 0..7 of a step
// (37 is odd, so 37 * r differs mod 256), never zero for the salts used here.
uint8_t RankByte(int64_t rank, int salt) {
  return static_cast<uint8_t>(0x11 + 37 * rank + 13 * salt);
}

// A cudaMalloc buffer (whatever NVFIPC_GPU_DEVICE_MEMORY says), freed at scope exit.
struct CudaMallocBuffer {
  void* ptr = nullptr;
  CudaMallocBuffer() = default;
  CudaMallocBuffer(const CudaMallocBuffer&) = delete;
  CudaMallocBuffer& operator=(const CudaMallocBuffer&) = delete;
  ~CudaMallocBuffer() {
    if (ptr) CUDA_EXPECT(cudaFree(ptr));
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(ptr); }
};

// One VMM allocation (cuMemCreate with a POSIX fd handle type, mapped read-write for this
// device into a range of its own), undone at scope exit as far as MakeVmm got.
struct VmmAllocation {
  CUdeviceptr va = 0;
  size_t size = 0;
  size_t granularity = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool mapped = false;
  VmmAllocation() = default;
  VmmAllocation(const VmmAllocation&) = delete;
  VmmAllocation& operator=(const VmmAllocation&) = delete;
  ~VmmAllocation() {
    if (mapped) DRV_EXPECT(cuMemUnmap(va, size));
    if (handle) DRV_EXPECT(cuMemRelease(handle));
    if (va) DRV_EXPECT(cuMemAddressFree(va, size));
  }
  void* get() const { return reinterpret_cast<void*>(va); }
  uint64_t addr() const { return static_cast<uint64_t>(va); }
};

void MakeVmm(size_t bytes, VmmAllocation* a) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = job().device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  DRV_ASSERT(cuMemGetAllocationGranularity(&a->granularity, &prop,
                                           CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = (bytes + a->granularity - 1) / a->granularity * a->granularity;
  DRV_ASSERT(cuMemCreate(&a->handle, size, &prop, 0));
  DRV_ASSERT(cuMemAddressReserve(&a->va, size, a->granularity, 0, 0));
  a->size = size;
  DRV_ASSERT(cuMemMap(a->va, size, 0, a->handle, 0));
  a->mapped = true;
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV_ASSERT(cuMemSetAccess(a->va, size, &access, 1));
}

// Copies `bytes` at device address `ptr` (this process's view of some member's buffer) to the
// host and checks that every byte is `expected`.
::testing::AssertionResult HoldsByte(uint64_t ptr, size_t bytes, uint8_t expected) {
  std::vector<uint8_t> host(bytes);
  cudaError_t err =
      cudaMemcpy(host.data(), reinterpret_cast<void*>(ptr), bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy of " << bytes << " bytes from 0x"
                                         << std::hex << ptr << std::dec << " -> "
                                         << cudaGetErrorName(err);
  }
  size_t bad = 0, first = bytes;
  for (size_t i = 0; i < bytes; ++i) {
    if (host[i] != expected) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad != 0) {
    return ::testing::AssertionFailure()
           << bad << " of " << bytes << " bytes differ from 0x" << std::hex
           << static_cast<int>(expected) << "; the first, at offset " << std::dec << first
           << ", holds 0x" << std::hex << static_cast<int>(host[first]) << std::dec;
  }
  return ::testing::AssertionSuccess();
}

// The members of a rendezvous given `ranks` (empty: the whole world), in increasing order.
std::vector<int64_t> Members(const std::vector<int64_t>& ranks) {
  std::vector<int64_t> members = ranks;
  if (members.empty()) {
    for (int64_t r = 0; r < job().world; ++r) members.push_back(r);
  }
  std::sort(members.begin(), members.end());
  return members;
}

// Rendezvous of this rank's buffer `ptr`/`bytes` under `tag` with `ranks` (empty: the whole
// world, passed as NULL/0; otherwise passed in the given order), with room for one entry more
// than the world, and checks the shape of the result: exactly one entry per member, in
// increasing rank order (this rank's own pointer at its own place), every size `bytes`, all
// pointers distinct and non-null. `ptrs` receives the members' pointers; `micros` the time.
void Rendezvous(const nvfipc_cache* cache, const char* tag, uint64_t ptr, size_t bytes,
                const std::vector<int64_t>& ranks, std::vector<uint64_t>* ptrs, double* micros) {
  const std::vector<int64_t> members = Members(ranks);
  const size_t n_out = static_cast<size_t>(job().world) + 1;
  std::vector<uint64_t> out_ptrs(n_out, kUntouched), out_bytes(n_out, kUntouched);
  Stopwatch sw;
  GPU_ASSERT_OK(nvfipc_symmetric_rendezvous(cache, tag, NVFIPC_MEM_DEVICE, ptr, bytes,
                                            ranks.empty() ? nullptr : ranks.data(), ranks.size(),
                                            job().timeout_ms, out_ptrs.data(), out_bytes.data(),
                                            n_out));
  *micros = sw.micros();
  for (size_t i = 0; i < members.size(); ++i) {
    ASSERT_NE(out_ptrs[i], 0u) << tag << ": member " << i << " (rank " << members[i] << ")";
    ASSERT_NE(out_ptrs[i], kUntouched) << tag << ": member " << i << " (rank " << members[i]
                                       << ") was not written";
    EXPECT_EQ(out_bytes[i], bytes) << tag << ": size of rank " << members[i] << "'s buffer";
    if (members[i] == job().rank) {
      EXPECT_EQ(out_ptrs[i], ptr) << tag << ": this rank's entry must be its own pointer";
    }
  }
  for (size_t i = members.size(); i < n_out; ++i) {
    EXPECT_EQ(out_ptrs[i], kUntouched) << tag << ": out_ptrs[" << i << "] written beyond the "
                                       << members.size() << " members";
    EXPECT_EQ(out_bytes[i], kUntouched) << tag << ": out_bytes[" << i << "] written beyond the "
                                        << members.size() << " members";
  }
  std::vector<uint64_t> mine(out_ptrs.begin(), out_ptrs.begin() + members.size());
  std::vector<uint64_t> sorted = mine;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end())
      << tag << ": two members mapped at one address";
  *ptrs = mine;
}

// Checks every byte of every member's buffer through `ptrs` (one per member of `ranks`, as
// Rendezvous returns them): member m holds RankByte(m, salt).
void CheckMembers(const std::vector<uint64_t>& ptrs, const std::vector<int64_t>& ranks,
                  size_t bytes, int salt, const std::string& what) {
  const std::vector<int64_t> members = Members(ranks);
  ASSERT_EQ(ptrs.size(), members.size()) << what;
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_TRUE(HoldsByte(ptrs[i], bytes, RankByte(members[i], salt)))
        << what << ": rank " << members[i] << "'s buffer as mapped by rank " << job().rank;
  }
}

// The whole world's rendezvous of `buf` (filled with RankByte(rank, salt)), checked byte for
// byte, then repeated: the same tag and buffer give the same pointers. `ptrs` receives them.
void WorldRendezvousTwice(const nvfipc_cache* cache, const char* tag, uint64_t buf, size_t bytes,
                          int salt, const std::string& test, std::vector<uint64_t>* ptrs) {
  const std::vector<int64_t> world;  // empty: NULL/0, the whole world
  double us = 0;
  Rendezvous(cache, tag, buf, bytes, world, ptrs, &us);
  if (::testing::Test::HasFatalFailure()) return;
  PrintTiming(test, "rendezvous_cold", us);
  CheckMembers(*ptrs, world, bytes, salt, test + " cold");
  std::vector<uint64_t> again;
  Rendezvous(cache, tag, buf, bytes, world, &again, &us);
  if (::testing::Test::HasFatalFailure()) return;
  PrintTiming(test, "rendezvous_warm", us);
  EXPECT_EQ(again, *ptrs) << test << ": a second rendezvous of the same buffer moved a mapping";
}

// After a release the tag is unknown: a second release and a view are refused.
void ExpectReleased(const nvfipc_cache* cache, const char* tag) {
  nvfipc_status st = nvfipc_symmetric_release(cache, tag);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << "second release of " << tag << ": "
                                                << Describe(st);
  uint64_t base = 0, stride = 0;
  st = nvfipc_symmetric_contiguous_view(cache, tag, &base, &stride);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << "view of released " << tag << ": "
                                                << Describe(st);
}

TEST(GpuSymmetric, CudaMallocBuffersAreMappedByteForByteWithoutAView) {
  const std::string test = "GpuSymmetric.CudaMalloc";
  constexpr size_t kBytes = 4u << 20;
  constexpr int kSalt = 1;
  CudaMallocBuffer buf;
  CUDA_ASSERT(cudaMalloc(&buf.ptr, kBytes));
  int32_t memory = -1;
  GPU_ASSERT_OK(nvfipc_cuda_pointer_memory(buf.ptr, kBytes, &memory));
  ASSERT_EQ(memory, NVFIPC_DEVICE_MEMORY_LEGACY) << "cudaMalloc memory should be legacy memory";
  CUDA_ASSERT(cudaMemset(buf.ptr, RankByte(job().rank, kSalt), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  ScopedCache cache("symm_legacy");  // after the buffer: freed (collectively) before it
  GPU_ASSERT_OK(cache.status());

  std::vector<uint64_t> ptrs;
  WorldRendezvousTwice(cache.get(), "legacy", buf.addr(), kBytes, kSalt, test, &ptrs);
  if (HasFatalFailure()) return;

  // cudaMalloc memory cannot be mapped a second time into another range.
  uint64_t base = 0, stride = 0;
  nvfipc_status st = nvfipc_symmetric_contiguous_view(cache.get(), "legacy", &base, &stride);
  EXPECT_EQ(st, NVFIPC_STATUS_UNSUPPORTED) << Describe(st);
  EXPECT_NE(LastError().find("cudaMalloc"), std::string::npos) << LastError();

  GPU_EXPECT_OK(nvfipc_symmetric_release(cache.get(), "legacy"));
  ExpectReleased(cache.get(), "legacy");
  // Peers read this rank's buffer until they are done: nobody frees before everyone is.
  GPU_EXPECT_OK(Barrier());
  cache.Free();
}

TEST(GpuSymmetric, VmmBuffersAreMappedByteForByteAndViewedContiguously) {
  CUdevice dev = 0;
  DRV_ASSERT(cuDeviceGet(&dev, job().device));
  int vmm = 0, posix_fd = 0;
  DRV_ASSERT(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  dev));
  DRV_ASSERT(cuDeviceGetAttribute(
      &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  if (vmm == 0 || posix_fd == 0) {
    GTEST_SKIP() << "device " << job().device
                 << " has no virtual memory management with POSIX fd handles (VMM " << vmm
                 << ", POSIX fd " << posix_fd << "): the VMM half of the symmetric test is skipped";
  }
  const std::string test = "GpuSymmetric.Vmm";
  constexpr size_t kBytes = 4u << 20;
  constexpr int kSalt = 2;
  VmmAllocation buf;
  MakeVmm(kBytes, &buf);
  if (HasFatalFailure()) return;
  int32_t memory = -1;
  GPU_ASSERT_OK(nvfipc_cuda_pointer_memory(buf.get(), kBytes, &memory));
  ASSERT_EQ(memory, NVFIPC_DEVICE_MEMORY_VMM) << "cuMemCreate memory should be VMM memory";
  CUDA_ASSERT(cudaMemset(buf.get(), RankByte(job().rank, kSalt), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  ScopedCache cache("symm_vmm");  // after the allocation: freed (collectively) before it
  GPU_ASSERT_OK(cache.status());

  std::vector<uint64_t> ptrs;
  WorldRendezvousTwice(cache.get(), "vmm", buf.addr(), kBytes, kSalt, test, &ptrs);
  if (HasFatalFailure()) return;

  // Every member (this rank's own buffer included) again, in rank order, in one range.
  uint64_t base = 0, stride = 0;
  Stopwatch sw;
  GPU_ASSERT_OK(nvfipc_symmetric_contiguous_view(cache.get(), "vmm", &base, &stride));
  PrintTiming(test, "contiguous_view", sw.micros());
  ASSERT_NE(base, 0u);
  ASSERT_GE(stride, kBytes) << "members' slots of the view overlap";
  EXPECT_EQ(stride % buf.granularity, 0u) << "the stride is in whole allocation granules";
  std::vector<uint64_t> slots;
  for (int64_t i = 0; i < job().world; ++i) slots.push_back(base + static_cast<uint64_t>(i) * stride);
  CheckMembers(slots, {}, kBytes, kSalt, test + " contiguous view");
  uint64_t base2 = 0, stride2 = 0;
  GPU_EXPECT_OK(nvfipc_symmetric_contiguous_view(cache.get(), "vmm", &base2, &stride2));
  EXPECT_EQ(base2, base) << "a second view call returns the cache's view";
  EXPECT_EQ(stride2, stride);

  GPU_EXPECT_OK(nvfipc_symmetric_release(cache.get(), "vmm"));
  ExpectReleased(cache.get(), "vmm");
  GPU_EXPECT_OK(Barrier());  // peers are done reading before anyone frees
  cache.Free();
}

TEST(GpuSymmetric, SubsetOfTheWorldTakesNoOtherRankPart) {
  // {0, world-1} (and {1, 2} at the same time when the world has 4 ranks or more) rendezvous;
  // every other rank does not call at all, so a rendezvous that waited for non-members would
  // time out here.
  REQUIRE_RANKS(2);
  const std::string test = "GpuSymmetric.Subset";
  constexpr size_t kBytes = 1u << 20;
  constexpr int kSalt = 3;
  const int64_t me = job().rank, world = job().world;
  struct Group {
    const char* tag;
    std::vector<int64_t> ranks;
  };
  std::vector<Group> groups = {{"subset_ends", {0, world - 1}}};
  if (world >= 4) groups.push_back({"subset_inner", {1, 2}});
  const Group* mine = nullptr;
  for (const Group& g : groups) {
    if (std::find(g.ranks.begin(), g.ranks.end(), me) != g.ranks.end()) mine = &g;
  }
  DeviceBuffer buf(kBytes);
  ASSERT_NE(buf.get(), nullptr);
  CUDA_ASSERT(cudaMemset(buf.get(), RankByte(me, kSalt), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  ScopedCache cache("symm_subset");
  GPU_ASSERT_OK(cache.status());

  if (mine != nullptr) {
    // The last rank lists its group backwards: the order of `ranks` must not matter.
    std::vector<int64_t> ranks = mine->ranks;
    if (me == world - 1) std::reverse(ranks.begin(), ranks.end());
    std::vector<uint64_t> ptrs;
    double us = 0;
    Rendezvous(cache.get(), mine->tag, buf.addr(), kBytes, ranks, &ptrs, &us);
    if (!HasFatalFailure()) {
      PrintTiming(test, "rendezvous_pair", us);
      EXPECT_EQ(ptrs.size(), mine->ranks.size());
      CheckMembers(ptrs, ranks, kBytes, kSalt, test + " " + mine->tag);
      GPU_EXPECT_OK(nvfipc_symmetric_release(cache.get(), mine->tag));
    }
  } else {
    // A rank outside every group knows none of their tags.
    for (const Group& g : groups) {
      nvfipc_status st = nvfipc_symmetric_release(cache.get(), g.tag);
      EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << g.tag << ": " << Describe(st);
    }
  }
  GPU_EXPECT_OK(Barrier());  // members are done reading before anyone frees
  cache.Free();
}

TEST(GpuSymmetric, TwoGroupsAtOnceUnderOneTagThenTheWorld) {
  // Even and odd ranks rendezvous concurrently under the same tag (the groups differ, so do
  // their channels); with two ranks each group is one rank alone. Then the whole world under
  // another tag, over the same buffers refilled: the groups' mappings still show them too.
  REQUIRE_RANKS(2);
  const std::string test = "GpuSymmetric.TwoGroups";
  constexpr size_t kBytes = 1u << 20;
  const int64_t me = job().rank, world = job().world;
  const int parity = static_cast<int>(me % 2);
  const int group_salt = 5 + parity, world_salt = 7;
  std::vector<int64_t> half;
  for (int64_t r = parity; r < world; r += 2) half.push_back(r);
  DeviceBuffer buf(kBytes);
  ASSERT_NE(buf.get(), nullptr);
  CUDA_ASSERT(cudaMemset(buf.get(), RankByte(me, group_salt), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  ScopedCache cache("symm_halves");
  GPU_ASSERT_OK(cache.status());

  std::vector<uint64_t> half_ptrs;
  double us = 0;
  Rendezvous(cache.get(), "halves", buf.addr(), kBytes, half, &half_ptrs, &us);
  if (HasFatalFailure()) return;
  PrintTiming(test, parity == 0 ? "rendezvous_even" : "rendezvous_odd", us);
  EXPECT_EQ(half_ptrs.size(), half.size());
  CheckMembers(half_ptrs, half, kBytes, group_salt, test + " halves");

  // Everyone has read the groups' bytes before anyone overwrites its buffer; a peer's world
  // rendezvous cannot finish before this rank's has published, i.e. after the refill.
  GPU_ASSERT_OK(Barrier());
  CUDA_ASSERT(cudaMemset(buf.get(), RankByte(me, world_salt), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint64_t> world_ptrs;
  Rendezvous(cache.get(), "halves_world", buf.addr(), kBytes, {}, &world_ptrs, &us);
  if (HasFatalFailure()) return;
  PrintTiming(test, "rendezvous_world", us);
  CheckMembers(world_ptrs, {}, kBytes, world_salt, test + " world");
  CheckMembers(half_ptrs, half, kBytes, world_salt, test + " halves after the refill");

  GPU_EXPECT_OK(nvfipc_symmetric_release(cache.get(), "halves"));
  GPU_EXPECT_OK(nvfipc_symmetric_release(cache.get(), "halves_world"));
  GPU_EXPECT_OK(Barrier());  // peers are done reading before anyone frees
  cache.Free();
}

// ---- A member that dies mid-rendezvous ------------------------------------------------------
// Rank 0 of the mpirun job starts a job of three processes of this binary (a store of their
// own, hosted by child rank 0), which run GpuSymmetricChild.MemberDies: child rank 2 publishes
// its record, times out and kills itself; ranks 0 and 1 then rendezvous with it and must get a
// status naming rank 2 within their timeout. The parent checks how each child ended.

constexpr int kChildren = 3;
constexpr int64_t kSurvivorTimeoutMs = 10000;
constexpr int64_t kChildJobBoundMs = 40000;

// True when `msg` names rank `rank` ("rank 2", not "rank 20").
bool NamesRank(const std::string& msg, int64_t rank) {
  const std::string needle = "rank " + std::to_string(rank);
  for (size_t at = msg.find(needle); at != std::string::npos; at = msg.find(needle, at + 1)) {
    const size_t end = at + needle.size();
    if (end == msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end]))) return true;
  }
  return false;
}

// A TCP port that was free a moment ago (bound to port 0 on the loopback, then closed).
uint16_t FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// This process's environment without the launcher's rank and store variables (Open MPI's
// would win over RANK/WORLD_SIZE, in gpu_main.cpp and in nvfipc_context_from_env), plus those
// of child rank `rank` of a three-rank job on `port`.
std::vector<std::string> ChildEnvironment(int rank, uint16_t port) {
  static const char* const kPrefixes[] = {"OMPI_", "PMIX_", "PRTE_", "SLURM_"};
  static const char* const kNames[] = {
      // Other launchers' rank and store variables, read before or instead of ours.
      "WORLD_RANK", "WORLD_SIZE", "WORLD_LOCAL_RANK", "WORLD_LOCAL_SIZE", "RANK", "LOCAL_RANK",
      "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NVFUSER_MASTER_ADDR",
      "NVFUSER_MASTER_PORT", "NVFIPC_STORE_ADDR",
      // The parent job's name and timeouts; set again below.
      "NVFIPC_JOB_TAG", "NVFIPC_LAUNCH_ID", "TORCHELASTIC_RUN_ID", "NVFIPC_TIMEOUT_MS",
      "NVFIPC_GPU_TEST_TIMEOUT_MS", kChildVar,
      // The parent's result files, which a child must not overwrite.
      "NVFIPC_GPU_JSON_DIR", "GTEST_OUTPUT", "GTEST_FILTER"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string name = kv.substr(0, kv.find('='));
    bool drop = false;
    for (const char* p : kPrefixes) drop = drop || name.rfind(p, 0) == 0;
    for (const char* n : kNames) drop = drop || name == n;
    if (!drop) env.push_back(kv);
  }
  const std::string n = std::to_string(kChildren);
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + n);
  env.push_back("LOCAL_RANK=" + std::to_string(rank));  // local rank 0 hosts the store
  env.push_back("LOCAL_WORLD_SIZE=" + n);
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("NVFIPC_JOB_TAG=gsym-child-" + std::to_string(getpid()) + "-" +
                std::to_string(port));
  // Every wait of the child job well inside the parent's bound.
  env.push_back("NVFIPC_TIMEOUT_MS=20000");
  env.push_back("NVFIPC_GPU_TEST_TIMEOUT_MS=20000");
  env.push_back(std::string(kChildVar) + "=1");
  return env;
}

bool ExitedZero(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
bool KilledBy(int status, int sig) { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// The child processes; any still running at scope exit (a failed assertion, an overrun) are
// killed and reaped, bounded, so that none outlives the test.
class ChildJob {
 public:
  struct Child {
    int rank = -1;
    pid_t pid = -1;
    bool done = false;
    int status = 0;
  };
  ~ChildJob() { KillAndReap(); }
  std::vector<Child>& children() { return children_; }

  // Reaps every child as soon as it ends (no zombie outlives the test), until all have ended or
  // `bound_ms` passed; false on overrun.
  bool Wait(int64_t bound_ms) {
    Stopwatch waited;
    for (;;) {
      bool all = true;
      for (Child& c : children_) {
        if (c.done) continue;
        const pid_t r = waitpid(c.pid, &c.status, WNOHANG);
        if (r == c.pid) {
          c.done = true;
          std::printf("GpuSymmetric.MemberThatDies: child rank %d (pid %d) %s after %.0f ms\n",
                      c.rank, static_cast<int>(c.pid), DescribeExit(c.status).c_str(),
                      started_.micros() / 1e3);
          std::fflush(stdout);
        } else if (r < 0 && errno != EINTR) {
          ADD_FAILURE() << "waitpid(" << c.pid << ") -> " << std::strerror(errno);
          c.done = true;
          c.status = -1;
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (waited.micros() > 1000.0 * static_cast<double>(bound_ms)) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void KillAndReap() {
    for (Child& c : children_) {
      if (!c.done && c.pid > 0) kill(c.pid, SIGKILL);
    }
    Wait(5000);
  }

 private:
  std::vector<Child> children_;
  Stopwatch started_;  // for the messages: each child's end, from the job's start
};

// Rank 0 of the mpirun job: starts the child job and checks how each child ended.
void RunDyingMemberJob() {
  const uint16_t port = FreePort();
  ASSERT_NE(port, 0) << "no free TCP port for the child job's store: " << std::strerror(errno);
  char exe[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0) << "readlink(/proc/self/exe) -> " << std::strerror(errno);
  std::string filter = "--gtest_filter=GpuSymmetricChild.*";
  std::string color = "--gtest_color=no";
  std::vector<char*> argv = {exe, filter.data(), color.data(), nullptr};

  posix_spawn_file_actions_t actions;
  ASSERT_EQ(posix_spawn_file_actions_init(&actions), 0);
  // The children read nothing; their stdout and stderr are this rank's (mpirun tags them).
  ASSERT_EQ(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0), 0);
  posix_spawnattr_t attr;
  ASSERT_EQ(posix_spawnattr_init(&attr), 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGCHLD}) sigaddset(&defaults, s);
  ASSERT_EQ(posix_spawnattr_setsigmask(&attr, &none), 0);
  ASSERT_EQ(posix_spawnattr_setsigdefault(&attr, &defaults), 0);
  ASSERT_EQ(posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF), 0);

  std::printf("GpuSymmetric.MemberThatDies: starting %d children of %s, store on 127.0.0.1:%u\n",
              kChildren, exe, static_cast<unsigned>(port));
  std::fflush(stdout);
  ChildJob job_of_children;
  int spawn_error = 0;
  for (int r = 0; r < kChildren && spawn_error == 0; ++r) {
    std::vector<std::string> env = ChildEnvironment(r, port);
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    ChildJob::Child c;
    c.rank = r;
    spawn_error = posix_spawn(&c.pid, "/proc/self/exe", &actions, &attr, argv.data(), envp.data());
    if (spawn_error == 0) job_of_children.children().push_back(c);
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ASSERT_EQ(spawn_error, 0) << "posix_spawn(/proc/self/exe) -> " << std::strerror(spawn_error);

  Stopwatch sw;
  const bool ended = job_of_children.Wait(kChildJobBoundMs);
  PrintTiming("GpuSymmetric.MemberThatDies", "child_job", sw.micros());
  ASSERT_TRUE(ended) << "the child job was still running after " << kChildJobBoundMs
                     << " ms: a rendezvous with a dead member hung (children killed)";
  const auto& kids = job_of_children.children();
  ASSERT_EQ(kids.size(), static_cast<size_t>(kChildren));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(ExitedZero(kids[r].status))
        << "child rank " << r << " " << DescribeExit(kids[r].status)
        << "; its GpuSymmetricChild.MemberDies output above says why";
  }
  EXPECT_TRUE(KilledBy(kids[2].status, SIGKILL))
      << "child rank 2 should have killed itself with SIGKILL after its rendezvous timed out, "
         "but it "
      << DescribeExit(kids[2].status);
}

TEST(GpuSymmetric, MemberThatDiesIsNamedNotAwaited) {
  if (ChildMode()) GTEST_SKIP() << "this is a child of the test already";
  // Only rank 0 runs the child job; everyone meets once it is over (bounded by the job
  // timeout, above the child job's bound).
  if (job().rank == 0) RunDyingMemberJob();
  GPU_EXPECT_OK(Barrier());
}

TEST(GpuSymmetricChild, MemberDies) {
  if (!ChildMode()) {
    GTEST_SKIP() << "runs only in the child job of GpuSymmetric.MemberThatDiesIsNamedNotAwaited ("
                 << kChildVar << "=1)";
  }
  ASSERT_EQ(job().world, kChildren);
  const int64_t me = job().rank;
  constexpr size_t kBytes = 1u << 20;
  CudaMallocBuffer buf;
  CUDA_ASSERT(cudaMalloc(&buf.ptr, kBytes));
  CUDA_ASSERT(cudaMemset(buf.ptr, RankByte(me, 9), kBytes));
  CUDA_ASSERT(cudaDeviceSynchronize());
  nvfipc_cache* cache = nullptr;
  GPU_ASSERT_OK(nvfipc_cache_create(job().ctx, &cache));
  // Every cache exists (and so every rank's identity is published) before rank 2 starts.
  GPU_ASSERT_OK(Barrier());
  std::vector<uint64_t> ptrs(kChildren, kUntouched), sizes(kChildren, kUntouched);

  if (me == 2) {
    // Publishes its record, finds no peer within 300 ms (they sleep), and dies for real: no
    // cache free, no context close, its fd responder gone with the process.
    Stopwatch sw;
    const nvfipc_status st = nvfipc_symmetric_rendezvous(cache, "dies", NVFIPC_MEM_DEVICE,
                                                         buf.addr(), kBytes, nullptr, 0, 300,
                                                         ptrs.data(), sizes.data(), kChildren);
    const std::string msg = LastError();
    std::printf("child rank 2: rendezvous -> %s after %.0f ms: %s\n",
                nvfipc_status_name(static_cast<int32_t>(st)), sw.micros() / 1e3, msg.c_str());
    std::fflush(stdout);
    if (st != NVFIPC_STATUS_TIMEOUT) {
      // Not the death the parent waits for: it reports exit code 5, and fails.
      std::fprintf(stderr, "child rank 2: expected NVFIPC_STATUS_TIMEOUT\n");
      std::fflush(stderr);
      std::_Exit(5);
    }
    raise(SIGKILL);
    std::_Exit(6);  // not reached
  }

  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t group[kChildren] = {0, 1, 2};
  Stopwatch sw;
  const nvfipc_status st = nvfipc_symmetric_rendezvous(
      cache, "dies", NVFIPC_MEM_DEVICE, buf.addr(), kBytes, group, kChildren, kSurvivorTimeoutMs,
      ptrs.data(), sizes.data(), kChildren);
  const double ms = sw.micros() / 1e3;
  const std::string msg = LastError();
  std::printf("child rank %lld: rendezvous with dead rank 2 -> %s after %.0f ms: %s\n",
              static_cast<long long>(me), nvfipc_status_name(static_cast<int32_t>(st)), ms,
              msg.c_str());
  std::fflush(stdout);
  EXPECT_NE(st, NVFIPC_STATUS_OK) << "a rendezvous with a dead member succeeded";
  EXPECT_NE(st, NVFIPC_STATUS_PANIC) << msg;
  EXPECT_LT(ms, static_cast<double>(kSurvivorTimeoutMs + 5000))
      << "the failure came later than the timeout allows";
  EXPECT_TRUE(NamesRank(msg, 2)) << "the message does not name the dead rank 2: " << msg;

  // The survivors finish together (a world barrier would wait for rank 2 forever), then free
  // their caches (a dead peer is not waited for) before their buffers.
  const int64_t survivors[2] = {0, 1};
  GPU_EXPECT_OK(nvfipc_barrier(job().ctx, survivors, 2, job().timeout_ms));
  GPU_EXPECT_OK(nvfipc_cache_free(cache));
}

}  // namespace
}  // namespace nvfipc_gpu
