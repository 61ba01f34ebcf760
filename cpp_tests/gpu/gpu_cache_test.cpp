// The handle cache on a real GPU, on a ring (send to rank+1, receive from rank-1):
// nvFuser's ShareIpcMemHandles and CudaComm through nvfipc_exchange_handles / nvfipc_cache_get /
// nvfipc_cuda_p2p_*, the seed's re-export race, asymmetric buffer changes, the zero-store-traffic
// cache hit, balanced opens and closes after teardown, and bad pointers.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.hpp"

namespace nvfipc_gpu {
namespace {

nvfipc_cache_counters Stats(const nvfipc_cache* cache) {
  nvfipc_cache_counters s{};
  nvfipc_status st = nvfipc_cache_stats(cache, &s);
  EXPECT_EQ(st, NVFIPC_STATUS_OK) << Describe(st);
  return s;
}


TEST(GpuCache, ShareIpcMemHandles) {
  REQUIRE_RANKS(2);
  const std::string test = "GpuCache.ShareIpcMemHandles";
  const int64_t me = job().rank;
  DeviceBuffer send(4 * sizeof(int32_t)), recv(4 * sizeof(int32_t));
  ASSERT_NE(send.get(), nullptr);
  ASSERT_NE(recv.get(), nullptr);
  int32_t memory = -1;
  GPU_ASSERT_OK(nvfipc_cuda_pointer_memory(send.get(), send.bytes(), &memory));
  EXPECT_EQ(memory, VmmBuffers() ? NVFIPC_DEVICE_MEMORY_VMM : NVFIPC_DEVICE_MEMORY_LEGACY);
  ScopedCache cache("share");
  GPU_ASSERT_OK(cache.status());
  nvfipc_request batch[2] = {
      Request(SendPeer(), NVFIPC_DIRECTION_SEND, "share", send.get(), send.bytes()),
      Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "share", recv.get(), recv.bytes()),
  };
  uint64_t round_trips_after_first = 0;
  for (int i = 0; i < 10; ++i) {
    int32_t values[4];
    for (int k = 0; k < 4; ++k) values[k] = k + 10 * (i + 1) + 100 * static_cast<int32_t>(me);
    CUDA_ASSERT(cudaMemcpy(send.get(), values, sizeof values, cudaMemcpyHostToDevice));
    Stopwatch sw;
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), batch, 2));
    PrintTiming(test, i == 0 ? "exchange_cold" : "exchange_warm", sw.micros());
    if (i == 0) round_trips_after_first = Stats(cache.get()).store_round_trips;

    nvfipc_p2p_handle h{};
    GPU_ASSERT_OK(nvfipc_cache_get(cache.get(), &batch[0], &h));
    ASSERT_EQ(h.local_ptr, send.addr());
    ASSERT_NE(h.peer_ptr, 0u);
    CUDA_ASSERT(cudaMemcpy(reinterpret_cast<void*>(h.peer_ptr),
                           reinterpret_cast<void*>(h.local_ptr), sizeof values,
                           cudaMemcpyDeviceToDevice));
    CUDA_ASSERT(cudaDeviceSynchronize());
    GPU_ASSERT_OK(Barrier());
    int32_t got[4];
    CUDA_ASSERT(cudaMemcpy(got, recv.get(), sizeof got, cudaMemcpyDeviceToHost));
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(got[k], k + 10 * (i + 1) + 100 * static_cast<int32_t>(RecvPeer()))
          << "repetition " << i << " element " << k;
    GPU_ASSERT_OK(Barrier());
  }
  const nvfipc_cache_counters s = Stats(cache.get());
  EXPECT_EQ(s.exchanges, 10u);
  EXPECT_EQ(s.store_round_trips, round_trips_after_first)
      << "cache hits must not touch the store";
  EXPECT_LE(round_trips_after_first, 2u) << "a miss costs at most a multi-set and a multi-get";
  EXPECT_EQ(s.hits, 2u * 9u);
}

