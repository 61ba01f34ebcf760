// nvFuser's IPC scenarios, written once against the C++ wrapper and run on any memory kind:
//
// * ShareIpcMemHandles (MultiDeviceTest.ShareIpcMemHandles): int32 x4, 10 repetitions; each
//   rank puts its send buffer into the next rank's receive buffer through the peer pointer,
//   then a barrier; expects arange(4) + 10(i+1) + 100*recv_peer.
// * CudaComm (P2PCommunicationTest.CudaComm): float x8, 32 repetitions of send post, receive
//   post (32 bytes) and send wait over the semaphore protocol; expects
//   arange(8) + 10i + 100*recv_peer.
// * ChannelComm: CudaComm's transfers on channels opened once (HandleCache::channel), 16
//   repetitions; at the 8th every rank replaces its send buffer: the old channels throw
//   InvalidStateError, re-opened ones carry on; after the cache is closed they throw again.
// * RingAllgather: a pipelined ring allgather (world-1 steps, each chunk in slices that are
//   forwarded as soon as they arrive), 5 repetitions; every rank ends with every chunk.
// * Symmetric: every rank maps every other rank's buffer with one symmetric rendezvous (no
//   barrier), checks each, and a second rendezvous costs no store round trip; reads every
//   buffer through the contiguous view (device memory that is not VMM: refused as unsupported);
//   releases and rendezvouses again with no store round trip; a second release is refused.
//
// Each throws ScenarioFailure naming rank, repetition and element on a wrong value; library
// errors arrive as nvfipc::Error.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory.hpp"
#include "nvfuser_ipc.hpp"

namespace nvfipc_cxx {

struct ScenarioFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Collective over the ranks of `ctx`; `scope` names the handle cache (equal on every rank,
// distinct per scenario run in one process).
void RunShareIpcMemHandles(const nvfipc::Context& ctx, Memory& mem, const std::string& scope);
void RunCudaComm(const nvfipc::Context& ctx, Memory& mem, const std::string& scope);
void RunChannelComm(const nvfipc::Context& ctx, Memory& mem, const std::string& scope);
void RunRingAllgather(const nvfipc::Context& ctx, Memory& mem, const std::string& scope);
void RunSymmetric(const nvfipc::Context& ctx, Memory& mem, const std::string& scope);

// The scenario names above without "Run", and a dispatcher.
const std::vector<std::string>& ScenarioNames();
void RunScenario(const std::string& name, const nvfipc::Context& ctx, Memory& mem,
                 const std::string& scope);

}  // namespace nvfipc_cxx
