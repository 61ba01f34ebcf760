#include "scenarios.hpp"

#include <cstdio>
#include <sstream>

namespace nvfipc_cxx {
namespace {

using nvfipc::HandleCache;
using nvfipc::Request;

// nvFuser's get_zcopy on either memory kind: host primitives run (and block) on this thread,
// device ones are queued on the memory's stream.
void SendPost(const HandleCache& cache, const Request& send, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    cache.hostSendPost(send);
  } else {
    cache.sendPost(send, mem.stream());
  }
}
void RecvPost(const HandleCache& cache, const Request& recv, uint64_t bytes, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    cache.hostRecvPost(recv, bytes);
  } else {
    cache.recvPost(recv, bytes, mem.stream());
  }
}
void SendWait(const HandleCache& cache, const Request& send, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    cache.hostSendWait(send);
  } else {
    cache.sendWait(send, mem.stream());
  }
}

// The same on an opened channel.
void SendPost(const nvfipc::Channel& ch, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    ch.hostSendPost();
  } else {
    ch.sendPost(mem.stream());
  }
}
void RecvPost(const nvfipc::Channel& ch, uint64_t bytes, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    ch.hostRecvPost(bytes);
  } else {
    ch.recvPost(bytes, mem.stream());
  }
}
void SendWait(const nvfipc::Channel& ch, Memory& mem) {
  if (mem.kind() == nvfipc::MemKind::Host) {
    ch.hostSendWait();
  } else {
    ch.sendWait(mem.stream());
  }
}

template <typename T>
void ExpectValues(const std::vector<T>& got, const std::vector<T>& want, int64_t rank,
                  const std::string& where) {
  for (size_t j = 0; j < want.size(); ++j) {
    if (got[j] != want[j]) {
      std::ostringstream os;
      os << "rank " << rank << ": " << where << ": element " << j << " is " << got[j]
         << ", expected " << want[j];
      throw ScenarioFailure(os.str());
    }
  }
}

void Expect(bool cond, int64_t rank, const std::string& what) {
  if (!cond) throw ScenarioFailure("rank " + std::to_string(rank) + ": " + what);
}

int64_t Mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

}  // namespace

void RunShareIpcMemHandles(const nvfipc::Context& ctx, Memory& mem, const std::string& scope) {
  constexpr int kRepetitions = 10;
  constexpr size_t kNumel = 4;
  constexpr size_t kBytes = kNumel * sizeof(int32_t);
  const int64_t rank = ctx.rank();
  const int64_t world = ctx.worldSize();
  const int64_t send_peer = (rank + 1) % world;
  const int64_t recv_peer = (world + rank - 1) % world;

  std::shared_ptr<void> send = mem.alloc(kBytes);
  std::shared_ptr<void> recv = mem.alloc(kBytes);
  const auto kind = mem.kind();
  const std::vector<Request> batch = {Request::send(send_peer, "ring", send.get(), kBytes, kind),
                                      Request::recv(recv_peer, "ring", recv.get(), kBytes, kind)};
  HandleCache cache(ctx, scope);
  uint64_t round_trips_after_first = 0;

  for (int i = 0; i < kRepetitions; ++i) {
    std::vector<int32_t> values(kNumel);
    for (size_t j = 0; j < kNumel; ++j) values[j] = static_cast<int32_t>(j + 10 * (i + 1) + 100 * rank);
    mem.upload(send.get(), values.data(), kBytes);

    cache.exchangeHandles(batch);
    if (i == 0) round_trips_after_first = cache.stats().store_round_trips;

    const nvfipc::P2pHandle h = cache.get(batch[0]);
    Expect(h.local().ptr() == send.get(), rank, "get(send).local().ptr() is not the send buffer");
    Expect(h.peer().bytes() == kBytes, rank, "the peer's receive buffer has the wrong size");
    // A put: this rank writes straight into the receiver's buffer; no semaphores.
    mem.put(h.peer().ptr(), h.local().ptr(), kBytes);
    mem.synchronize();
    ctx.barrier();

    std::vector<int32_t> got(kNumel), want(kNumel);
    mem.download(got.data(), recv.get(), kBytes);
    for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<int32_t>(j + 10 * (i + 1) + 100 * recv_peer);
    ExpectValues(got, want, rank, "repetition " + std::to_string(i));
  }

  const nvfipc::CacheStats s = cache.stats();
  Expect(s.exchanges == kRepetitions, rank, "exchanges = " + std::to_string(s.exchanges));
  Expect(s.store_round_trips == round_trips_after_first, rank,
         "cache hits used the store: " + std::to_string(s.store_round_trips) + " round trips, " +
             std::to_string(round_trips_after_first) + " after the first exchange");
  Expect(s.hits >= 2 * (kRepetitions - 1), rank, "hits = " + std::to_string(s.hits));
  ctx.barrier();  // nobody frees its buffers while a peer may still write into them
}

