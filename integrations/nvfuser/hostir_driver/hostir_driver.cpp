// Drives nvFuser's own host-IR P2P code path with several processes sharing one GPU:
// HostIrEvaluator running hir::ShareMemHandles + P2PCommunication over
// CommunicatorBackend::kCuda + hir::Wait (nvFuser's IpcHandleCache and get_zcopy protocol in
// multidevice/cuda_p2p.cpp), and IpcHandleCache used directly with a put into the peer.
//
// Built inside nvFuser's build tree (hostir_driver.cmake) against nvFuser at
// 3fe1c32124ea83f90253496cecbe5becf46c9df0. Each rank is launched as a node of its own
// (WORLD_RANK, WORLD_SIZE, WORLD_LOCAL_RANK=0, WORLD_LOCAL_SIZE=1, NVFUSER_MASTER_ADDR naming
// rank 0's host so that only rank 0 hosts the Communicator's TCPStore): nvFuser's tests need
// one GPU per rank and a NCCL world barrier, which refuses two ranks on one GPU. This program
// synchronises its own checks through the Communicator's TCPStore instead.
//
// Scenarios, in order (each prints PASS/FAIL and, on rank 0, per-iteration times):
//   share_ipc_mem_handles  int32 x4, 10 repetitions: IpcHandleCache::exchangeHandles, put into
//                          the send peer with cudaMemcpy, check arange + 10(i+1) + 100*peer
//   cuda_comm              float x8, 32 repetitions of a host program SEND/RECV over kCuda in a
//                          ring, check arange + 10 i + 100*recv_peer
//   ring_cached            pipelined ring allgather (W-1 steps, each its own ShareMemHandles),
//                          slices of one allocation, the same buffers every iteration
//   ring_alternating       the same program with two buffers used in turn: every exchange
//                          replaces the mappings of the previous iteration
//   exchange_cached        only the ring's ShareMemHandles, buffers unchanged (the per-iteration
//                          cost of a cached exchange)
//   exchange_alternating   only the ShareMemHandles, buffers alternating (a miss every time)
//   extra_evaluator        ranks 0 and 1 run one more host program (another IpcHandleCache)
//                          that the other ranks never create, then every rank runs a new ring:
//                          channels must pair up regardless of how many caches a process made
//
// Usage: nvfipc_hostir_driver [--iters N] [--chunk-elems N]
#include <expr_evaluator.h>
#include <fusion.h>
#include <host_ir/container.h>
#include <host_ir/executor.h>
#include <host_ir/host_ir.h>
#include <ir/all_nodes.h>
#include <ir/builder.h>
#include <multidevice/communication.h>
#include <multidevice/communicator.h>
#include <multidevice/ipc_handle.h>
#include <runtime/fusion_executor_cache.h>
#include <runtime/fusion_kernel_runtime.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using namespace nvfuser;
using Clock = std::chrono::steady_clock;

struct DriverOptions {
  int64_t iters = 50;
  int64_t chunk_elems = 1 << 18; // 1 MiB of floats per ring chunk
};

DriverOptions parseOptions(int argc, char** argv) {
  DriverOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) {
        throw std::invalid_argument(arg + " needs a value");
      }
      return std::stoll(argv[++i]);
    };
    if (arg == "--iters") {
      o.iters = value();
    } else if (arg == "--chunk-elems") {
      o.chunk_elems = value();
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  if (o.iters < 2 || o.chunk_elems < 1) {
    throw std::invalid_argument("--iters must be >= 2 and --chunk-elems >= 1");
  }
  return o;
}

void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// A barrier over the Communicator's TCPStore (the world's NCCL barrier refuses two ranks on one
// GPU). Generation-numbered, so it is reusable.
class StoreBarrier {
 public:
  StoreBarrier(c10d::TCPStore* store, int64_t world) : store_(store), world_(world) {}

  void wait(const std::string& name) {
    const std::string base =
        "nvfipc_driver/barrier/" + name + "/" + std::to_string(generation_++);
    if (store_->add(base + "/arrived", 1) == world_) {
      store_->set(base + "/released", std::vector<uint8_t>{1});
    }
    store_->wait({base + "/released"});
  }

 private:
  c10d::TCPStore* store_;
  int64_t world_;
  int64_t generation_ = 0;
};

struct World {
  Communicator* communicator;
  int64_t rank;
  int64_t size;
  StoreBarrier barrier;
};

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.cpu();
  return os.str();
}