TEST(GpuCache, CudaComm) {
  REQUIRE_RANKS(2);
  const std::string test = "GpuCache.CudaComm";
  constexpr int kCount = 8;
  constexpr size_t kBytes = kCount * sizeof(float);
  const int64_t me = job().rank;
  const nvfipc_cuda_ipc_counters before = Counters();
  {
    DeviceBuffer send(kBytes), recv(kBytes);
    ASSERT_NE(send.get(), nullptr);
    ASSERT_NE(recv.get(), nullptr);
    ScopedCache cache("cudacomm");
    GPU_ASSERT_OK(cache.status());
    nvfipc_request batch[2] = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "comm", send.get(), kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "comm", recv.get(), kBytes),
    };
    cudaStream_t stream = nullptr;
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float* host = nullptr;
    CUDA_ASSERT(cudaMallocHost(&host, 2 * kBytes));
    float* out = host + kCount;
    double warm_total = 0;
    for (int i = 0; i < 32; ++i) {
      for (int k = 0; k < kCount; ++k) host[k] = k + 10.0f * i + 100.0f * me;
      CUDA_ASSERT(cudaMemcpyAsync(send.get(), host, kBytes, cudaMemcpyHostToDevice, stream));
      Stopwatch sw;
      GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), batch, 2));
      double us = sw.micros();
      if (i == 0) {
        PrintTiming(test, "exchange_cold", us);
      } else {
        warm_total += us;
      }
      GPU_ASSERT_OK(nvfipc_cuda_p2p_send_post(cache.get(), &batch[0], stream));
      GPU_ASSERT_OK(nvfipc_cuda_p2p_recv_post(cache.get(), &batch[1], kBytes, stream));
      GPU_ASSERT_OK(nvfipc_cuda_p2p_send_wait(cache.get(), &batch[0], stream));
      CUDA_ASSERT(cudaMemcpyAsync(out, recv.get(), kBytes, cudaMemcpyDeviceToHost, stream));
      CUDA_ASSERT(SyncStream(stream, "GpuCache.CudaComm"));
      for (int k = 0; k < kCount; ++k)
        EXPECT_EQ(out[k], k + 10.0f * i + 100.0f * RecvPeer())
            << "repetition " << i << " element " << k;
    }
    PrintTiming(test, "exchange_warm_avg", warm_total / 31);
    const nvfipc_cache_counters s = Stats(cache.get());
    EXPECT_EQ(s.hits, 2u * 31u);
    CUDA_ASSERT(cudaFreeHost(host));
    CUDA_ASSERT(cudaStreamDestroy(stream));
    cache.Free();
  }
  const nvfipc_cuda_ipc_counters after = Counters();
  EXPECT_EQ(after.opens - before.opens, after.closes - before.closes)
      << "every IPC open is closed when the cache is freed";
  EXPECT_EQ(after.live, before.live);
}

// One step of a ring transfer through the cache on `stream`, checked on the host.
void RingStep(nvfipc_cache* cache, nvfipc_request* batch, void* send, void* recv, int step,
              cudaStream_t stream, const std::string& what) {
  constexpr int kCount = 16;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  int32_t values[kCount], got[kCount];
  for (int k = 0; k < kCount; ++k) values[k] = k + 1000 * step + 100 * static_cast<int32_t>(job().rank);
  CUDA_ASSERT(cudaMemcpyAsync(send, values, kBytes, cudaMemcpyHostToDevice, stream));
  CUDA_ASSERT(SyncStream(stream, what.c_str()));  // `values` is pageable and local
  GPU_ASSERT_OK(nvfipc_exchange_handles(cache, batch, 2));
  nvfipc_p2p_handle h{};
  GPU_ASSERT_OK(nvfipc_cache_get(cache, &batch[1], &h));
  ASSERT_EQ(h.local_ptr, reinterpret_cast<uint64_t>(recv)) << what << " step " << step;
  GPU_ASSERT_OK(nvfipc_cuda_p2p_send_post(cache, &batch[0], stream));
  GPU_ASSERT_OK(nvfipc_cuda_p2p_recv_post(cache, &batch[1], kBytes, stream));
  GPU_ASSERT_OK(nvfipc_cuda_p2p_send_wait(cache, &batch[0], stream));
  CUDA_ASSERT(cudaMemcpyAsync(got, recv, kBytes, cudaMemcpyDeviceToHost, stream));
  CUDA_ASSERT(SyncStream(stream, what.c_str()));
  for (int k = 0; k < kCount; ++k)
    EXPECT_EQ(got[k], k + 1000 * step + 100 * static_cast<int32_t>(RecvPeer()))
        << what << " step " << step << " element " << k;
}