void RunCudaComm(const nvfipc::Context& ctx, Memory& mem, const std::string& scope) {
  constexpr int kRepetitions = 32;
  constexpr size_t kNumel = 8;
  constexpr size_t kBytes = kNumel * sizeof(float);
  const int64_t rank = ctx.rank();
  const int64_t world = ctx.worldSize();
  const int64_t send_peer = (rank + 1) % world;
  const int64_t recv_peer = (world + rank - 1) % world;

  std::shared_ptr<void> send = mem.alloc(kBytes);
  std::shared_ptr<void> recv = mem.alloc(kBytes);
  const auto kind = mem.kind();
  const Request send_req = Request::send(send_peer, "p2p", send.get(), kBytes, kind);
  const Request recv_req = Request::recv(recv_peer, "p2p", recv.get(), kBytes, kind);
  HandleCache cache(ctx, scope);

  for (int i = 0; i < kRepetitions; ++i) {
    std::vector<float> values(kNumel);
    for (size_t j = 0; j < kNumel; ++j) values[j] = static_cast<float>(j + 10 * i + 100 * rank);
    mem.upload(send.get(), values.data(), kBytes);

    // What nvFuser's host program runs: ShareMemHandles, send, recv, Wait(send), Wait(recv).
    cache.exchangeHandles({send_req, recv_req});
    SendPost(cache, send_req, mem);
    RecvPost(cache, recv_req, kBytes, mem);
    SendWait(cache, send_req, mem);

    std::vector<float> got(kNumel), want(kNumel);
    mem.download(got.data(), recv.get(), kBytes);
    for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<float>(j + 10 * i + 100 * recv_peer);
    ExpectValues(got, want, rank, "repetition " + std::to_string(i));
  }
  const nvfipc::CacheStats s = cache.stats();
  Expect(s.exchanges == kRepetitions, rank, "exchanges = " + std::to_string(s.exchanges));
  Expect(s.misses <= 2, rank, "misses = " + std::to_string(s.misses) + " (buffers never change)");
}

void RunChannelComm(const nvfipc::Context& ctx, Memory& mem, const std::string& scope) {
  constexpr int kRepetitions = 16;
  constexpr int kSwapAt = 8;
  constexpr size_t kNumel = 8;
  constexpr size_t kBytes = kNumel * sizeof(float);
  const int64_t rank = ctx.rank();
  const int64_t world = ctx.worldSize();
  const int64_t send_peer = (rank + 1) % world;
  const int64_t recv_peer = (world + rank - 1) % world;
  const auto kind = mem.kind();

  std::shared_ptr<void> sends[2] = {mem.alloc(kBytes), mem.alloc(kBytes)};
  std::shared_ptr<void> recv = mem.alloc(kBytes);
  const Request recv_req = Request::recv(recv_peer, "channel", recv.get(), kBytes, kind);
  HandleCache cache(ctx, scope);
  nvfipc::Channel send_ch, recv_ch;

  for (int i = 0; i < kRepetitions; ++i) {
    void* send = sends[i < kSwapAt ? 0 : 1].get();
    const Request send_req = Request::send(send_peer, "channel", send, kBytes, kind);
    std::vector<float> values(kNumel);
    for (size_t j = 0; j < kNumel; ++j) values[j] = static_cast<float>(j + 10 * i + 100 * rank);
    mem.upload(send, values.data(), kBytes);

    cache.exchangeHandles({send_req, recv_req});
    if (i == kSwapAt) {
      // Every rank replaced its send buffer: its own send channel and its receive channel (the
      // peer's buffer) are stale, and say so without touching anything.
      bool send_stale = false, recv_stale = false;
      try {
        SendPost(send_ch, mem);
      } catch (const nvfipc::InvalidStateError&) {
        send_stale = true;
      }
      try {
        RecvPost(recv_ch, kBytes, mem);
      } catch (const nvfipc::InvalidStateError&) {
        recv_stale = true;
      }
      Expect(send_stale && recv_stale, rank, "channels of replaced buffers are stale");
    }
    if (i == 0 || i == kSwapAt) {
      send_ch = cache.channel(send_req);
      recv_ch = cache.channel(recv_req);
      Expect(recv_ch.handles().local().ptr() == recv.get(), rank, "the channel's handles");
    }
    SendPost(send_ch, mem);
    RecvPost(recv_ch, kBytes, mem);
    SendWait(send_ch, mem);

    std::vector<float> got(kNumel), want(kNumel);
    mem.download(got.data(), recv.get(), kBytes);
    for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<float>(j + 10 * i + 100 * recv_peer);
    ExpectValues(got, want, rank, "repetition " + std::to_string(i));
  }
  cache.close();
  bool closed_stale = false;
  try {
    SendPost(send_ch, mem);
  } catch (const nvfipc::InvalidStateError&) {
    closed_stale = true;
  }
  Expect(closed_stale, rank, "a channel of a freed cache is stale");
}

