// Releasing replaced peer mappings on a real GPU, on a ring (send to rank+1, receive from
// rank-1). cuIpcCloseMemHandle waits for all work queued on the importing context, so the
// library closes replaced mappings on its releaser thread; these tests check, with real CUDA
// work queued across the replacement, that
//   * an exchange that replaces a mapping returns while work queued before it is blocked on a
//     flag that is set only after the exchange returns (nvFuser's pipelined loops), and that
//     work still reads the OLD buffer through the OLD mapping, the next step the NEW one;
//   * while the releaser waits for that work, other driver calls and a further exchange (a new
//     allocation: export, open) on the caller's thread are not serialised behind it;
//   * a peer going back to a buffer whose mapping waits for its close gets it back, no reopen;
//   * 200 queued 256 MiB copies do not delay a replacement exchange;
//   * an exporter that frees a buffer its peer still maps never corrupts anything;
// and that no CUDA error is left behind and the context stays usable.
//
// The flag lives in mapped pinned host memory and is set by a plain CPU store, so setting it
// needs no driver call. A watchdog thread sets it after a liveness bound if the test has not:
// a test that would otherwise hang fails with a message naming what did not return.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.hpp"

namespace nvfipc_gpu {
namespace {

// Bound after which the watchdog releases gated work (far below the exchange timeout, which
// gpu-check sets to 120 s, and far above any sane exchange).
constexpr auto kWatchdog = std::chrono::seconds(20);


// These tests' caches keep no replaced mapping for reuse (ScopedCache(scope, 0)), so every
// replacement releases the old mapping and exercises the releaser.

// A 32-bit flag in mapped pinned host memory: the GPU waits on it, the CPU sets it.
class HostFlag {
 public:
  HostFlag() {
    if (cudaHostAlloc(reinterpret_cast<void**>(&host_), 64, cudaHostAllocMapped) != cudaSuccess) {
      host_ = nullptr;
      return;
    }
    __atomic_store_n(host_, 0u, __ATOMIC_SEQ_CST);
    void* dev = nullptr;
    if (cudaHostGetDevicePointer(&dev, host_, 0) == cudaSuccess) {
      dev_ = reinterpret_cast<CUdeviceptr>(dev);
    }
  }
  ~HostFlag() {
    if (host_) cudaFreeHost(host_);
  }
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;
  bool ok() const { return host_ != nullptr && dev_ != 0; }
  void Set() { __atomic_store_n(host_, 1u, __ATOMIC_SEQ_CST); }
  bool IsSet() const { return __atomic_load_n(host_, __ATOMIC_SEQ_CST) != 0; }
  // Enqueues on `stream` a wait until the flag is set.
  CUresult EnqueueWait(cudaStream_t stream) const {
    return cuStreamWaitValue32(reinterpret_cast<CUstream>(stream), dev_, 1,
                               CU_STREAM_WAIT_VALUE_GEQ);
  }

 private:
  uint32_t* host_ = nullptr;
  CUdeviceptr dev_ = 0;
};

// Sets `flag` after `limit` unless stopped first; remembers whether it had to, and which step
// of the test was running then.
class Watchdog {
 public:
  Watchdog(HostFlag& flag, std::chrono::seconds limit) : flag_(flag) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, limit, [this] { return stopped_; })) {
        fired_ = true;
        fired_step_ = step_.load();
        flag_.Set();
      }
    });
  }
  ~Watchdog() { Stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  bool fired() {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }
  void Step(const char* what) { step_.store(what); }
  // The step that was running when the watchdog fired ("" if it did not).
  std::string fired_step() {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_step_;
  }

 private:
  HostFlag& flag_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  bool fired_ = false;
  std::string fired_step_;
  std::atomic<const char*> step_{"start"};
  std::thread thread_;
};

// Sets a flag when it goes out of scope.
class SetOnExit {
 public:
  explicit SetOnExit(HostFlag& flag) : flag_(flag) {}
  ~SetOnExit() { flag_.Set(); }
  SetOnExit(const SetOnExit&) = delete;
  SetOnExit& operator=(const SetOnExit&) = delete;

 private:
  HostFlag& flag_;
};

int32_t Pattern(int64_t rank, int generation, size_t k) {
  return static_cast<int32_t>(k % 100000) + 100000 * generation + 10000000 * static_cast<int32_t>(rank);
}

