// Times nvFuser main's own host-IR loops that exchange IPC handles every iteration, with several
// processes sharing one GPU. Built inside nvFuser main's build tree (main_driver.cmake) against
// NVIDIA/Fuser 81c4b22fd750d377d69e24928c32233162f6b2bd, once with nvFuser's own
// csrc/multidevice/ipc_handle.{h,cpp} and once with the drop-in of integrations/nvfuser/main/, so
// that the same program times both. It uses only API both headers provide (HostIrEvaluator,
// hir::ShareMemHandles, P2PCommunication over CommunicatorBackend::kCuda, hir::Wait,
// SymmetricTensor); nothing of IpcHandleCache itself.
//
// Launch: one process per rank, each a node of its own on device 0: RANK, WORLD_SIZE,
// LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, NVFUSER_MASTER_PORT, and NVFUSER_MASTER_ADDR=localhost on
// rank 0 (it hosts the Communicator's TCPStore) and 127.0.0.1 on the others (clients). This
// program synchronises its own checks and timings through that TCPStore and never creates a
// NCCL communicator itself. nvFuser's code does, in both builds alike where stated below: stock
// IpcHandleCache::exchangeHandles ends a call with a miss in Communicator::barrier(), and
// SymmetricTensor::setupRemoteHandles has two of them; those go through ProcessGroupNCCL, which
// refuses two ranks of one host on one GPU, so give each rank its own NCCL_HOSTID (sockets over
// lo), as scripts/nvfuser/main-suite.sh's run_driver does.
//
// Scenarios (each prints, per rank, CHECK ... PASS|FAIL after checking the moved data; rank 0
// prints one RESULT line with per-iteration times, median and p90 after --warmup iterations):
//   share_mem_handles_cached       a host program ShareMemHandles{SEND to rank+1, RECV from
//                                  rank-1} + the SEND/RECV (kCuda, nvFuser's get protocol) +
//                                  Wait x2, float x --elems, the same buffers every iteration;
//                                  every iteration checks arange + 10 i + 100 * (rank-1).
//                                  exchange_median_us: a program of the ShareMemHandles alone
//                                  over the same buffers
//   share_mem_handles_alternating  the same, the buffers alternating between two allocations:
//                                  the drop-in keeps one buffer per channel (a miss every
//                                  iteration); stock keeps every buffer it has seen, so only its
//                                  first two (warm-up) iterations miss
//   symmetric_setup                --sym-calls timed calls after one untimed; per call:
//                                  SymmetricTensor::allocate, SymmetricTensor(t),
//                                  setupRemoteHandles(fresh tag), setupContiguousView(tag) (no
//                                  multicast needed); each rank writes 1000 call + rank and reads
//                                  every peer's value through remotePointersTensor() and through
//                                  the view (data pointers and cudaMemcpy only: remoteTensor()
//                                  labels the peer tensor cuda:<rank>). exchange_median_us:
//                                  setupRemoteHandles alone. Symmetric memory does not use
//                                  ipc_handle.cpp: the same code in both builds
//   ring_allgather                 pipelined ring allgather, W-1 steps, each its own
//                                  ShareMemHandles + SEND/RECV + Wait x2 over slices of one
//                                  allocation of W chunks of --chunk-elems floats; every
//                                  iteration checks every chunk. exchange_median_us: the program
//                                  of the W-1 ShareMemHandles alone, so the exchange's share of
//                                  an iteration is exchange_median_us / median_us
// Times are of runWithInput plus a synchronisation of the stream (the transfers included).
//
// Output, one line per scenario on rank 0:
//   RESULT scenario=<name> world=<W> iters=<N> median_us=<x> p90_us=<y> [exchange_median_us=<z>]
//          status=PASS|FAIL
// status is PASS when every rank's checks passed. Exit status 0 when every scenario passed.
//
// Usage: nvfipc_main_driver [--iters N] [--warmup N] [--elems N] [--chunk-elems N]
//                           [--sym-calls N] [--only NAME[,NAME...]]
#include "fusion.h"
#include "fusion_guard.h"
#include "host_ir/container.h"
#include "host_ir/evaluator.h"
#include "host_ir/ir.h"
#include "ir/all_nodes.h"
#include "ir/builder.h"
#include "multidevice/communication.h"
#include "multidevice/communicator.h"
#include "multidevice/symmetric_tensor.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  int64_t warmup = 20; // every semaphore slot of the drop-in (16) used once
  int64_t elems = 1024;
  int64_t chunk_elems = 1 << 18; // 1 MiB of floats per ring chunk
  int64_t sym_calls = 20;
  std::vector<std::string> only;
};