void check(bool ok, const std::string& what) {
  if (!ok) {
    throw std::runtime_error(what);
  }
}

void synchronizeStream() {
  cudaCheck(
      cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream().stream()),
      "cudaStreamSynchronize");
}

at::TensorOptions optionsOf(World& w, at::ScalarType dtype) {
  // The Communicator's device() is cuda:<rank>; every rank here runs on its local device.
  return at::TensorOptions().dtype(dtype).device(
      at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(w.communicator->local_rank())));
}

double microsPerIter(Clock::time_point start, int64_t iters) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
      static_cast<double>(iters);
}

void report(World& w, const char* scenario, int64_t iters, double us) {
  if (w.rank == 0) {
    std::printf(
        "TIMING scenario=%s ranks=%lld iters=%lld us_per_iter=%.1f\n",
        scenario,
        static_cast<long long>(w.size),
        static_cast<long long>(iters),
        us);
    std::fflush(stdout);
  }
}

// nvFuser's ShareIpcMemHandles, with W ranks on one GPU: the IpcHandleCache is used directly
// and each rank writes into its send peer's receive buffer. A second barrier after the check
// keeps a rank that runs ahead from writing the next repetition before its peer checked.
void shareIpcMemHandles(World& w) {
  constexpr int64_t kTensorSize = 4;
  constexpr int64_t kRepetitions = 10;
  const int64_t send_peer = (w.rank + 1) % w.size;
  const int64_t recv_peer = (w.size + w.rank - 1) % w.size;

  auto container = std::make_unique<hir::HostIrContainer>();
  FusionGuard fg(container.get());
  TensorView* send_tv =
      TensorViewBuilder().ndims(1).dtype(DataType::Int32).contiguity(true).build();
  TensorView* recv_tv =
      TensorViewBuilder().ndims(1).dtype(DataType::Int32).contiguity(true).build();
  auto* send = IrBuilder::create<P2PCommunication>(
      P2PCommunicationType::SEND,
      send_tv,
      IrBuilder::create<Val>(send_peer),
      CommunicatorBackend::kCuda);
  auto* recv = IrBuilder::create<P2PCommunication>(
      P2PCommunicationType::RECV,
      recv_tv,
      IrBuilder::create<Val>(recv_peer),
      CommunicatorBackend::kCuda);
  std::vector<P2PCommunication*> communications = {send, recv};

  ExpressionEvaluator evaluator;
  IpcHandleCache cache(evaluator);
  const auto options = optionsOf(w, at::kInt);
  auto expected = [&](int64_t repetition, int64_t rank) {
    return at::arange(kTensorSize, options) + (repetition + 1) * 10 + 100 * rank;
  };
  at::Tensor recv_tensor = at::empty({kTensorSize}, options);
  at::Tensor send_tensor = at::empty({kTensorSize}, options);
  evaluator.bind(send_tv, send_tensor);
  evaluator.bind(recv_tv, recv_tensor);

  for (int64_t repetition = 0; repetition < kRepetitions; ++repetition) {
    send_tensor.copy_(expected(repetition, w.rank));
    synchronizeStream();
    cache.exchangeHandles(communications);
    const P2pIpcHandle& handles = cache.get(send);
    cudaCheck(
        cudaMemcpy(
            handles.peer().ptr(),
            handles.local().ptr(),
            kTensorSize * sizeof(int32_t),
            cudaMemcpyDeviceToDevice),
        "cudaMemcpy into the peer");
    // A device-to-device cudaMemcpy does not wait for the copy: finish it before the barrier.
    cudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    w.barrier.wait("share_ipc_written");
    check(
        at::equal(recv_tensor, expected(repetition, recv_peer)),
        "rank " + std::to_string(w.rank) + " repetition " + std::to_string(repetition) +
            ": received " + describe(recv_tensor));
    w.barrier.wait("share_ipc_checked");
  }
}

// A host program with one SEND to rank+1 and one RECV from rank-1 over kCuda.
struct RingPair {
  std::unique_ptr<hir::HostIrEvaluator> evaluator;
  TensorView* send_tv = nullptr;
  TensorView* recv_tv = nullptr;
};

