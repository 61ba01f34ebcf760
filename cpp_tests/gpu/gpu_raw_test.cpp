// The device layer on its own, without the handle cache: buffers exported with
// nvfipc_cuda_ipc_export, handles passed through the job's store, opened with
// nvfipc_cuda_ipc_open (refcounted), and transfers driven by the stream-ordered P2P primitives
// with epoch-valued semaphores. Mirrors nvFuser's MultiDeviceTest.ShareIpcMemHandles and
// P2PCommunicationTest.CudaComm on a ring (send to rank+1, receive from rank-1).
#include <cstring>
#include <string>
#include <vector>

#include "gpu_common.hpp"

namespace nvfipc_gpu {
namespace {

// What a rank publishes about one of its buffers.
struct Published {
  nvfipc_cuda_ipc_handle handle{};
  uint64_t offset;
  uint64_t bytes;
};

std::string Key(const std::string& test, const std::string& what, int64_t rank) {
  return "gpu_raw/" + test + "/" + what + "/" + std::to_string(rank);
}

nvfipc_status Publish(const std::string& key, const void* ptr, uint64_t bytes) {
  Published p{};
  nvfipc_status st = nvfipc_cuda_ipc_export(ptr, bytes, &p.handle, &p.offset);
  if (st != NVFIPC_STATUS_OK) return st;
  p.bytes = bytes;
  return Put(key, &p, sizeof p);
}

// A peer buffer opened through IPC; closed at scope exit.
struct PeerBuffer {
  int64_t peer = -1;
  Published rec{};
  uint64_t base = 0;
  bool open = false;
  uint64_t ptr() const { return base + rec.offset; }
  nvfipc_status Open(const std::string& key, int64_t from) {
    peer = from;
    nvfipc_status st = Get(key, &rec, sizeof rec);
    if (st != NVFIPC_STATUS_OK) return st;
    st = nvfipc_cuda_ipc_open(peer, &rec.handle, &base);
    open = st == NVFIPC_STATUS_OK;
    return st;
  }
  nvfipc_status Close() {
    if (!open) return NVFIPC_STATUS_OK;
    open = false;
    return nvfipc_cuda_ipc_close(peer, &rec.handle);
  }
  ~PeerBuffer() { Close(); }
};

TEST(GpuRaw, ShareIpcMemHandlesPut) {
  REQUIRE_RANKS(2);
  const std::string test = "share";
  const int64_t me = job().rank;
  const nvfipc_cuda_ipc_counters before = Counters();
  {
    DeviceBuffer send(4 * sizeof(int32_t)), recv(4 * sizeof(int32_t));
    ASSERT_NE(send.get(), nullptr);
    ASSERT_NE(recv.get(), nullptr);
    GPU_ASSERT_OK(Publish(Key(test, "recv", me), recv.get(), recv.bytes()));

    PeerBuffer peer_recv;
    Stopwatch cold;
    GPU_ASSERT_OK(peer_recv.Open(Key(test, "recv", SendPeer()), SendPeer()));
    PrintTiming("GpuRaw.ShareIpcMemHandlesPut", "cold_get_and_open", cold.micros());

    // A second open of the same handle is deduplicated: same base, no driver call.
    uint64_t again = 0;
    Stopwatch warm;
    GPU_ASSERT_OK(nvfipc_cuda_ipc_open(SendPeer(), &peer_recv.rec.handle, &again));
    PrintTiming("GpuRaw.ShareIpcMemHandlesPut", "warm_open", warm.micros());
    EXPECT_EQ(again, peer_recv.base);
    GPU_ASSERT_OK(nvfipc_cuda_ipc_close(SendPeer(), &peer_recv.rec.handle));

    for (int i = 0; i < 10; ++i) {
      int32_t values[4];
      for (int k = 0; k < 4; ++k) values[k] = k + 10 * (i + 1) + 100 * static_cast<int32_t>(me);
      CUDA_ASSERT(cudaMemcpy(send.get(), values, sizeof values, cudaMemcpyHostToDevice));
      // A put into the receiver's buffer through the peer pointer.
      CUDA_ASSERT(cudaMemcpy(reinterpret_cast<void*>(peer_recv.ptr()), send.get(), sizeof values,
                             cudaMemcpyDeviceToDevice));
      CUDA_ASSERT(cudaDeviceSynchronize());
      GPU_ASSERT_OK(Barrier());
      int32_t got[4];
      CUDA_ASSERT(cudaMemcpy(got, recv.get(), sizeof got, cudaMemcpyDeviceToHost));
      for (int k = 0; k < 4; ++k) {
        EXPECT_EQ(got[k], k + 10 * (i + 1) + 100 * static_cast<int32_t>(RecvPeer()))
            << "repetition " << i << " element " << k;
      }
      GPU_ASSERT_OK(Barrier());  // nobody puts the next values before everyone has checked
    }
    GPU_ASSERT_OK(peer_recv.Close());
    GPU_ASSERT_OK(Barrier());  // peers close before the exporters free
  }
  const nvfipc_cuda_ipc_counters after = Counters();
  EXPECT_EQ(after.opens - before.opens, 1u) << "one real open per peer allocation";
  EXPECT_EQ(after.opens - before.opens, after.closes - before.closes);
  EXPECT_EQ(after.live, before.live);
}

// Both channels of a ring rank: the send channel to rank+1 and the receive channel from rank-1.
class RawRing {
 public:
  static constexpr size_t kSendSlot = 0;   // byte offset of the send channel's semaphore
  static constexpr size_t kRecvSlot = 64;  // byte offset of the receive channel's semaphore