DriverOptions parseOptions(int argc, char** argv) {
  DriverOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw std::invalid_argument(arg + " needs a value");
      }
      return argv[++i];
    };
    if (arg == "--iters") {
      o.iters = std::stoll(value());
    } else if (arg == "--warmup") {
      o.warmup = std::stoll(value());
    } else if (arg == "--elems") {
      o.elems = std::stoll(value());
    } else if (arg == "--chunk-elems") {
      o.chunk_elems = std::stoll(value());
    } else if (arg == "--sym-calls") {
      o.sym_calls = std::stoll(value());
    } else if (arg == "--only") {
      std::stringstream names(value());
      for (std::string name; std::getline(names, name, ',');) {
        o.only.push_back(name);
      }
    } else {
      throw std::invalid_argument("unknown argument " + arg);
    }
  }
  // Two warm-up iterations at least: the alternating scenario exchanges both buffers in them.
  if (o.iters < 1 || o.warmup < 2 || o.elems < 1 || o.chunk_elems < 1 ||
      o.sym_calls < 1) {
    throw std::invalid_argument(
        "--iters, --elems, --chunk-elems, --sym-calls must be >= 1 and --warmup >= 2");
  }
  return o;
}

void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// Records the first failed check instead of throwing: a rank that left a loop early would leave
// its peers' streams waiting on semaphores it never writes.
class Checks {
 public:
  void expect(bool ok, const std::function<std::string()>& what) {
    if (!ok && first_.empty()) {
      first_ = what();
    }
  }
  void throwIfFailed() const {
    if (!first_.empty()) {
      throw std::runtime_error(first_);
    }
  }

 private:
  std::string first_;
};

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.flatten().narrow(0, 0, std::min<int64_t>(t.numel(), 8)).cpu();
  return os.str();
}

void synchronizeStream() {
  cudaCheck(
      cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream().stream()),
      "cudaStreamSynchronize");
}

double microsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// A barrier over the Communicator's TCPStore (no NCCL), reusable: each wait has its own keys,
// counted per name, so that a rank that skipped a barrier of a failed scenario still meets the
// others at the next scenario's.
class StoreBarrier {
 public:
  StoreBarrier(c10d::TCPStore* store, int64_t world) : store_(store), world_(world) {}

  void wait(const std::string& name) {
    const std::string base =
        "nvfipc_main_driver/barrier/" + name + "/" + std::to_string(generations_[name]++);
    if (store_->add(base + "/arrived", 1) == world_) {
      store_->set(base + "/released", std::vector<uint8_t>{1});
    }
    store_->wait({base + "/released"});
  }

 private:
  c10d::TCPStore* store_;
  int64_t world_;
  std::unordered_map<std::string, int64_t> generations_;
};

struct World {
  Communicator* communicator;
  c10d::TCPStore* store;
  int64_t rank;
  int64_t size;
  StoreBarrier barrier;
  // Equal on every rank of one run, different between runs: names the symmetric-memory
  // rendezvous (abstract Unix sockets, shared by every process of the machine).
  std::string run_id;

  int64_t sendPeer() const {
    return (rank + 1) % size;
  }
  int64_t recvPeer() const {
    return (rank + size - 1) % size;
  }
};

at::TensorOptions optionsOf(const World& w, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(w.communicator->device());
}

// What a scenario measured; empty samples leave the times out.
struct Timing {
  std::vector<double> iteration_us;
  std::vector<double> exchange_us;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) {
    return std::nan("");
  }
  std::sort(v.begin(), v.end());
  // Nearest rank.
  const auto index = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(index, 1)) - 1];
}

// A host program: `steps` times ShareMemHandles{SEND to rank+1, RECV from rank-1}, followed,
// with `transfers`, by the SEND and RECV over kCuda and their Waits (the order of nvFuser's
// P2PCommunicationTest.CudaComm under the default get protocol).
struct RingProgram {
  std::unique_ptr<hir::HostIrEvaluator> evaluator;
  std::vector<TensorView*> send_tvs;
  std::vector<TensorView*> recv_tvs;
};