RingPair makeRingPair(World& w, int64_t send_peer, int64_t recv_peer, bool with_send,
                      bool with_recv) {
  auto container = std::make_unique<hir::HostIrContainer>();
  FusionGuard fg(container.get());
  RingPair p;
  p.send_tv = TensorViewBuilder().ndims(1).dtype(DataType::Float).contiguity(true).build();
  p.recv_tv = TensorViewBuilder().ndims(1).dtype(DataType::Float).contiguity(true).build();
  container->addInput(p.send_tv);
  container->addInput(p.recv_tv);
  std::vector<P2PCommunication*> comms;
  P2PCommunication* send = nullptr;
  P2PCommunication* recv = nullptr;
  if (with_send) {
    send = IrBuilder::create<P2PCommunication>(
        P2PCommunicationType::SEND,
        p.send_tv,
        IrBuilder::create<Val>(send_peer, DataType::Int),
        CommunicatorBackend::kCuda);
    comms.push_back(send);
  }
  if (with_recv) {
    recv = IrBuilder::create<P2PCommunication>(
        P2PCommunicationType::RECV,
        p.recv_tv,
        IrBuilder::create<Val>(recv_peer, DataType::Int),
        CommunicatorBackend::kCuda);
    comms.push_back(recv);
  }
  container->pushBackTopLevelExprs(IrBuilder::create<hir::ShareMemHandles>(comms));
  for (P2PCommunication* c : comms) {
    container->pushBackTopLevelExprs(c);
  }
  for (P2PCommunication* c : comms) {
    container->pushBackTopLevelExprs(IrBuilder::create<hir::Wait>(c));
  }
  p.evaluator = std::make_unique<hir::HostIrEvaluator>(std::move(container), w.communicator);
  return p;
}

// nvFuser's P2PCommunicationTest.CudaComm over a ring of W ranks.
void cudaComm(World& w, int64_t repetitions, const char* scenario) {
  constexpr int64_t kTensorSize = 8;
  const int64_t send_peer = (w.rank + 1) % w.size;
  const int64_t recv_peer = (w.size + w.rank - 1) % w.size;
  RingPair p = makeRingPair(w, send_peer, recv_peer, true, true);
  const auto options = optionsOf(w, at::kFloat);
  at::Tensor send_tensor = at::empty({kTensorSize}, options);
  at::Tensor recv_tensor = at::empty({kTensorSize}, options);
  std::unordered_map<Val*, PolymorphicValue> inputs = {
      {p.send_tv, send_tensor}, {p.recv_tv, recv_tensor}};
  Clock::time_point start = Clock::now();
  for (int64_t repetition = 0; repetition < repetitions; ++repetition) {
    if (repetition == 1) {
      start = Clock::now(); // the first repetition exchanges; the others are cached
    }
    send_tensor.copy_(at::arange(kTensorSize, options) + repetition * 10 + 100 * w.rank);
    p.evaluator->runWithInput(inputs);
    const at::Tensor expected =
        at::arange(kTensorSize, options) + repetition * 10 + 100 * recv_peer;
    check(
        at::equal(recv_tensor, expected),
        std::string(scenario) + ": rank " + std::to_string(w.rank) + " repetition " +
            std::to_string(repetition) + " received " +
            describe(recv_tensor));
  }
  synchronizeStream();
  report(w, scenario, repetitions - 1, microsPerIter(start, repetitions - 1));
}

// The pipelined ring allgather: W-1 steps, step s sends chunk (rank - s) to rank+1 and
// receives chunk (rank - s - 1) from rank-1, each step with its own ShareMemHandles; every
// chunk is a slice of one allocation. `transfers` = false keeps only the ShareMemHandles.
struct RingProgram {
  std::unique_ptr<hir::HostIrEvaluator> evaluator;
  std::vector<TensorView*> send_tvs;
  std::vector<TensorView*> recv_tvs;
};

