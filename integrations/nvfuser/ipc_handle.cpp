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

// The nvfuser-ipc state of this process: one context and one handle cache, shared by every
// IpcHandleCache. One cache per process (not one per IpcHandleCache) means the channels of two
// ranks never depend on how many IpcHandleCaches (HostIrEvaluators) each process created, or in
// which order: a channel is named only after the two ranks and the position of the
// communication among those between them (see IpcHandleCache::channelTag).
//
// With NVFUSER_DISTRIBUTED it runs over the Communicator's c10d::TCPStore (through the adapter,
// which keeps a reference to it); without, over nvfuser-ipc's own store, found from the same
// environment variables the Communicator reads.
//
// Lifetime: created on the first exchange and released by an atexit handler registered then,
// which runs after main() returns (and after Communicator::cleanup()) but before the static
// objects that existed before the first exchange are destroyed, so c10d's store and torch are
// still intact. The release closes the cache (peers' mappings released, bounded by the cache's
// linger) and the context; errors there are reported on stderr, never thrown. The object itself
// is never destroyed by static destruction.
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
  ProcessState* state = processStateSlot();
  processStateSlot() = nullptr;
  if (state == nullptr) {
    return;
  }
  try {
    state->cache = nvfipc::HandleCache();
    state->context.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvfuser-ipc: releasing the IPC handle cache at exit: %s\n", e.what());
  }
  delete state;
}

std::shared_ptr<nvfipc::Context> createContext() {
  Communicator& communicator = Communicator::getInstance();
  NVF_ERROR(
      communicator.is_available(),
      "IpcHandleCache needs an available Communicator (set the rank and size "
      "variables, e.g. run under mpirun)");
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
  NVF_ERROR(
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

nvfipc::Direction directionOf(const P2PCommunication* comm) {
  return comm->type() == P2PCommunicationType::SEND ? nvfipc::Direction::Send
                                                    : nvfipc::Direction::Recv;
}

} // namespace

std::size_t IpcHandleCache::KeyType::Hash::operator()(
    const KeyType& key) const {
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
  const bool send = comm->type() == P2PCommunicationType::SEND;
  const int64_t src = send ? my_rank : peer;
  const int64_t dst = send ? peer : my_rank;
  const std::string pair =
      "P2PComm_dst=" + std::to_string(dst) + "_src=" + std::to_string(src);
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