TEST(GpuCache, SeedRaceReexportBeforeImport) {
  // Every step uses new buffers on every rank, so every exchange re-exports, and there is no
  // barrier between steps; rank 0 lags at times so its neighbours run a step ahead and publish
  // their next export before rank 0 has read the previous one (the upstream race).
  REQUIRE_RANKS(2);
  constexpr size_t kBytes = 16 * sizeof(int32_t);
  constexpr int kSteps = 6;
  std::vector<std::unique_ptr<DeviceBuffer>> keep;  // buffers stay alive until teardown
  ScopedCache cache("seedrace");
  GPU_ASSERT_OK(cache.status());
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int step = 0; step < kSteps; ++step) {
    keep.push_back(std::make_unique<DeviceBuffer>(kBytes));
    void* send = keep.back()->get();
    keep.push_back(std::make_unique<DeviceBuffer>(kBytes));
    void* recv = keep.back()->get();
    ASSERT_NE(send, nullptr);
    ASSERT_NE(recv, nullptr);
    nvfipc_request batch[2] = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "race", send, kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "race", recv, kBytes),
    };
    if (job().rank == 0 && step % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Stopwatch sw;
    RingStep(cache.get(), batch, send, recv, step, stream, "seed race");
    if (HasFatalFailure()) break;
    PrintTiming("GpuCache.SeedRaceReexportBeforeImport", "miss_step_with_transfer", sw.micros());
  }
  const nvfipc_cache_counters s = Stats(cache.get());
  EXPECT_EQ(s.misses, 2u * kSteps);
  CUDA_ASSERT(cudaStreamDestroy(stream));
  cache.Free();
}

TEST(GpuCache, AsymmetricMiss) {
  // Even ranks move their send buffer every other step; odd ranks never change theirs. Every
  // step must still deliver the current data through current handles, without a hang.
  REQUIRE_RANKS(2);
  constexpr size_t kBytes = 16 * sizeof(int32_t);
  constexpr int kSteps = 8;
  const bool mover = job().rank % 2 == 0;
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  keep.push_back(std::make_unique<DeviceBuffer>(kBytes));
  void* send = keep.back()->get();
  DeviceBuffer recv(kBytes);
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv.get(), nullptr);
  ScopedCache cache("asymmetric");
  GPU_ASSERT_OK(cache.status());
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int step = 0; step < kSteps; ++step) {
    if (mover && step > 0 && step % 2 == 0) {
      keep.push_back(std::make_unique<DeviceBuffer>(kBytes));
      send = keep.back()->get();
      ASSERT_NE(send, nullptr);
    }
    nvfipc_request batch[2] = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "asym", send, kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "asym", recv.get(), kBytes),
    };
    Stopwatch sw;
    RingStep(cache.get(), batch, send, recv.get(), step, stream, "asymmetric");
    if (HasFatalFailure()) break;
    PrintTiming("GpuCache.AsymmetricMiss", step % 2 == 0 ? "even_step" : "odd_step", sw.micros());
  }
  const nvfipc_cache_counters s = Stats(cache.get());
  EXPECT_GT(s.misses, 0u);
  EXPECT_GT(s.hits, 0u);
  CUDA_ASSERT(cudaStreamDestroy(stream));
  cache.Free();
}

TEST(GpuCache, DuplicatePairsAndReorderedBatch) {
  // Three channels with the same tag between each pair of neighbours in one batch; odd ranks
  // list their receives first. Channels pair up by their order among equal (peer, direction,
  // tag) requests, whatever the order of the batch.
  REQUIRE_RANKS(2);
  constexpr int kChannels = 3;
  constexpr int kCount = 8;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  const int64_t me = job().rank;
  std::vector<std::unique_ptr<DeviceBuffer>> sends, recvs;
  for (int j = 0; j < kChannels; ++j) {
    sends.push_back(std::make_unique<DeviceBuffer>(kBytes));
    recvs.push_back(std::make_unique<DeviceBuffer>(kBytes));
    ASSERT_NE(sends.back()->get(), nullptr);
    ASSERT_NE(recvs.back()->get(), nullptr);
  }
  ScopedCache cache("duplicates");
  GPU_ASSERT_OK(cache.status());
  std::vector<nvfipc_request> send_reqs, recv_reqs, batch;
  for (int j = 0; j < kChannels; ++j) {
    send_reqs.push_back(Request(SendPeer(), NVFIPC_DIRECTION_SEND, "dup", sends[j]->get(), kBytes));
    recv_reqs.push_back(Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "dup", recvs[j]->get(), kBytes));
  }
  if (me % 2 == 1) {
    batch.insert(batch.end(), recv_reqs.begin(), recv_reqs.end());
    batch.insert(batch.end(), send_reqs.begin(), send_reqs.end());
  } else {
    for (int j = 0; j < kChannels; ++j) {
      batch.push_back(send_reqs[j]);
      batch.push_back(recv_reqs[j]);
    }
  }
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int step = 0; step < 3; ++step) {
    for (int j = 0; j < kChannels; ++j) {
      int32_t values[kCount];
      for (int k = 0; k < kCount; ++k)
        values[k] = k + 10 * j + 1000 * step + 100000 * static_cast<int32_t>(me);
      CUDA_ASSERT(cudaMemcpy(sends[j]->get(), values, kBytes, cudaMemcpyHostToDevice));
    }
    GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), batch.data(), batch.size()));
    for (int j = 0; j < kChannels; ++j)
      GPU_ASSERT_OK(nvfipc_cuda_p2p_send_post(cache.get(), &send_reqs[j], stream));
    for (int j = kChannels - 1; j >= 0; --j)
      GPU_ASSERT_OK(nvfipc_cuda_p2p_recv_post(cache.get(), &recv_reqs[j], kBytes, stream));
    for (int j = 0; j < kChannels; ++j)
      GPU_ASSERT_OK(nvfipc_cuda_p2p_send_wait(cache.get(), &send_reqs[j], stream));
    CUDA_ASSERT(SyncStream(stream, "GpuCache.DuplicatePairsAndReorderedBatch"));
    for (int j = 0; j < kChannels; ++j) {
      int32_t got[kCount];
      CUDA_ASSERT(cudaMemcpy(got, recvs[j]->get(), kBytes, cudaMemcpyDeviceToHost));
      for (int k = 0; k < kCount; ++k)
        EXPECT_EQ(got[k], k + 10 * j + 1000 * step + 100000 * static_cast<int32_t>(RecvPeer()))
            << "step " << step << " channel " << j << " element " << k;
    }
  }
  const nvfipc_cache_counters s = Stats(cache.get());
  EXPECT_EQ(s.misses, 2u * kChannels);
  EXPECT_EQ(s.hits, 2u * kChannels * 2u);
  CUDA_ASSERT(cudaStreamDestroy(stream));
  cache.Free();
}