  RawRing(const std::string& test, size_t bytes)
      : test_(test), bytes_(bytes), send_(bytes), recv_(bytes), sems_(256) {}

  // Allocates, zeroes the semaphores before export, publishes, opens the peers' buffers.
  void SetUp() {
    ASSERT_NE(send_.get(), nullptr);
    ASSERT_NE(recv_.get(), nullptr);
    ASSERT_NE(sems_.get(), nullptr);
    CUDA_ASSERT(cudaMemset(sems_.get(), 0, sems_.bytes()));
    CUDA_ASSERT(cudaDeviceSynchronize());
    const int64_t me = job().rank;
    GPU_ASSERT_OK(Publish(Key(test_, "send", me), send_.get(), bytes_));
    GPU_ASSERT_OK(Publish(Key(test_, "recv", me), recv_.get(), bytes_));
    GPU_ASSERT_OK(Publish(Key(test_, "sems", me), sems_.get(), sems_.bytes()));
    Stopwatch cold;
    GPU_ASSERT_OK(peer_send_.Open(Key(test_, "send", RecvPeer()), RecvPeer()));
    GPU_ASSERT_OK(peer_recv_.Open(Key(test_, "recv", SendPeer()), SendPeer()));
    GPU_ASSERT_OK(recv_peer_sems_.Open(Key(test_, "sems", RecvPeer()), RecvPeer()));
    GPU_ASSERT_OK(send_peer_sems_.Open(Key(test_, "sems", SendPeer()), SendPeer()));
    PrintTiming(test_, "cold_exchange_4_opens", cold.micros());

    send_ep_.local_ptr = send_.addr();
    send_ep_.local_bytes = bytes_;
    send_ep_.local_semaphore = sems_.addr() + kSendSlot;
    send_ep_.peer_ptr = peer_recv_.ptr();
    send_ep_.peer_bytes = bytes_;
    send_ep_.peer_semaphore = send_peer_sems_.ptr() + kRecvSlot;

    recv_ep_.local_ptr = recv_.addr();
    recv_ep_.local_bytes = bytes_;
    recv_ep_.local_semaphore = sems_.addr() + kRecvSlot;
    recv_ep_.peer_ptr = peer_send_.ptr();
    recv_ep_.peer_bytes = bytes_;
    recv_ep_.peer_semaphore = recv_peer_sems_.ptr() + kSendSlot;
  }

  // Closes the peers' buffers; the exporters free theirs after the next barrier.
  void TearDown() {
    GPU_EXPECT_OK(peer_send_.Close());
    GPU_EXPECT_OK(peer_recv_.Close());
    GPU_EXPECT_OK(recv_peer_sems_.Close());
    GPU_EXPECT_OK(send_peer_sems_.Close());
  }

  void* send() const { return send_.get(); }
  void* recv() const { return recv_.get(); }
  const nvfipc_p2p_endpoint* send_ep() const { return &send_ep_; }
  const nvfipc_p2p_endpoint* recv_ep() const { return &recv_ep_; }

 private:
  std::string test_;
  size_t bytes_;
  DeviceBuffer send_, recv_, sems_;
  PeerBuffer peer_send_, peer_recv_, recv_peer_sems_, send_peer_sems_;
  nvfipc_p2p_endpoint send_ep_{}, recv_ep_{};
};

TEST(GpuRaw, CudaCommSemaphores) {
  REQUIRE_RANKS(2);
  const std::string test = "GpuRaw.CudaCommSemaphores";
  constexpr int kCount = 8;
  constexpr size_t kBytes = kCount * sizeof(float);
  const int64_t me = job().rank;
  const nvfipc_cuda_ipc_counters before = Counters();
  {
    RawRing ring("cudacomm", kBytes);
    ring.SetUp();
    if (HasFatalFailure()) return;
    GPU_ASSERT_OK(Barrier());  // every semaphore is zero before anyone signals

    cudaStream_t stream = nullptr;
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float* host = nullptr;
    CUDA_ASSERT(cudaMallocHost(&host, 2 * kBytes));
    float* out = host + kCount;

    // Phase 1: lockstep, 32 repetitions, the host checks after each.
    uint64_t transfer = 0;
    Stopwatch lockstep;
    for (int i = 0; i < 32; ++i) {
      for (int k = 0; k < kCount; ++k) host[k] = k + 10.0f * i + 100.0f * me;
      CUDA_ASSERT(cudaMemcpyAsync(ring.send(), host, kBytes, cudaMemcpyHostToDevice, stream));
      ++transfer;
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_send_post(ring.send_ep(), transfer, stream));
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_recv_post(ring.recv_ep(), transfer, kBytes, stream));
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_send_wait(ring.send_ep(), transfer, stream));
      CUDA_ASSERT(cudaMemcpyAsync(out, ring.recv(), kBytes, cudaMemcpyDeviceToHost, stream));
      CUDA_ASSERT(SyncStream(stream, "GpuRaw.CudaCommSemaphores lockstep"));
      for (int k = 0; k < kCount; ++k) {
        EXPECT_EQ(out[k], k + 10.0f * i + 100.0f * RecvPeer())
            << "repetition " << i << " element " << k;
      }
    }
    PrintTiming(test, "lockstep_per_transfer", lockstep.micros() / 32);