RingProgram makeRing(const World& w, int64_t steps, bool transfers) {
  auto container = std::make_unique<hir::HostIrContainer>();
  FusionGuard fg(container.get());
  RingProgram r;
  for (int64_t step = 0; step < steps; ++step) {
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
        IrBuilder::create<Val>(w.sendPeer(), DataType::Int),
        CommunicatorBackend::kCuda);
    auto* recv = IrBuilder::create<P2PCommunication>(
        P2PCommunicationType::RECV,
        recv_tv,
        IrBuilder::create<Val>(w.recvPeer(), DataType::Int),
        CommunicatorBackend::kCuda);
    container->pushBackTopLevelExprs(
        IrBuilder::create<hir::ShareMemHandles>(std::vector<P2PCommunication*>{send, recv}));
    if (transfers) {
      container->pushBackTopLevelExprs(send);
      container->pushBackTopLevelExprs(recv);
      container->pushBackTopLevelExprs(IrBuilder::create<hir::Wait>(recv));
      container->pushBackTopLevelExprs(IrBuilder::create<hir::Wait>(send));
    }
  }
  r.evaluator = std::make_unique<hir::HostIrEvaluator>(std::move(container), w.communicator);
  return r;
}

using Inputs = std::unordered_map<Val*, PolymorphicValue>;

// Runs `program` on inputs[i % inputs.size()] for warmup + iters iterations, timing the last
// iters; `before` prepares iteration i (untimed), `after` checks it (untimed).
std::vector<double> timeLoop(
    RingProgram& program,
    const std::vector<Inputs>& inputs,
    const DriverOptions& o,
    const std::function<void(int64_t)>& before,
    const std::function<void(int64_t)>& after) {
  std::vector<double> samples;
  for (int64_t it = 0; it < o.warmup + o.iters; ++it) {
    if (before) {
      before(it);
    }
    const Clock::time_point start = Clock::now();
    program.evaluator->runWithInput(inputs[static_cast<size_t>(it) % inputs.size()]);
    synchronizeStream();
    const double us = microsSince(start);
    if (it >= o.warmup) {
      samples.push_back(us);
    }
    if (after) {
      after(it);
    }
  }
  return samples;
}

// (a) and (b): a ring of one step, the same buffers or two alternating sets.
Timing shareMemHandles(World& w, const DriverOptions& o, int64_t buffer_sets) {
  const auto options = optionsOf(w, at::kFloat);
  std::vector<at::Tensor> sends;
  std::vector<at::Tensor> recvs;
  for (int64_t b = 0; b < buffer_sets; ++b) {
    sends.push_back(at::empty({o.elems}, options));
    recvs.push_back(at::empty({o.elems}, options));
  }
  auto value = [&](int64_t it, int64_t rank) {
    return at::arange(o.elems, options) + static_cast<double>(10 * it + 100 * rank);
  };

  Timing t;
  Checks checks;
  {
    RingProgram program = makeRing(w, 1, /*transfers=*/true);
    std::vector<Inputs> inputs;
    for (int64_t b = 0; b < buffer_sets; ++b) {
      inputs.push_back({{program.send_tvs[0], sends[b]}, {program.recv_tvs[0], recvs[b]}});
    }
    t.iteration_us = timeLoop(
        program,
        inputs,
        o,
        [&](int64_t it) {
          sends[it % buffer_sets].copy_(value(it, w.rank));
          synchronizeStream();
        },
        [&](int64_t it) {
          const at::Tensor& got = recvs[it % buffer_sets];
          checks.expect(at::equal(got, value(it, w.recvPeer())), [&] {
            return "rank " + std::to_string(w.rank) + " iteration " + std::to_string(it) +
                  ": received " + describe(got) + ", expected " +
                  describe(value(it, w.recvPeer()));
          });
        });
  }
  // The exchange-only loop starts together on every rank, after the last transfer.
  w.barrier.wait("share_mem_handles_exchange_only");
  {
    RingProgram program = makeRing(w, 1, /*transfers=*/false);
    std::vector<Inputs> inputs;
    for (int64_t b = 0; b < buffer_sets; ++b) {
      inputs.push_back({{program.send_tvs[0], sends[b]}, {program.recv_tvs[0], recvs[b]}});
    }
    t.exchange_us = timeLoop(program, inputs, o, nullptr, nullptr);
  }
  checks.throwIfFailed();
  return t;
}

// (c): the pipelined ring allgather over slices of one allocation of W chunks. Step s sends
// chunk (rank - s) to rank+1 and receives chunk (rank - s - 1) from rank-1.
Inputs ringInputs(const World& w, const RingProgram& r, const at::Tensor& buffer, int64_t chunk) {
  Inputs inputs;
  for (int64_t step = 0; step + 1 < w.size; ++step) {
    const int64_t send_chunk = ((w.rank - step) % w.size + w.size) % w.size;
    const int64_t recv_chunk = ((w.rank - step - 1) % w.size + w.size) % w.size;
    inputs[r.send_tvs[step]] = buffer.narrow(0, send_chunk * chunk, chunk);
    inputs[r.recv_tvs[step]] = buffer.narrow(0, recv_chunk * chunk, chunk);
  }
  return inputs;
}