TEST(GpuCache, PipelinedRingAllgather) {
  // An allgather around the ring, world-1 forwarding steps enqueued back to back on one stream
  // (no host synchronisation between steps): each step receives the block the left neighbour
  // received in the previous step, straight from its slot of the gathered array.
  REQUIRE_RANKS(2);
  constexpr int kCount = 256;
  constexpr size_t kBytes = kCount * sizeof(float);
  const int64_t world = job().world, me = job().rank;
  DeviceBuffer gathered(world * kBytes);
  ASSERT_NE(gathered.get(), nullptr);
  std::vector<float> mine(kCount);
  for (int k = 0; k < kCount; ++k) mine[k] = static_cast<float>(k + 1000 * me);
  char* base = static_cast<char*>(gathered.get());
  CUDA_ASSERT(cudaMemset(base, 0, world * kBytes));
  CUDA_ASSERT(cudaMemcpy(base + me * kBytes, mine.data(), kBytes, cudaMemcpyHostToDevice));
  ScopedCache cache("ring_allgather");
  GPU_ASSERT_OK(cache.status());
  // Step s forwards block (me - s) to the right and receives block (me - s - 1) from the left.
  std::vector<std::string> tags;
  for (int64_t s = 0; s + 1 < world; ++s) tags.push_back("ag" + std::to_string(s));
  std::vector<nvfipc_request> batch;
  for (int64_t s = 0; s + 1 < world; ++s) {
    int64_t send_block = (me - s + world) % world;
    int64_t recv_block = (me - s - 1 + world) % world;
    batch.push_back(Request(SendPeer(), NVFIPC_DIRECTION_SEND, tags[s].c_str(),
                            base + send_block * kBytes, kBytes));
    batch.push_back(Request(RecvPeer(), NVFIPC_DIRECTION_RECV, tags[s].c_str(),
                            base + recv_block * kBytes, kBytes));
  }
  Stopwatch cold;
  GPU_ASSERT_OK(nvfipc_exchange_handles(cache.get(), batch.data(), batch.size()));
  PrintTiming("GpuCache.PipelinedRingAllgather", "exchange_cold", cold.micros());
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Stopwatch run;
  for (int64_t s = 0; s + 1 < world; ++s) {
    GPU_ASSERT_OK(nvfipc_cuda_p2p_send_post(cache.get(), &batch[2 * s], stream));
    GPU_ASSERT_OK(nvfipc_cuda_p2p_recv_post(cache.get(), &batch[2 * s + 1], kBytes, stream));
  }
  for (int64_t s = 0; s + 1 < world; ++s)
    GPU_ASSERT_OK(nvfipc_cuda_p2p_send_wait(cache.get(), &batch[2 * s], stream));
  CUDA_ASSERT(SyncStream(stream, "GpuCache.PipelinedRingAllgather"));
  PrintTiming("GpuCache.PipelinedRingAllgather", "allgather", run.micros());
  std::vector<float> all(world * kCount);
  CUDA_ASSERT(cudaMemcpy(all.data(), base, world * kBytes, cudaMemcpyDeviceToHost));
  for (int64_t r = 0; r < world; ++r)
    for (int k = 0; k < kCount; ++k)
      ASSERT_EQ(all[r * kCount + k], static_cast<float>(k + 1000 * r)) << "block " << r;
  CUDA_ASSERT(cudaStreamDestroy(stream));
  cache.Free();
}

