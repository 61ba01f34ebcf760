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

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace nvfuser {

namespace {

// The nvfuser-ipc context of this process, shared by every IpcHandleCache. With
// NVFUSER_DISTRIBUTED it runs over the Communicator's c10d::TCPStore (through the adapter,
// which keeps a reference to it); without, over nvfuser-ipc's own store, found from the same
// environment variables the Communicator reads.
std::shared_ptr<nvfipc::Context> processContext() {
  static std::mutex mutex;
  static std::shared_ptr<nvfipc::Context> context;
  std::lock_guard<std::mutex> lock(mutex);
  if (context != nullptr) {
    return context;
  }
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
  context = std::make_shared<nvfipc::Context>(nvfipc::Context::create(
      communicator.deviceId(),
      communicator.size(),
      communicator.local_rank(),
      communicator.local_size(),
      ipc_store));
#else
  context = std::make_shared<nvfipc::Context>(nvfipc::Context::fromEnv());
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
#endif
  return context;
}

// Caches are created in the same order on every rank (one per host program), so a counter
// gives each one a scope that is equal on all ranks.
std::string nextCacheScope() {
  static std::atomic<int64_t> next{0};
  return "nvfuser_ipc_handle_cache_" + std::to_string(next++);
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

struct IpcHandleCache::Backend {
  std::shared_ptr<nvfipc::Context> context;
  nvfipc::HandleCache cache;
};

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

void IpcHandleCache::exchangeHandles(
    const std::vector<P2PCommunication*>& communications) {
  const int64_t my_rank = Communicator::getInstance().deviceId();

  // One request per communication. The tag pairs a rank's SEND with the peer's RECV: both
  // sides name the channel after the ordered pair of ranks (as upstream's store keys do) and
  // the position of the communication among those with the same peer and direction.
  std::vector<nvfipc::Request> requests;
  std::vector<KeyType> keys;
  requests.reserve(communications.size());
  keys.reserve(communications.size());
  std::unordered_map<std::string, int64_t> occurrences;
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
    const nvfipc::Direction direction = directionOf(comm);
    const int64_t src =
        direction == nvfipc::Direction::Send ? my_rank : key.peer;
    const int64_t dst =
        direction == nvfipc::Direction::Send ? key.peer : my_rank;
    const std::string pair =
        "P2PComm_dst=" + std::to_string(dst) + "_src=" + std::to_string(src);
    const int64_t index = occurrences[pair]++;
    nvfipc::Request request;
    request.peer = key.peer;
    request.direction = direction;
    request.kind = nvfipc::MemKind::Device;
    request.tag = pair + "_" + std::to_string(index);
    request.ptr = nvfipc::Request::address(buffer.data_ptr());
    request.bytes = static_cast<uint64_t>(buffer.numel()) *
        static_cast<uint64_t>(buffer.element_size());
    requests.push_back(std::move(request));
    keys.push_back(key);
  }

  translated("nvfuser-ipc exchangeHandles", [&] {
    if (backend_ == nullptr) {
      std::shared_ptr<nvfipc::Context> context = processContext();
      nvfipc::HandleCache cache(*context, nextCacheScope());
      backend_ = std::make_unique<Backend>(
          Backend{std::move(context), std::move(cache)});
    }
    // Every communication goes to the library, cached or not: a hit costs a few shared-memory
    // loads there, and it is how both sides learn that the other's buffer changed.
    backend_->cache.exchangeHandles(requests);

    for (size_t i = 0; i < requests.size(); ++i) {
      const nvfipc::P2pHandle h = backend_->cache.get(requests[i]);
      auto local = std::make_unique<IpcHandle>(
          h.local().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.local().semaphore()));
      auto peer = std::make_unique<IpcHandle>(
          h.peer().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.peer().semaphore()));
      P2PCommunication* comm = communications[i];
      auto last = last_key_.find(comm);
      if (last != last_key_.end() && !(last->second == keys[i])) {
        handles_.erase(last->second);  // the communication's previous buffer
      }
      last_key_[comm] = keys[i];
      auto& slot = handles_[keys[i]];
      if (slot == nullptr) {
        slot = std::make_unique<P2pIpcHandle>(std::move(local), std::move(peer));
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
