// clang-format off
/*
 * Drop-in replacement of nvFuser's csrc/multidevice/ipc_handle.h (NVIDIA/Fuser at
 * 3fe1c32124ea83f90253496cecbe5becf46c9df0), backed by the nvfuser-ipc library.
 * Same class names and the public methods nvFuser calls: IpcHandle::ptr/semaphore,
 * P2pIpcHandle::local/peer, IpcHandleCache(const ExpressionEvaluator&),
 * IpcHandleCache::exchangeHandles and IpcHandleCache::get.
 */
// clang-format on
#pragma once
#include <ATen/core/TensorBody.h>
#include <c10/core/ScalarType.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <expr_evaluator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace nvfuser {

// Values of the 32-bit semaphores used by get_zcopy (multidevice/cuda_p2p.cpp).
enum class IpcSemaphore : cuuint32_t { kReady, kInUse };

// One side of a P2P channel as seen from this process: a device buffer and its semaphore. For
// the local side both are this rank's own memory; for the peer side both are the peer's memory
// mapped into this process. The mappings belong to the IpcHandleCache that produced the handle.
class IpcHandle {
 public:
  IpcHandle(void* ptr, IpcSemaphore* semaphore) : ptr_(ptr), semaphore_(semaphore) {}

  void* ptr() const {
    return ptr_;
  }

  auto semaphore() const {
    return semaphore_;
  }

 private:
  void* ptr_;
  IpcSemaphore* semaphore_;
};

// The two IpcHandles of one P2P communication.
class P2pIpcHandle {
 public:
  P2pIpcHandle(
      std::unique_ptr<IpcHandle> local,
      std::unique_ptr<IpcHandle> peer)
      : local_(std::move(local)), peer_(std::move(peer)) {}

  const auto& local() const {
    return *local_;
  }

  const auto& peer() const {
    return *peer_;
  }

 private:
  std::unique_ptr<IpcHandle> local_;
  std::unique_ptr<IpcHandle> peer_;
};

// Exchanges and caches the handles of P2P communications through nvfuser-ipc.
//
// exchangeHandles is collective between the ranks its communications name (not the world):
// each peer must call it with the matching communication. It costs no store traffic, no barrier
// and no GPU work when neither side's buffer changed, and at most two store round trips
// otherwise; records are keyed per channel and buffer version, so no world barrier is needed
// to keep a re-export from overwriting an unread handle. Cache keys are the identity of the
// buffer (data pointer, storage offset, numel, dtype), the evaluated peer and the
// communication pointer; contents are never compared.
class IpcHandleCache {
 public:
  IpcHandleCache(const ExpressionEvaluator& expr_evaluator);
  ~IpcHandleCache();

  // Exports this rank's buffers, imports the peers', and fills the cache. Must be called
  // before get() for a communication, and again whenever its buffer may have changed.
  void exchangeHandles(const std::vector<P2PCommunication*>& communications);

  // The handles of `communication`'s current buffer; throws when it was not exchanged.
  const P2pIpcHandle& get(P2PCommunication* communication) const;

 private:
  struct KeyType {
    int64_t peer;
    const void* data_ptr;
    int64_t storage_offset;
    int64_t numel;
    c10::ScalarType dtype;
    P2PCommunication* comm;

    bool operator==(const KeyType& other) const {
      return peer == other.peer && data_ptr == other.data_ptr &&
          storage_offset == other.storage_offset && numel == other.numel &&
          dtype == other.dtype && comm == other.comm;
    }

    struct Hash {
      std::size_t operator()(const KeyType& key) const;
    };
  };

  // The channel of `comm` (equal on both ranks of the communication): the ordered pair of ranks
  // and the position of `comm` among this cache's communications between that pair, in the
  // order they were first exchanged (program order, the same on both ranks).
  const std::string& channelTag(
      P2PCommunication* comm,
      int64_t my_rank,
      int64_t peer);

  KeyType getKey(P2PCommunication* comm) const;

  const ExpressionEvaluator& expr_evaluator_;
  std::unordered_map<P2PCommunication*, std::string> tags_;
  std::unordered_map<std::string, int64_t> pair_counts_;
  std::unordered_map<KeyType, std::unique_ptr<P2pIpcHandle>, KeyType::Hash>
      handles_;
  // The key each communication was last exchanged with, to drop entries of replaced buffers.
  std::unordered_map<P2PCommunication*, KeyType> last_key_;
};

} // namespace nvfuser