RingProgram makeRing(World& w, bool transfers) {
  auto container = std::make_unique<hir::HostIrContainer>();
  FusionGuard fg(container.get());
  RingProgram r;
  const int64_t send_peer = (w.rank + 1) % w.size;
  const int64_t recv_peer = (w.size + w.rank - 1) % w.size;
  for (int64_t step = 0; step + 1 < w.size; ++step) {
    TensorView* send_tv =
        TensorViewBuilder().ndims(1).dtype(DataType::Float).contiguity(true).build();
    TensorView* recv_tv =
        TensorViewBuilder().ndims(1).dtype(DataType::Float).contiguity(true).build();
    container->addInput(send_tv);
    container->addInput(recv_tv);
    r.send_tvs.push_back(send_tv);
    r.recv_tvs.push_back(recv_tv);
    auto* send = IrBuilder::create<P2PCommunication>(
        P2PCommunicationType::SEND,
        send_tv,
        IrBuilder::create<Val>(send_peer, DataType::Int),
        CommunicatorBackend::kCuda);
    auto* recv = IrBuilder::create<P2PCommunication>(
        P2PCommunicationType::RECV,
        recv_tv,
        IrBuilder::create<Val>(recv_peer, DataType::Int),
        CommunicatorBackend::kCuda);
    container->pushBackTopLevelExprs(
        IrBuilder::create<hir::ShareMemHandles>(std::vector<P2PCommunication*>{send, recv}));
    if (transfers) {
      container->pushBackTopLevelExprs(send);
      container->pushBackTopLevelExprs(recv);
      container->pushBackTopLevelExprs(IrBuilder::create<hir::Wait>(send));
      container->pushBackTopLevelExprs(IrBuilder::create<hir::Wait>(recv));
    }
  }
  r.evaluator = std::make_unique<hir::HostIrEvaluator>(std::move(container), w.communicator);
  return r;
}

std::unordered_map<Val*, PolymorphicValue> ringInputs(World& w, RingProgram& r,
                                                      const at::Tensor& buffer,
                                                      int64_t chunk) {
  std::unordered_map<Val*, PolymorphicValue> inputs;
  for (int64_t step = 0; step + 1 < w.size; ++step) {
    const int64_t send_chunk = ((w.rank - step) % w.size + w.size) % w.size;
    const int64_t recv_chunk = ((w.rank - step - 1) % w.size + w.size) % w.size;
    inputs[r.send_tvs[step]] = buffer.narrow(0, send_chunk * chunk, chunk);
    inputs[r.recv_tvs[step]] = buffer.narrow(0, recv_chunk * chunk, chunk);
  }
  return inputs;
}

float ringValue(int64_t iteration, int64_t rank) {
  return static_cast<float>(1000 * iteration + rank + 1);
}

void ring(World& w, const DriverOptions& o, bool alternating, const char* scenario) {
  if (w.size < 2) {
    return;
  }
  RingProgram r = makeRing(w, true);
  const auto options = optionsOf(w, at::kFloat);
  const int64_t chunk = o.chunk_elems;
  std::vector<at::Tensor> buffers = {at::empty({w.size * chunk}, options)};
  if (alternating) {
    buffers.push_back(at::empty({w.size * chunk}, options));
  }
  std::vector<std::unordered_map<Val*, PolymorphicValue>> inputs;
  for (const at::Tensor& b : buffers) {
    inputs.push_back(ringInputs(w, r, b, chunk));
  }
  Clock::time_point start = Clock::now();
  for (int64_t it = 0; it < o.iters; ++it) {
    if (it == static_cast<int64_t>(buffers.size())) {
      start = Clock::now(); // every buffer has been exchanged once
    }
    const size_t which = static_cast<size_t>(it) % buffers.size();
    at::Tensor& buffer = buffers[which];
    buffer.fill_(-1.0f);
    buffer.narrow(0, w.rank * chunk, chunk).fill_(ringValue(it, w.rank));
    r.evaluator->runWithInput(inputs[which]);
    // Check a few iterations fully (the check copies to the host); time the others.
    if (it < 3 || it + 1 == o.iters) {
      at::Tensor host = buffer.cpu();
      for (int64_t owner = 0; owner < w.size; ++owner) {
        const at::Tensor got = host.narrow(0, owner * chunk, chunk);
        check(
            at::all(got == ringValue(it, owner)).item<bool>(),
            std::string(scenario) + ": rank " + std::to_string(w.rank) + " iteration " +
                std::to_string(it) + ": chunk of rank " + std::to_string(owner) +
                " holds " + std::to_string(got.min().item<float>()) + ".." +
                std::to_string(got.max().item<float>()) + ", expected " +
                std::to_string(ringValue(it, owner)));
      }
    }
  }
  synchronizeStream();
  const int64_t timed = o.iters - static_cast<int64_t>(buffers.size());
  report(w, scenario, timed, microsPerIter(start, timed));
}

