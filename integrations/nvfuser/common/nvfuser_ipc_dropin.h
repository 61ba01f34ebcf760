// clang-format off
/*
 * What the two nvFuser drop-ins (ipc_handle.cpp for NVIDIA/Fuser 3fe1c32124ea and
 * main/ipc_handle.cpp for nvFuser main) share, written once: the process's nvfuser-ipc state (one
 * context and one handle cache per process, created on first use, released at exit), the
 * translation of nvfuser-ipc errors into nvFuser's, and the naming of a communication's channel
 * and its key's hash.
 *
 * Included by exactly one translation unit, each drop-in's ipc_handle.cpp, after nvFuser's
 * headers; nvfuser_ipc.cmake puts this directory on codegen_internal's include path. The including
 * file defines, in namespace nvfuser's anonymous namespace and before including this one,
 *   constexpr const char* kCommunicatorHint: how to make nvFuser's Communicator available at
 *   that nvFuser version (the variables its Communicator reads).
 */
// clang-format on
#pragma once

#include "multidevice/communication.h"
#include "multidevice/communicator.h"

#include <nvfuser_ipc.hpp>
#ifdef NVFUSER_DISTRIBUTED
#include <nvfuser_ipc_c10d.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace nvfuser {

namespace {

// ---- the process's nvfuser-ipc state ------------------------------------------------------------

// One nvfuser-ipc context and handle cache per process, shared by every IpcHandleCache. With one
// cache per process the channels of two ranks never depend on how many IpcHandleCaches
// (HostIrEvaluators) each process created, or in which order: a channel is named only after the
// two ranks and the position of the communication among those between them (channelPair).
//
// With NVFUSER_DISTRIBUTED it runs over the Communicator's c10d::TCPStore (the adapter keeps a
// reference to it); without, over nvfuser-ipc's own store, found from the environment the
// Communicator reads.
//
// Created on the first exchange and released by an atexit handler registered then: after main()
// returns and Communicator::cleanup() ran, but before the static objects that existed before the
// first exchange are destroyed, so c10d's store (held by the adapter) and torch are intact. The
// release closes the cache (peers' mappings released, bounded by the cache's linger) and the
// context; errors there go to stderr, never thrown. Never destroyed by static destruction.
struct ProcessState {
  std::shared_ptr<nvfipc::Context> context;
  nvfipc::HandleCache cache;
};

std::mutex& processStateMutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

ProcessState*& processStateSlot() {
  static ProcessState* state = nullptr;
  return state;
}

void releaseProcessState() noexcept {
  std::lock_guard<std::mutex> lock(processStateMutex());
  ProcessState* state = std::exchange(processStateSlot(), nullptr);
  if (state == nullptr) {
    return;
  }
  try {
    state->cache = nvfipc::HandleCache();
    state->context.reset();
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "nvfuser-ipc: releasing the IPC handle cache at exit: %s\n",
        e.what());
  }
  delete state;
}

std::shared_ptr<nvfipc::Context> createContext() {
  Communicator& communicator = Communicator::getInstance();
  NVF_CHECK(
      communicator.is_available(),
      "IpcHandleCache needs an available Communicator (",
      kCommunicatorHint,
      ")");
#ifdef NVFUSER_DISTRIBUTED
  c10d::TCPStore* tcp_store = communicator.getTcpStore();
  NVF_ERROR(tcp_store != nullptr, "the Communicator has no TCPStore");
  c10::intrusive_ptr<c10d::Store> store =
      c10::intrusive_ptr<c10d::TCPStore>::reclaim_copy(tcp_store);
  nvfipc::Store ipc_store = nvfipc::c10d::storeFrom(std::move(store));
  return std::make_shared<nvfipc::Context>(nvfipc::Context::create(
      communicator.deviceId(),
      communicator.size(),
      communicator.local_rank(),
      communicator.local_size(),
      ipc_store));
#else
  auto context = std::make_shared<nvfipc::Context>(nvfipc::Context::fromEnv());
  NVF_CHECK(
      context->rank() == communicator.deviceId() &&
          context->worldSize() == communicator.size(),
      "nvfuser-ipc read rank ",
      context->rank(),
      " of ",
      context->worldSize(),
      " from the environment, the Communicator has ",
      communicator.deviceId(),
      " of ",
      communicator.size());
  return context;
#endif
}

// The process state, created on first use. Callers hold processStateMutex().
ProcessState& processState() {
  ProcessState*& state = processStateSlot();
  if (state == nullptr) {
    auto context = createContext();
    nvfipc::HandleCache cache(*context, "nvfuser_ipc_handle_cache");
    state = new ProcessState{std::move(context), std::move(cache)};
    std::atexit(releaseProcessState);
  }
  return *state;
}

// Runs `body`, turning nvfuser-ipc errors into nvFuser errors that say what was being done.
template <typename F>
auto translated(const char* what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const nvfipc::Error& e) {
    // A user-facing nvFuser error (not an internal assert): timeouts, dead peers, bad buffers.
    nvfCheckFail(
        __func__,
        __FILE__,
        static_cast<uint32_t>(__LINE__),
        std::string(what) + " failed: " + e.what());
  }
}

// ---- channels and cache keys --------------------------------------------------------------------

nvfipc::Direction directionOf(const P2PCommunication* comm) {
  return comm->type() == P2PCommunicationType::SEND ? nvfipc::Direction::Send
                                                    : nvfipc::Direction::Recv;
}

// The ordered pair of ranks a communication's channel is named after, as upstream's store keys
// are: `P2PComm_dst=<dst>_src=<src>`. The channel's tag adds the position of the communication
// among those between the pair (the same on both ranks of an SPMD host program).
std::string channelPair(
    const P2PCommunication* comm,
    int64_t my_rank,
    int64_t peer) {
  const bool send = comm->type() == P2PCommunicationType::SEND;
  const int64_t src = send ? my_rank : peer;
  const int64_t dst = send ? peer : my_rank;
  return "P2PComm_dst=" + std::to_string(dst) + "_src=" + std::to_string(src);
}

// The hash of an IpcHandleCache key: the evaluated buffer's identity (data pointer, storage
// offset, numel, dtype), the evaluated peer and the communication.
template <typename Key>
std::size_t hashOfKey(const Key& key) {
  std::size_t h = std::hash<const void*>()(key.data_ptr);
  auto mix = [&h](std::size_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  mix(std::hash<int64_t>()(key.peer));
  mix(std::hash<int64_t>()(key.storage_offset));
  mix(std::hash<int64_t>()(key.numel));
  mix(std::hash<int>()(static_cast<int>(key.dtype)));
  mix(std::hash<P2PCommunication*>()(key.comm));
  return h;
}

} // namespace

} // namespace nvfuser