    // Phase 2: run ahead. All 32 transfers are enqueued before the host waits once; inputs and
    // outputs live in device arrays. Transfer numbers continue where phase 1 stopped.
    DeviceBuffer inputs(32 * kBytes), outputs(32 * kBytes);
    ASSERT_NE(inputs.get(), nullptr);
    ASSERT_NE(outputs.get(), nullptr);
    std::vector<float> all(32 * kCount);
    for (int i = 0; i < 32; ++i)
      for (int k = 0; k < kCount; ++k) all[i * kCount + k] = k + 10.0f * (i + 32) + 100.0f * me;
    CUDA_ASSERT(cudaMemcpy(inputs.get(), all.data(), 32 * kBytes, cudaMemcpyHostToDevice));
    Stopwatch ahead;
    for (int i = 0; i < 32; ++i) {
      char* in = static_cast<char*>(inputs.get()) + i * kBytes;
      char* res = static_cast<char*>(outputs.get()) + i * kBytes;
      CUDA_ASSERT(cudaMemcpyAsync(ring.send(), in, kBytes, cudaMemcpyDeviceToDevice, stream));
      ++transfer;
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_send_post(ring.send_ep(), transfer, stream));
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_recv_post(ring.recv_ep(), transfer, kBytes, stream));
      CUDA_ASSERT(cudaMemcpyAsync(res, ring.recv(), kBytes, cudaMemcpyDeviceToDevice, stream));
      GPU_ASSERT_OK(nvfipc_cuda_endpoint_send_wait(ring.send_ep(), transfer, stream));
    }
    double enqueue_us = ahead.micros();
    CUDA_ASSERT(SyncStream(stream, "GpuRaw.CudaCommSemaphores run-ahead"));
    PrintTiming(test, "run_ahead_enqueue_per_transfer", enqueue_us / 32);
    PrintTiming(test, "run_ahead_total_per_transfer", ahead.micros() / 32);
    CUDA_ASSERT(cudaMemcpy(all.data(), outputs.get(), 32 * kBytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; ++i)
      for (int k = 0; k < kCount; ++k)
        EXPECT_EQ(all[i * kCount + k], k + 10.0f * (i + 32) + 100.0f * RecvPeer())
            << "run-ahead repetition " << i << " element " << k;

    CUDA_ASSERT(cudaFreeHost(host));
    CUDA_ASSERT(cudaStreamDestroy(stream));
    GPU_ASSERT_OK(Barrier());  // all streams drained before anyone closes
    ring.TearDown();
    GPU_ASSERT_OK(Barrier());  // peers closed before the exporters free
  }
  const nvfipc_cuda_ipc_counters after = Counters();
  EXPECT_EQ(after.opens - before.opens, after.closes - before.closes);
  EXPECT_EQ(after.live, before.live);
  // Four distinct peer allocations per rank, or three when both neighbours are one rank (the
  // semaphore block of that rank is then opened once and referenced twice).
  EXPECT_EQ(after.opens - before.opens, job().world == 2 ? 3u : 4u);
}

TEST(GpuRaw, OwnHandleResolvesLocally) {
  // A handle exported by this very process cannot be opened by the driver; the library maps it
  // to the local allocation instead of failing or crashing.
  DeviceBuffer buf(256);
  ASSERT_NE(buf.get(), nullptr);
  Published p{};
  GPU_ASSERT_OK(nvfipc_cuda_ipc_export(buf.get(), 256, &p.handle, &p.offset));
  uint64_t base = 0;
  const nvfipc_cuda_ipc_counters before = Counters();
  GPU_ASSERT_OK(nvfipc_cuda_ipc_open(job().rank, &p.handle, &base));
  EXPECT_EQ(base, buf.addr());
  GPU_EXPECT_OK(nvfipc_cuda_ipc_close(job().rank, &p.handle));
  nvfipc_status st = nvfipc_cuda_ipc_close(job().rank, &p.handle);
  EXPECT_EQ(st, NVFIPC_STATUS_NOT_FOUND) << Describe(st);
  EXPECT_EQ(Counters().opens, before.opens);
}

}  // namespace
}  // namespace nvfipc_gpu