void RunRingAllgather(const nvfipc::Context& ctx, Memory& mem, const std::string& scope) {
  constexpr int kRepetitions = 5;
  constexpr int64_t kChunk = 64;  // int32 elements per rank
  constexpr int64_t kSlices = 4;  // pipeline depth: each chunk travels in this many slices
  constexpr int64_t kSlice = kChunk / kSlices;
  const int64_t rank = ctx.rank();
  const int64_t world = ctx.worldSize();
  const int64_t send_peer = (rank + 1) % world;
  const int64_t recv_peer = (world + rank - 1) % world;
  const size_t total_bytes = static_cast<size_t>(world * kChunk) * sizeof(int32_t);
  const uint64_t slice_bytes = kSlice * sizeof(int32_t);

  std::shared_ptr<void> buffer = mem.alloc(total_bytes);
  auto* base = static_cast<int32_t*>(buffer.get());
  auto slice_ptr = [&](int64_t chunk, int64_t k) { return base + chunk * kChunk + k * kSlice; };

  // Step s forwards chunk (rank - s) to the next rank and receives chunk (rank - s - 1) from the
  // previous one; the tag names the step and slice, equal on sender and receiver.
  const auto kind = mem.kind();
  std::vector<Request> sends, recvs, batch;
  for (int64_t s = 0; s + 1 < world; ++s) {
    for (int64_t k = 0; k < kSlices; ++k) {
      const std::string tag = "allgather/s" + std::to_string(s) + "/k" + std::to_string(k);
      sends.push_back(
          Request::send(send_peer, tag, slice_ptr(Mod(rank - s, world), k), slice_bytes, kind));
      recvs.push_back(
          Request::recv(recv_peer, tag, slice_ptr(Mod(rank - s - 1, world), k), slice_bytes, kind));
    }
  }
  // Receives first: the peers see the batch in another order than their own, which is allowed.
  batch.insert(batch.end(), recvs.rbegin(), recvs.rend());
  batch.insert(batch.end(), sends.begin(), sends.end());
  HandleCache cache(ctx, scope);

  auto value = [](int64_t owner, int rep, int64_t j) {
    return static_cast<int32_t>(owner * 100000 + rep * 1000 + j);
  };
  for (int rep = 0; rep < kRepetitions; ++rep) {
    std::vector<int32_t> own(kChunk);
    for (int64_t j = 0; j < kChunk; ++j) own[j] = value(rank, rep, j);
    // The previous repetition's send waits have completed (download synchronised), so the
    // next rank has consumed everything this rank sent from the buffer.
    mem.upload(slice_ptr(rank, 0), own.data(), kChunk * sizeof(int32_t));

    cache.exchangeHandles(batch);
    // Slice k of step s+1 is the slice k received at step s: it is posted only after that
    // receive, in program order (host) or stream order (device).
    for (size_t i = 0; i < sends.size(); ++i) {
      SendPost(cache, sends[i], mem);
      RecvPost(cache, recvs[i], slice_bytes, mem);
    }
    for (const Request& send : sends) SendWait(cache, send, mem);

    std::vector<int32_t> got(static_cast<size_t>(world * kChunk));
    mem.download(got.data(), buffer.get(), total_bytes);
    std::vector<int32_t> want(got.size());
    for (int64_t owner = 0; owner < world; ++owner) {
      for (int64_t j = 0; j < kChunk; ++j) want[owner * kChunk + j] = value(owner, rep, j);
    }
    ExpectValues(got, want, rank, "repetition " + std::to_string(rep));
  }
  const nvfipc::CacheStats s = cache.stats();
  Expect(s.exchanges == kRepetitions, rank, "exchanges = " + std::to_string(s.exchanges));
}