void Fill(void* dev, size_t count, int64_t rank, int generation) {
  std::vector<int32_t> v(count);
  for (size_t k = 0; k < count; ++k) v[k] = Pattern(rank, generation, k);
  ASSERT_EQ(cudaMemcpy(dev, v.data(), count * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
}

// Checks `count` ints at `dev` (copied on the legacy default stream) against the pattern.
void ExpectPattern(const void* dev, size_t count, int64_t rank, int generation,
                   const std::string& what) {
  std::vector<int32_t> v(count);
  cudaError_t err = cudaMemcpy(v.data(), dev, count * sizeof(int32_t), cudaMemcpyDeviceToHost);
  ASSERT_EQ(err, cudaSuccess) << what << ": " << cudaGetErrorString(err);
  size_t bad = 0, first = count;
  for (size_t k = 0; k < count; ++k) {
    if (v[k] != Pattern(rank, generation, k)) {
      if (bad++ == 0) first = k;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << count << " values differ from rank "
                     << rank << " generation " << generation << "; first at " << first
                     << ": got " << (first < count ? v[first] : 0) << ", expected "
                     << Pattern(rank, generation, first);
}

// (c): no CUDA error is pending and the context still works.
void ExpectHealthy(const std::string& what) {
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what;
  cudaError_t err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << what << ": " << cudaGetErrorString(err);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << what;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess) << what;
  EXPECT_EQ(cudaMemset(p, 0x5a, 1 << 20), cudaSuccess) << what;
  unsigned char b[4] = {};
  EXPECT_EQ(cudaMemcpy(b, p, sizeof b, cudaMemcpyDeviceToHost), cudaSuccess) << what;
  EXPECT_EQ(b[3], 0x5a) << what;
  EXPECT_EQ(cudaFree(p), cudaSuccess) << what;
  const nvfipc_cuda_ipc_counters c = Counters();
  EXPECT_EQ(c.close_errors, 0u) << what << ": the releaser failed to close a mapping";
}

// Waits (bounded) until every released mapping is closed; checks the balance afterwards.
void ExpectReleasesDrain(const std::string& what) {
  nvfipc_status st = nvfipc_cuda_ipc_flush_releases(30000);
  EXPECT_EQ(st, NVFIPC_STATUS_OK) << what << ": " << Describe(st);
  EXPECT_EQ(Counters().pending_closes, 0u) << what;
}

nvfipc_p2p_handle Get(nvfipc_cache* cache, const nvfipc_request& req) {
  nvfipc_p2p_handle h{};
  nvfipc_status st = nvfipc_cache_get(cache, &req, &h);
  EXPECT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
  return h;
}

TEST(GpuRelease, HostFlagGatesStream) {
  // Precondition of the tests below: a stream waiting on the host flag stays blocked until the
  // CPU sets it. Nothing of the library is involved.
  REQUIRE_RANKS(2);
  HostFlag flag;
  ASSERT_TRUE(flag.ok()) << "cudaHostAlloc(mapped) failed";
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SetOnExit release_on_exit(flag);
  DRV_ASSERT(flag.EnqueueWait(stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the wait on the host flag did not block";
  flag.Set();
  CUDA_ASSERT(SyncStream(stream, "GpuRelease.HostFlagGatesStream"));
  CUDA_ASSERT(cudaStreamDestroy(stream));
  ExpectHealthy("HostFlagGatesStream");
}

TEST(GpuRelease, ReplacementDoesNotWaitForGatedWork) {
  // (a) Every rank queues a copy from its OLD mapping of the left neighbour's buffer behind a
  // wait on a local flag, then every rank moves to a NEW send buffer and exchanges: the
  // exchange releases the OLD mapping while the copy still needs it. It must return before the
  // flag is set; then the copy delivers the OLD data, and the next step the NEW data.
  REQUIRE_RANKS(2);
  const std::string test = "GpuRelease.ReplacementDoesNotWaitForGatedWork";
  constexpr size_t kCount = 1 << 20;  // 4 MiB: allocations of their own
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  const int64_t me = job().rank, left = RecvPeer();
  DeviceBuffer old_send(kBytes), new_send(kBytes), probe_send(kBytes), recv(kBytes),
      probe_recv(kBytes);
  ASSERT_NE(old_send.get(), nullptr);
  ASSERT_NE(new_send.get(), nullptr);
  ASSERT_NE(probe_send.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  ASSERT_NE(probe_recv.get(), nullptr);
  Fill(old_send.get(), kCount, me, 1);
  Fill(new_send.get(), kCount, me, 2);
  Fill(probe_send.get(), kCount, me, 3);
  CUDA_ASSERT(cudaMemset(recv.get(), 0, kBytes));
  CUDA_ASSERT(cudaMemset(probe_recv.get(), 0, kBytes));
  HostFlag flag;
  ASSERT_TRUE(flag.ok());
  cudaStream_t stream = nullptr, side = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_ASSERT(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const nvfipc_cuda_ipc_counters before = Counters();
  {
    ScopedCache cache("release_gated", 0);
    GPU_ASSERT_OK(cache.status());
    // However the test leaves this scope, the gated work is released before the cache's
    // collective free synchronises the device.
    SetOnExit release_on_exit(flag);
    auto batch = [&](void* send) {
      return std::vector<nvfipc_request>{
          Request(SendPeer(), NVFIPC_DIRECTION_SEND, "gated", send, kBytes),
          Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "gated", recv.get(), kBytes)};
    };
    // Another channel, first exchanged while the releaser is blocked: new allocations on both
    // sides, so its exchange exports and opens.
    std::vector<nvfipc_request> probe = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "probe", probe_send.get(), kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "probe", probe_recv.get(), kBytes)};
    auto step1 = batch(old_send.get());
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step1.data(), 2));
    const uint64_t old_peer = Get(cache.get(), step1[1]).peer_ptr;
    ASSERT_NE(old_peer, 0u);
    GPU_ASSERT_OK(Barrier());

    // The gated copy from the OLD mapping.
    DRV_ASSERT(flag.EnqueueWait(stream));
    CUDA_ASSERT(cudaMemcpyAsync(recv.get(), reinterpret_cast<void*>(old_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    Watchdog dog(flag, kWatchdog);

    // The replacement: left's NEW buffer replaces the OLD mapping, whose release is deferred.
    dog.Step("the replacement exchange");
    auto step2 = batch(new_send.get());
    Stopwatch sw;
    nvfipc_status st = nvfipc_exchange_handles(cache.get(), step2.data(), 2);
    const double replace_us = sw.micros();
    PrintTiming(test, "replacement_exchange", replace_us);
    ASSERT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
    EXPECT_FALSE(dog.fired()) << "the replacement exchange returned only after the watchdog set "
                                 "the flag: it waited for device work queued before it ("
                              << dog.fired_step() << ")";
    EXPECT_FALSE(flag.IsSet());
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the gated copy ran early";
    EXPECT_GE(Counters().pending_closes, 1u)
        << "the OLD mapping was closed although a copy queued before its release still needs it";
    const uint64_t new_peer = Get(cache.get(), step2[1]).peer_ptr;
    EXPECT_NE(new_peer, 0u);

    // While the releaser waits for the gated copy, driver calls on this thread and a further
    // exchange with a new allocation (export and open) must not be serialised behind it.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the releaser block
    dog.Step("cudaPointerGetAttributes");
    cudaPointerAttributes attrs{};
    CUDA_ASSERT(cudaPointerGetAttributes(&attrs, probe_send.get()));
    dog.Step("cudaMalloc");
    void* scratch = nullptr;
    CUDA_ASSERT(cudaMalloc(&scratch, 4 << 20));
    dog.Step("cudaMemsetAsync + a wait for it on another stream (if only this step stalls, "
             "the streams may share a hardware queue: CUDA_DEVICE_MAX_CONNECTIONS)");
    CUDA_ASSERT(cudaMemsetAsync(scratch, 1, 4 << 20, side));
    CUDA_ASSERT(SyncStream(side, "GpuRelease side stream"));
    dog.Step("an exchange that exports and opens new allocations");
    sw = Stopwatch();
    st = nvfipc_exchange_handles(cache.get(), probe.data(), 2);
    PrintTiming(test, "exchange_while_releaser_blocked", sw.micros());
    ASSERT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
    dog.Step("done probing");
    const bool serialised = dog.fired();
    EXPECT_FALSE(serialised) << "a call on the caller's thread did not return while the "
                                "releaser waited for queued work (serialised behind it): "
                             << dog.fired_step();
    const uint64_t probe_peer = Get(cache.get(), probe[1]).peer_ptr;
    EXPECT_NE(probe_peer, 0u);

    // Release the gated copy: it must deliver the OLD data through the OLD mapping.
    flag.Set();
    dog.Stop();
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    ExpectPattern(recv.get(), kCount, left, 1, "the gated copy from the OLD mapping");
    GPU_ASSERT_OK(Barrier());

    // The next step, a cache hit, delivers the NEW data through the NEW mapping.
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step2.data(), 2));
    EXPECT_EQ(Get(cache.get(), step2[1]).peer_ptr, new_peer);
    CUDA_ASSERT(cudaMemcpyAsync(recv.get(), reinterpret_cast<void*>(new_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    CUDA_ASSERT(cudaMemcpyAsync(probe_recv.get(), reinterpret_cast<void*>(probe_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    ExpectPattern(recv.get(), kCount, left, 2, "a copy from the NEW mapping");
    ExpectPattern(probe_recv.get(), kCount, left, 3, "a copy on the channel opened meanwhile");
    ExpectReleasesDrain(test);
    CUDA_ASSERT(cudaFree(scratch));
    cache.Free();
  }
  const nvfipc_cuda_ipc_counters after = Counters();
  EXPECT_EQ(after.opens - before.opens, after.closes - before.closes);
  EXPECT_EQ(after.live, before.live);
  CUDA_ASSERT(cudaStreamDestroy(stream));
  CUDA_ASSERT(cudaStreamDestroy(side));
  ExpectHealthy(test);
}

TEST(GpuRelease, GoingBackTakesTheMappingBack) {
  // A peer that goes back to a buffer whose mapping was just released (ping-pong buffers) while
  // work queued before the release still waits on a flag: the exchange takes the mapping back
  // (no new open, same address) instead of waiting for its close, returns before the flag is
  // set, and the gated copy and the next step both read that buffer.
  REQUIRE_RANKS(2);
  const std::string test = "GpuRelease.GoingBackTakesTheMappingBack";
  constexpr size_t kCount = 1 << 20;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  const int64_t me = job().rank, left = RecvPeer();
  DeviceBuffer ping(kBytes), pong(kBytes), recv(kBytes), again(kBytes);
  ASSERT_NE(ping.get(), nullptr);
  ASSERT_NE(pong.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  ASSERT_NE(again.get(), nullptr);
  Fill(ping.get(), kCount, me, 1);
  Fill(pong.get(), kCount, me, 2);
  HostFlag flag;
  ASSERT_TRUE(flag.ok());
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    ScopedCache cache("release_back", 0);
    GPU_ASSERT_OK(cache.status());
    SetOnExit release_on_exit(flag);
    auto batch = [&](void* send) {
      return std::vector<nvfipc_request>{
          Request(SendPeer(), NVFIPC_DIRECTION_SEND, "back", send, kBytes),
          Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "back", recv.get(), kBytes)};
    };
    auto on_ping = batch(ping.get()), on_pong = batch(pong.get());
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), on_ping.data(), 2));
    const uint64_t ping_peer = Get(cache.get(), on_ping[1]).peer_ptr;
    ASSERT_NE(ping_peer, 0u);
    GPU_ASSERT_OK(Barrier());
    DRV_ASSERT(flag.EnqueueWait(stream));
    CUDA_ASSERT(cudaMemcpyAsync(recv.get(), reinterpret_cast<void*>(ping_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    Watchdog dog(flag, kWatchdog);
    dog.Step("the exchange moving to pong");
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), on_pong.data(), 2));
    EXPECT_GE(Counters().pending_closes, 1u) << "the ping mapping should wait for its close";
    const uint64_t opens = Counters().opens;
    dog.Step("the exchange going back to ping");
    Stopwatch sw;
    nvfipc_status st = nvfipc_exchange_handles(cache.get(), on_ping.data(), 2);
    PrintTiming(test, "exchange_going_back", sw.micros());
    ASSERT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
    EXPECT_FALSE(dog.fired()) << "going back waited for the close of the old mapping ("
                              << dog.fired_step() << ")";
    EXPECT_EQ(Get(cache.get(), on_ping[1]).peer_ptr, ping_peer) << "the mapping was not taken back";
    EXPECT_EQ(Counters().opens, opens) << "going back opened the buffer again";
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the gated copy ran early";
    flag.Set();
    dog.Stop();
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    ExpectPattern(recv.get(), kCount, left, 1, "the gated copy from the ping mapping");
    GPU_ASSERT_OK(Barrier());
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), on_ping.data(), 2));
    CUDA_ASSERT(cudaMemcpyAsync(again.get(), reinterpret_cast<void*>(ping_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    ExpectPattern(again.get(), kCount, left, 1, "a copy after going back");
    ExpectReleasesDrain(test);
    cache.Free();
  }
  CUDA_ASSERT(cudaStreamDestroy(stream));
  ExpectHealthy(test);
}

TEST(GpuRelease, QueuedCopiesDoNotDelayReplacement) {
  // (b) 200 unrelated 256 MiB device copies queued, then a copy from the OLD mapping, then a
  // replacement exchange: it must return while the copies still run, and the copy queued behind
  // them still reads the OLD data.
  REQUIRE_RANKS(2);
  const std::string test = "GpuRelease.QueuedCopiesDoNotDelayReplacement";
  constexpr size_t kBig = size_t{256} << 20;
  constexpr int kCopies = 200;
  constexpr size_t kCount = 1 << 20;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  const int64_t me = job().rank, left = RecvPeer();
  DeviceBuffer src(kBig), dst(kBig), old_send(kBytes), new_send(kBytes), recv(kBytes);
  ASSERT_NE(src.get(), nullptr);
  ASSERT_NE(dst.get(), nullptr);
  ASSERT_NE(old_send.get(), nullptr);
  ASSERT_NE(new_send.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  CUDA_ASSERT(cudaMemset(src.get(), 3, kBig));
  CUDA_ASSERT(cudaDeviceSynchronize());
  Fill(old_send.get(), kCount, me, 1);
  Fill(new_send.get(), kCount, me, 2);
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    ScopedCache cache("release_copies", 0);
    GPU_ASSERT_OK(cache.status());
    std::vector<nvfipc_request> step1 = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "copies", old_send.get(), kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "copies", recv.get(), kBytes)};
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step1.data(), 2));
    const uint64_t old_peer = Get(cache.get(), step1[1]).peer_ptr;
    ASSERT_NE(old_peer, 0u);
    GPU_ASSERT_OK(Barrier());
    Stopwatch copies;
    for (int i = 0; i < kCopies; ++i)
      CUDA_ASSERT(cudaMemcpyAsync(dst.get(), src.get(), kBig, cudaMemcpyDeviceToDevice, stream));
    CUDA_ASSERT(cudaMemcpyAsync(recv.get(), reinterpret_cast<void*>(old_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    PrintTiming(test, "enqueue_200_copies", copies.micros());
    std::vector<nvfipc_request> step2 = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "copies", new_send.get(), kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "copies", recv.get(), kBytes)};
    Stopwatch sw;
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step2.data(), 2));
    const double replace_us = sw.micros();
    const bool still_copying = cudaStreamQuery(stream) == cudaErrorNotReady;
    PrintTiming(test, "replacement_exchange", replace_us);
    EXPECT_TRUE(still_copying) << "the queued copies had all finished when the replacement "
                                  "exchange returned (after "
                               << replace_us << " us): it waited for them";
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    PrintTiming(test, "copies_total", copies.micros());
    ExpectPattern(recv.get(), kCount, left, 1, "the copy from the OLD mapping behind 200 copies");
    GPU_ASSERT_OK(Barrier());
    const uint64_t new_peer = Get(cache.get(), step2[1]).peer_ptr;
    CUDA_ASSERT(cudaMemcpyAsync(recv.get(), reinterpret_cast<void*>(new_peer), kBytes,
                                cudaMemcpyDeviceToDevice, stream));
    CUDA_ASSERT(SyncStream(stream, test.c_str()));
    ExpectPattern(recv.get(), kCount, left, 2, "a copy from the NEW mapping");
    ExpectReleasesDrain(test);
    cache.Free();
  }
  CUDA_ASSERT(cudaStreamDestroy(stream));
  ExpectHealthy(test);
}

