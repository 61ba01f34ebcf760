// clang-format off
/*
 * Drop-in replacement of nvFuser's csrc/multidevice/ipc_handle.cpp (NVIDIA/Fuser at
 * 3fe1c32124ea83f90253496cecbe5becf46c9df0), backed by the nvfuser-ipc library through its
 * C++ wrapper (nvfuser_ipc.hpp) and, with NVFUSER_DISTRIBUTED, its c10d store adapter
 * (nvfuser_ipc_c10d.hpp) over the Communicator's TCPStore.
 */
// clang-format on
#include <multidevice/communication.h>
#include <multidevice/communicator.h>
#include <multidevice/ipc_handle.h>

#include <nvfuser_ipc.hpp>
#ifdef NVFUSER_DISTRIBUTED
#include <nvfuser_ipc_c10d.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace nvfuser {
namespace {
// How to make this nvFuser's Communicator available (for nvfuser_ipc_dropin.h's error).
constexpr const char* kCommunicatorHint =
    "set the rank and size variables, e.g. run under mpirun";
} // namespace
} // namespace nvfuser

// The process's nvfuser-ipc state, error translation, channel names and key hash, shared with the
// drop-in for nvFuser main (integrations/nvfuser/common, on the include path by nvfuser_ipc.cmake).
#include "nvfuser_ipc_dropin.h"

namespace nvfuser {

std::size_t IpcHandleCache::KeyType::Hash::operator()(
    const KeyType& key) const {
  return hashOfKey(key);
}

IpcHandleCache::IpcHandleCache(const ExpressionEvaluator& expr_evaluator)
    : expr_evaluator_(expr_evaluator) {}

IpcHandleCache::~IpcHandleCache() = default;

IpcHandleCache::KeyType IpcHandleCache::getKey(P2PCommunication* comm) const {
  const auto peer = expr_evaluator_.evaluate(comm->peer()).as<int64_t>();
  const auto buffer = expr_evaluator_.evaluate(comm->buffer()).as<at::Tensor>();
  return KeyType{
      peer,
      buffer.data_ptr(),
      buffer.storage_offset(),
      buffer.numel(),
      buffer.scalar_type(),
      comm};
}

const std::string& IpcHandleCache::channelTag(
    P2PCommunication* comm,
    int64_t my_rank,
    int64_t peer) {
  auto known = tags_.find(comm);
  if (known != tags_.end()) {
    return known->second;
  }
  const std::string pair = channelPair(comm, my_rank, peer);
  const int64_t index = pair_counts_[pair]++;
  return tags_.emplace(comm, pair + "_" + std::to_string(index)).first->second;
}

void IpcHandleCache::exchangeHandles(
    const std::vector<P2PCommunication*>& communications) {
  const int64_t my_rank = Communicator::getInstance().deviceId();

  std::vector<nvfipc::Request> requests;
  std::vector<KeyType> keys;
  requests.reserve(communications.size());
  keys.reserve(communications.size());
  for (P2PCommunication* comm : communications) {
    KeyType key = getKey(comm);
    NVF_ERROR(
        key.peer != my_rank,
        "send to self not supported: ",
        comm->toString());
    const auto buffer =
        expr_evaluator_.evaluate(comm->buffer()).as<at::Tensor>();
    NVF_ERROR(
        buffer.is_contiguous(),
        "IpcHandle only supports contiguous tensors: ",
        comm->toString());
    NVF_ERROR(
        buffer.is_cuda(),
        "IpcHandle only supports CUDA tensors: ",
        comm->toString());
    nvfipc::Request request;
    request.peer = key.peer;
    request.direction = directionOf(comm);
    request.kind = nvfipc::MemKind::Device;
    request.tag = channelTag(comm, my_rank, key.peer);
    request.ptr = nvfipc::Request::address(buffer.data_ptr());
    request.bytes = static_cast<uint64_t>(buffer.numel()) *
        static_cast<uint64_t>(buffer.element_size());
    requests.push_back(std::move(request));
    keys.push_back(key);
  }

  translated("nvfuser-ipc exchangeHandles", [&] {
    std::lock_guard<std::mutex> lock(processStateMutex());
    ProcessState& state = processState();
    // Every communication goes to the library, cached or not: a hit costs a few shared-memory
    // loads there, and it is how both sides learn that the other's buffer changed.
    state.cache.exchangeHandles(requests);

    for (size_t i = 0; i < requests.size(); ++i) {
      const nvfipc::P2pHandle h = state.cache.get(requests[i]);
      auto local = std::make_unique<IpcHandle>(
          h.local().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.local().semaphore()));
      auto peer = std::make_unique<IpcHandle>(
          h.peer().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.peer().semaphore()));
      P2PCommunication* comm = communications[i];
      auto last = last_key_.find(comm);
      if (last != last_key_.end() && !(last->second == keys[i])) {
        handles_.erase(last->second); // the communication's previous buffer
      }
      last_key_[comm] = keys[i];
      auto& slot = handles_[keys[i]];
      if (slot == nullptr) {
        slot =
            std::make_unique<P2pIpcHandle>(std::move(local), std::move(peer));
      } else {
        // Keep the P2pIpcHandle object (references to it stay valid), refresh its content.
        *slot = P2pIpcHandle(std::move(local), std::move(peer));
      }
    }
  });
}

const P2pIpcHandle& IpcHandleCache::get(P2PCommunication* communication) const {
  auto it = handles_.find(getKey(communication));
  NVF_ERROR(
      it != handles_.end(),
      "No remote buffer found for ",
      communication->toString(),
      "; exchange its handles (hir::ShareMemHandles) first");
  return *it->second;
}

} // namespace nvfuser