void exchangeOnly(World& w, const DriverOptions& o, bool alternating, const char* scenario) {
  if (w.size < 2) {
    return;
  }
  RingProgram r = makeRing(w, false);
  const auto options = optionsOf(w, at::kFloat);
  std::vector<at::Tensor> buffers = {at::zeros({w.size * o.chunk_elems}, options)};
  if (alternating) {
    buffers.push_back(at::zeros({w.size * o.chunk_elems}, options));
  }
  std::vector<std::unordered_map<Val*, PolymorphicValue>> inputs;
  for (const at::Tensor& b : buffers) {
    inputs.push_back(ringInputs(w, r, b, o.chunk_elems));
  }
  const int64_t iters = alternating ? o.iters : 10 * o.iters;
  synchronizeStream();
  Clock::time_point start = Clock::now();
  for (int64_t it = 0; it < iters; ++it) {
    if (it == static_cast<int64_t>(buffers.size())) {
      start = Clock::now();
    }
    r.evaluator->runWithInput(inputs[static_cast<size_t>(it) % buffers.size()]);
  }
  const int64_t timed = iters - static_cast<int64_t>(buffers.size());
  report(w, scenario, timed, microsPerIter(start, timed));
}

// Ranks 0 and 1 create and run one more host program (and IpcHandleCache) than the others;
// then everybody runs a new ring. Channels must not depend on how many caches a process made.
void extraEvaluator(World& w) {
  if (w.size < 2) {
    return;
  }
  if (w.rank <= 1) {
    const int64_t peer = 1 - w.rank;
    RingPair p = makeRingPair(w, peer, peer, w.rank == 0, w.rank == 1);
    const auto options = optionsOf(w, at::kFloat);
    at::Tensor send_tensor = at::full({16}, 7.0f, options);
    at::Tensor recv_tensor = at::zeros({16}, options);
    p.evaluator->runWithInput({{p.send_tv, send_tensor}, {p.recv_tv, recv_tensor}});
    if (w.rank == 1) {
      check(
          at::all(recv_tensor == 7.0f).item<bool>(),
          "extra_evaluator: rank 1 received " + describe(recv_tensor));
    }
  }
  cudaComm(w, 4, "extra_evaluator");
}

} // namespace

int main(int argc, char** argv) {
  int64_t rank = -1;
  try {
    const DriverOptions options = parseOptions(argc, argv);
    Communicator& communicator = Communicator::getInstance();
    if (!communicator.is_available() || communicator.size() < 2) {
      std::fprintf(stderr,
                   "nvfipc_hostir_driver: needs a Communicator of at least 2 ranks (WORLD_RANK, "
                   "WORLD_SIZE, WORLD_LOCAL_RANK, WORLD_LOCAL_SIZE, NVFUSER_MASTER_ADDR/PORT)\n");
      return 2;
    }
    rank = communicator.deviceId();
    World w{&communicator, rank, communicator.size(),
            StoreBarrier(communicator.getTcpStore(), communicator.size())};

    struct Named {
      const char* name;
      std::function<void()> run;
    };
    const std::vector<Named> scenarios = {
        {"share_ipc_mem_handles", [&] { shareIpcMemHandles(w); }},
        {"cuda_comm", [&] { cudaComm(w, 32, "cuda_comm"); }},
        {"ring_cached", [&] { ring(w, options, false, "ring_cached"); }},
        {"ring_alternating", [&] { ring(w, options, true, "ring_alternating"); }},
        {"exchange_cached", [&] { exchangeOnly(w, options, false, "exchange_cached"); }},
        {"exchange_alternating",
         [&] { exchangeOnly(w, options, true, "exchange_alternating"); }},
        {"extra_evaluator", [&] { extraEvaluator(w); }},
    };
    for (const Named& s : scenarios) {
      w.barrier.wait(std::string("start_") + s.name);
      s.run();
      synchronizeStream();
      w.barrier.wait(std::string("end_") + s.name);
      std::printf("RESULT rank=%lld scenario=%s PASS\n", static_cast<long long>(rank), s.name);
      std::fflush(stdout);
    }
    // Rank 0 hosts the TCPStore: nobody may leave before everybody is done with it.
    w.barrier.wait("exit");
    std::printf("RESULT rank=%lld all PASS; exiting\n", static_cast<long long>(rank));
    std::fflush(stdout);
    // No Communicator::cleanup(): its world barrier goes through NCCL, which refuses ranks that
    // share a GPU. The IPC state is released by the drop-in at exit.
    return 0;
  } catch (const std::exception& e) {
    std::printf("RESULT rank=%lld FAIL: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stdout);
    std::_Exit(1);
  }
}