TEST(GpuRelease, ExporterFreesMappedBuffer) {
  // (d) Every rank frees (cudaFree) the buffer its right neighbour still maps, then allocates
  // and fills new memory. The library pins nothing in the exporter; the importer must then read
  // the OLD contents (the driver keeps a mapped allocation alive) or get an error, and its writes
  // through the mapping must never reach the exporter's new allocations. Runs last: an error
  // here could leave the context unusable.
  REQUIRE_RANKS(2);
  const std::string test = "GpuRelease.ExporterFreesMappedBuffer";
  constexpr size_t kCount = size_t{16} << 20;  // 64 MiB
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  constexpr int kFresh = 4;
  const int64_t me = job().rank, left = RecvPeer(), right = SendPeer();
  void* exported = nullptr;
  CUDA_ASSERT(cudaMalloc(&exported, kBytes));
  Fill(exported, kCount, me, 1);
  DeviceBuffer recv(kBytes), next_send(kBytes);
  ASSERT_NE(recv.get(), nullptr);
  ASSERT_NE(next_send.get(), nullptr);
  Fill(next_send.get(), kCount, me, 9);
  std::vector<std::unique_ptr<DeviceBuffer>> fresh;
  {
    ScopedCache cache("release_freed", 0);
    GPU_ASSERT_OK(cache.status());
    std::vector<nvfipc_request> step1 = {
        Request(right, NVFIPC_DIRECTION_SEND, "freed", exported, kBytes),
        Request(left, NVFIPC_DIRECTION_RECV, "freed", recv.get(), kBytes)};
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step1.data(), 2));
    const uint64_t peer = Get(cache.get(), step1[1]).peer_ptr;
    ASSERT_NE(peer, 0u);
    GPU_ASSERT_OK(Barrier());

    CUDA_ASSERT(cudaFree(exported));  // while `right` still maps it
    for (int i = 0; i < kFresh; ++i) {
      fresh.push_back(std::make_unique<DeviceBuffer>(kBytes));
      ASSERT_NE(fresh.back()->get(), nullptr);
      Fill(fresh.back()->get(), kCount, me, 10 + i);
    }
    GPU_ASSERT_OK(Barrier());

    // Read the freed buffer of `left` through the mapping.
    std::vector<int32_t> seen(kCount);
    cudaError_t err =
        cudaMemcpy(seen.data(), reinterpret_cast<void*>(peer), kBytes, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
      std::printf("rank %lld: %s: reading a freed peer buffer failed cleanly: %s\n",
                  static_cast<long long>(me), test.c_str(), cudaGetErrorName(err));
    } else {
      size_t old_values = 0, fresh_values = 0;
      for (size_t k = 0; k < kCount; ++k) {
        if (seen[k] == Pattern(left, 1, k)) ++old_values;
        for (int i = 0; i < kFresh; ++i)
          if (seen[k] == Pattern(left, 10 + i, k)) ++fresh_values;
      }
      std::printf("rank %lld: %s: reading a freed peer buffer gave %zu of %zu old values, %zu of "
                  "the exporter's new allocations\n",
                  static_cast<long long>(me), test.c_str(), old_values, kCount, fresh_values);
      EXPECT_EQ(fresh_values, 0u) << "the mapping of a freed buffer shows the exporter's NEW "
                                     "allocations: memory corruption across processes";
      EXPECT_EQ(old_values, kCount) << "the mapping of a freed buffer changed contents";
      // Writes through the mapping must not reach the exporter's new allocations.
      err = cudaMemset(reinterpret_cast<void*>(peer), 0xee, kBytes);
      EXPECT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    GPU_ASSERT_OK(Barrier());
    for (int i = 0; i < kFresh; ++i)
      ExpectPattern(fresh[i]->get(), kCount, me, 10 + i,
                    "a new allocation made after freeing an exported buffer");
    GPU_ASSERT_OK(Barrier());
    // Replacing the freed buffer releases the mapping of it (closed by the releaser).
    std::vector<nvfipc_request> step2 = {
        Request(right, NVFIPC_DIRECTION_SEND, "freed", next_send.get(), kBytes),
        Request(left, NVFIPC_DIRECTION_RECV, "freed", recv.get(), kBytes)};
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), step2.data(), 2));
    const uint64_t next_peer = Get(cache.get(), step2[1]).peer_ptr;
    CUDA_ASSERT(cudaMemcpy(recv.get(), reinterpret_cast<void*>(next_peer), kBytes,
                           cudaMemcpyDeviceToDevice));
    ExpectPattern(recv.get(), kCount, left, 9, "a copy from the replacement of a freed buffer");
    ExpectReleasesDrain(test);
    cache.Free();
  }
  ExpectHealthy(test);
}

}  // namespace
}  // namespace nvfipc_gpu