float ringValue(int64_t it, int64_t rank) {
  return static_cast<float>(1000 * it + rank + 1);
}

Timing ringAllgather(World& w, const DriverOptions& o) {
  const int64_t chunk = o.chunk_elems;
  at::Tensor buffer = at::empty({w.size * chunk}, optionsOf(w, at::kFloat));
  Timing t;
  Checks checks;
  {
    RingProgram program = makeRing(w, w.size - 1, /*transfers=*/true);
    t.iteration_us = timeLoop(
        program,
        {ringInputs(w, program, buffer, chunk)},
        o,
        [&](int64_t it) {
          buffer.fill_(-1.0f);
          buffer.narrow(0, w.rank * chunk, chunk).fill_(ringValue(it, w.rank));
          synchronizeStream();
        },
        [&](int64_t it) {
          const at::Tensor host = buffer.cpu();
          for (int64_t owner = 0; owner < w.size; ++owner) {
            const at::Tensor got = host.narrow(0, owner * chunk, chunk);
            checks.expect(at::all(got == ringValue(it, owner)).item<bool>(), [&] {
              return "rank " + std::to_string(w.rank) + " iteration " + std::to_string(it) +
                    ": the chunk of rank " + std::to_string(owner) + " holds " +
                    std::to_string(got.min().item<float>()) + ".." +
                    std::to_string(got.max().item<float>()) + ", expected " +
                  std::to_string(ringValue(it, owner));
            });
          }
        });
  }
  w.barrier.wait("ring_allgather_exchange_only");
  {
    RingProgram program = makeRing(w, w.size - 1, /*transfers=*/false);
    t.exchange_us =
        timeLoop(program, {ringInputs(w, program, buffer, chunk)}, o, nullptr, nullptr);
  }
  checks.throwIfFailed();
  return t;
}