void RunSymmetric(const nvfipc::Context& ctx, Memory& mem, const std::string& scope) {
  constexpr size_t kNumel = 256;
  constexpr size_t kBytes = kNumel * sizeof(int32_t);
  const int64_t rank = ctx.rank();
  const int64_t world = ctx.worldSize();
  std::shared_ptr<void> buf = mem.alloc(kBytes);
  std::vector<int32_t> mine(kNumel);
  for (size_t j = 0; j < kNumel; ++j) mine[j] = static_cast<int32_t>(1000 * rank + j);
  mem.upload(buf.get(), mine.data(), kBytes);
  HandleCache cache(ctx, scope);
  // No barrier before or inside: each rank waits only for the peers it maps.
  const auto peers = cache.symmetricRendezvous("table", mem.kind(), buf.get(), kBytes);
  Expect(static_cast<int64_t>(peers.size()) == world, rank, "one entry per rank");
  for (int64_t r = 0; r < world; ++r) {
    Expect(peers[r].rank == r && peers[r].bytes == kBytes, rank, "entry " + std::to_string(r));
    std::vector<int32_t> got(kNumel), want(kNumel);
    mem.download(got.data(), peers[r].ptr, kBytes);
    for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<int32_t>(1000 * r + j);
    ExpectValues(got, want, rank, "rank " + std::to_string(r) + "'s buffer");
  }
  const uint64_t trips = cache.stats().store_round_trips;
  const auto again = cache.symmetricRendezvous("table", mem.kind(), buf.get(), kBytes);
  Expect(again[world - 1].ptr == peers[world - 1].ptr, rank, "a second rendezvous maps again");
  Expect(cache.stats().store_round_trips == trips, rank, "a second rendezvous used the store");
  // The contiguous view: member r's buffer at base + r * stride (device memory: VMM only).
  try {
    const auto view = cache.symmetricContiguousView("table");
    for (int64_t r = 0; r < world; ++r) {
      std::vector<int32_t> got(kNumel), want(kNumel);
      mem.download(got.data(), view.member(static_cast<size_t>(r)), kBytes);
      for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<int32_t>(1000 * r + j);
      ExpectValues(got, want, rank, "rank " + std::to_string(r) + "'s buffer in the view");
    }
    Expect(cache.symmetricContiguousView("table").base == view.base, rank, "asked again, the view moved");
  } catch (const nvfipc::UnsupportedError& e) {
    Expect(mem.kind() == nvfipc::MemKind::Device &&
               e.message().find("VMM allocation is needed") != std::string::npos,
           rank, std::string("the view was refused: ") + e.what());
  }
  ctx.barrier();  // every rank is done reading before any releases
  // Released, then the same buffers again: re-imported from the records kept, no store traffic.
  cache.symmetricRelease("table");
  const uint64_t released_trips = cache.stats().store_round_trips;
  const auto back = cache.symmetricRendezvous("table", mem.kind(), buf.get(), kBytes);
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int32_t> got(kNumel), want(kNumel);
    mem.download(got.data(), back[r].ptr, kBytes);
    for (size_t j = 0; j < kNumel; ++j) want[j] = static_cast<int32_t>(1000 * r + j);
    ExpectValues(got, want, rank, "rank " + std::to_string(r) + "'s buffer after a release");
  }
  Expect(cache.stats().store_round_trips == released_trips, rank,
         "a rendezvous after a release used the store");
  ctx.barrier();  // nobody frees its buffer while a peer may still read it
  cache.symmetricRelease("table");
  bool refused = false;
  try {
    cache.symmetricRelease("table");
  } catch (const nvfipc::InvalidArgumentError&) {
    refused = true;
  }
  Expect(refused, rank, "a second release was accepted");
}

const std::vector<std::string>& ScenarioNames() {
  static const std::vector<std::string> names = {"ShareIpcMemHandles", "CudaComm",
                                                 "ChannelComm", "RingAllgather", "Symmetric"};
  return names;
}

void RunScenario(const std::string& name, const nvfipc::Context& ctx, Memory& mem,
                 const std::string& scope) {
  if (name == "ShareIpcMemHandles") return RunShareIpcMemHandles(ctx, mem, scope);
  if (name == "CudaComm") return RunCudaComm(ctx, mem, scope);
  if (name == "ChannelComm") return RunChannelComm(ctx, mem, scope);
  if (name == "RingAllgather") return RunRingAllgather(ctx, mem, scope);
  if (name == "Symmetric") return RunSymmetric(ctx, mem, scope);
  throw std::invalid_argument("unknown scenario '" + name + "'");
}

}  // namespace nvfipc_cxx