TEST(GpuCache, OpensEqualClosesAfterTeardown) {
  REQUIRE_RANKS(2);
  constexpr size_t kBytes = 16 * sizeof(int32_t);
  const nvfipc_cuda_ipc_counters before = Counters();
  uint64_t cache_opens = 0, cache_closes = 0;
  {
    DeviceBuffer send(kBytes), recv(kBytes);
    ASSERT_NE(send.get(), nullptr);
    ASSERT_NE(recv.get(), nullptr);
    ScopedCache cache("teardown");
    GPU_ASSERT_OK(cache.status());
    nvfipc_request batch[2] = {
        Request(SendPeer(), NVFIPC_DIRECTION_SEND, "td", send.get(), kBytes),
        Request(RecvPeer(), NVFIPC_DIRECTION_RECV, "td", recv.get(), kBytes),
    };
    cudaStream_t stream = nullptr;
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int step = 0; step < 3; ++step) {
      RingStep(cache.get(), batch, send.get(), recv.get(), step, stream, "teardown");
      if (HasFatalFailure()) break;
    }
    const nvfipc_cache_counters s = Stats(cache.get());
    cache_opens = s.opens;
    EXPECT_GT(s.opens, 0u);
    const nvfipc_cuda_ipc_counters during = Counters();
    EXPECT_GT(during.live, before.live);
    CUDA_ASSERT(cudaStreamDestroy(stream));
    cache.Free();
    (void)cache_closes;
  }
  const nvfipc_cuda_ipc_counters after = Counters();
  std::printf("rank %lld: cache opens %llu; driver opens %llu closes %llu live %llu\n",
              static_cast<long long>(job().rank), static_cast<unsigned long long>(cache_opens),
              static_cast<unsigned long long>(after.opens - before.opens),
              static_cast<unsigned long long>(after.closes - before.closes),
              static_cast<unsigned long long>(after.live));
  EXPECT_EQ(after.opens - before.opens, after.closes - before.closes);
  EXPECT_EQ(after.live, before.live);
}

TEST(GpuCache, BadPointersGiveStatuses) {
  // Every rank passes the same kind of bad pointer at once, so each call fails locally while
  // resolving its own buffer and no rank waits for a peer.
  REQUIRE_RANKS(2);
  ScopedCache cache("badptr");
  GPU_ASSERT_OK(cache.status());
  constexpr size_t kBytes = 64;

  std::vector<char> pageable(kBytes);
  nvfipc_request host_req =
      Request(SendPeer(), NVFIPC_DIRECTION_SEND, "bad_host", pageable.data(), kBytes);
  nvfipc_status st = nvfipc_exchange_handles_timeout(cache.get(), &host_req, 1, 5000);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);

  void* freed = nullptr;
  CUDA_ASSERT(cudaMalloc(&freed, 1 << 20));
  CUDA_ASSERT(cudaFree(freed));
  nvfipc_request freed_req = Request(SendPeer(), NVFIPC_DIRECTION_SEND, "bad_freed", freed, kBytes);
  st = nvfipc_exchange_handles_timeout(cache.get(), &freed_req, 1, 5000);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);

  nvfipc_request null_req = Request(SendPeer(), NVFIPC_DIRECTION_SEND, "bad_null", nullptr, kBytes);
  st = nvfipc_exchange_handles_timeout(cache.get(), &null_req, 1, 5000);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);

  nvfipc_request self_req =
      Request(job().rank, NVFIPC_DIRECTION_SEND, "bad_self", pageable.data(), kBytes);
  st = nvfipc_exchange_handles_timeout(cache.get(), &self_req, 1, 5000);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << Describe(st);

  // The P2P primitives on a channel that was never exchanged: a status, no crash.
  DeviceBuffer buf(kBytes);
  nvfipc_request unknown = Request(SendPeer(), NVFIPC_DIRECTION_SEND, "never", buf.get(), kBytes);
  st = nvfipc_cuda_p2p_send_post(cache.get(), &unknown, nullptr);
  EXPECT_NE(st, NVFIPC_STATUS_OK);
  EXPECT_NE(st, NVFIPC_STATUS_PANIC) << Describe(st);
  cache.Free();
}

}  // namespace
}  // namespace nvfipc_gpu