int32_t readInt(const void* device_ptr) {
  int32_t v = 0;
  cudaCheck(
      cudaMemcpy(&v, device_ptr, sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy from a peer");
  return v;
}

// (d): the rendezvous nvFuser main does for symmetric memory, one fresh tensor per call; the
// first call (which also creates the world's NCCL communicator for the barriers) is not timed.
Timing symmetricSetup(World& w, const DriverOptions& o) {
  constexpr int64_t kElems = 1024;
  Timing t;
  Checks checks;
  for (int64_t call = 0; call <= o.sym_calls; ++call) {
    const std::string tag = w.run_id + "_" + std::to_string(call);
    const int32_t mine = static_cast<int32_t>(1000 * call + w.rank);

    Clock::time_point start = Clock::now();
    at::Tensor local =
        SymmetricTensor::allocate({kElems}, at::kInt, w.communicator->device());
    double us = microsSince(start);
    // Written before the rendezvous, whose closing barrier orders it before every peer's read.
    local.fill_(mine);
    synchronizeStream();

    start = Clock::now();
    SymmetricTensor sym(local);
    const Clock::time_point remote_start = Clock::now();
    sym.setupRemoteHandles(tag);
    const double remote_us = microsSince(remote_start);
    sym.setupContiguousView(tag);
    us += microsSince(start);
    if (call > 0) {
      t.iteration_us.push_back(us);
      t.exchange_us.push_back(remote_us);
    }

    const at::Tensor pointers = sym.remotePointersTensor().cpu();
    const at::Tensor view = sym.getContiguousView();
    checks.expect(view.dim() >= 1 && view.size(0) == w.size, [&] {
      return "the contiguous view has shape " + std::string(c10::str(view.sizes())) +
          ", expected [" + std::to_string(w.size) + ", ...]";
    });
    const int64_t view_stride_bytes = view.stride(0) * view.element_size();
    for (int64_t peer = 0; peer < w.size; ++peer) {
      const int32_t expected = static_cast<int32_t>(1000 * call + peer);
      const auto* remote =
          reinterpret_cast<const char*>(static_cast<uintptr_t>(pointers[peer].item<int64_t>()));
      const char* in_view = static_cast<const char*>(view.data_ptr()) + peer * view_stride_bytes;
      const int32_t first = readInt(remote);
      const int32_t last = readInt(remote + (kElems - 1) * sizeof(int32_t));
      const int32_t through_view = readInt(in_view + (kElems - 1) * sizeof(int32_t));
      checks.expect(first == expected && last == expected && through_view == expected, [&] {
        return "rank " + std::to_string(w.rank) + " call " + std::to_string(call) + ": rank " +
            std::to_string(peer) + "'s buffer reads " + std::to_string(first) + "/" +
            std::to_string(last) + " through remotePointersTensor, " +
            std::to_string(through_view) + " through the contiguous view; expected " +
            std::to_string(expected);
      });
    }
    // Nobody frees or refills a buffer (next call) before every peer has read it.
    w.barrier.wait("symmetric_read_" + std::to_string(call));
  }
  checks.throwIfFailed();
  return t;
}

std::string formatUs(double us) {
  if (std::isnan(us)) {
    return "nan";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", us);
  return buf;
}

} // namespace

int main(int argc, char** argv) {
  int64_t rank = -1;
  try {
    const DriverOptions options = parseOptions(argc, argv);
    Communicator& communicator = Communicator::getInstance();
    if (!communicator.is_available() || communicator.size() < 2 ||
        communicator.getTcpStore() == nullptr) {
      std::fprintf(
          stderr,
          "nvfipc_main_driver: needs a Communicator of at least 2 ranks (RANK, WORLD_SIZE, "
          "LOCAL_RANK, LOCAL_WORLD_SIZE, NVFUSER_MASTER_ADDR/PORT) with a TCPStore\n");
      return 2;
    }
    rank = communicator.deviceId();
    c10d::TCPStore* store = communicator.getTcpStore();
    World w{
        &communicator,
        store,
        rank,
        communicator.size(),
        StoreBarrier(store, communicator.size()),
        ""};
    const std::string run_id_key = "nvfipc_main_driver/run_id";
    if (rank == 0) {
      const std::string id = "nvfipc_drv_" + std::to_string(getpid()) + "_" +
          std::to_string(Clock::now().time_since_epoch().count());
      store->set(run_id_key, std::vector<uint8_t>(id.begin(), id.end()));
    }
    const std::vector<uint8_t> id_bytes = store->get(run_id_key);
    w.run_id.assign(id_bytes.begin(), id_bytes.end());

    struct Scenario {
      const char* name;
      std::function<Timing()> run;
    };
    const std::vector<Scenario> scenarios = {
        {"share_mem_handles_cached", [&] { return shareMemHandles(w, options, 1); }},
        {"share_mem_handles_alternating", [&] { return shareMemHandles(w, options, 2); }},
        {"symmetric_setup", [&] { return symmetricSetup(w, options); }},
        {"ring_allgather", [&] { return ringAllgather(w, options); }},
    };

    int failures = 0;
    for (const Scenario& s : scenarios) {
      if (!options.only.empty() &&
          std::find(options.only.begin(), options.only.end(), s.name) == options.only.end()) {
        continue;
      }
      w.barrier.wait(std::string("start_") + s.name);
      Timing t;
      bool passed = true;
      try {
        t = s.run();
        synchronizeStream();
      } catch (const std::exception& e) {
        passed = false;
        std::printf(
            "CHECK rank=%lld scenario=%s FAIL: %s\n", static_cast<long long>(rank), s.name,
            e.what());
      }
      if (passed) {
        std::printf("CHECK rank=%lld scenario=%s PASS\n", static_cast<long long>(rank), s.name);
      }
      std::fflush(stdout);
      const std::string failed_key = std::string("nvfipc_main_driver/failed/") + s.name;
      store->add(failed_key, passed ? 0 : 1);
      w.barrier.wait(std::string("end_") + s.name);
      const bool all_passed = store->add(failed_key, 0) == 0;
      failures += all_passed ? 0 : 1;
      if (rank == 0) {
        std::string line = std::string("RESULT scenario=") + s.name +
            " world=" + std::to_string(w.size) +
            " iters=" + std::to_string(t.iteration_us.size()) +
            " median_us=" + formatUs(percentile(t.iteration_us, 0.5)) +
            " p90_us=" + formatUs(percentile(t.iteration_us, 0.9));
        if (!t.exchange_us.empty()) {
          line += " exchange_median_us=" + formatUs(percentile(t.exchange_us, 0.5));
        }
        line += all_passed ? " status=PASS" : " status=FAIL";
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
    }
    // Rank 0 hosts the TCPStore: nobody may leave before everybody is done with it.
    w.barrier.wait("exit");
    std::printf(
        "DONE rank=%lld failed_scenarios=%d\n", static_cast<long long>(rank), failures);
    std::fflush(stdout);
    // No Communicator::cleanup(): its world barrier would create a NCCL communicator for this
    // program alone. What nvFuser and the drop-in hold is released at exit.
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FATAL rank=%lld: %s\n", static_cast<long long>(rank), e.what());
    std::fflush(stdout);
    std::_Exit(1);
  }
}
