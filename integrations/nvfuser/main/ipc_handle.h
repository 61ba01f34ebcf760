// clang-format off
/*
 * Drop-in replacement of nvFuser's csrc/multidevice/ipc_handle.h for nvFuser main (NVIDIA/Fuser at
 * 81c4b22fd750d377d69e24928c32233162f6b2bd), backed by the nvfuser-ipc library.
 *
 * Same classes, public methods and exported symbols as that commit's header: IpcSemaphore,
 * IpcHandle, P2pIpcHandle, TensorHash, TensorEqual, IpcHandleCache and the symmetric-memory
 * handles (SymmetricMemoryHandle and its subclasses, SymmetricMemoryHandleCache). The P2P handle
 * exchange goes through nvfuser-ipc; the symmetric-memory handles are built on nvFuser's own
 * SymmetricTensor (VMM). See integrations/nvfuser/README.md, "nvFuser main".
 */
// clang-format on
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/TensorBody.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "expr_evaluator.h"
#include "host_ir/ir.h"
#include "multidevice/symmetric_tensor.h"
#include "multidevice/utils.h"
#include "visibility.h"

namespace nvfuser {

namespace hir {
class SymmetricContiguousView;
} // namespace hir

// Values of the 32-bit semaphores of multidevice/cuda_p2p.cpp's protocols. nvfuser-ipc's channel
// semaphores start at 0, which is kIdle.
// NOLINTNEXTLINE(performance-enum-size)
enum class IpcSemaphore : cuuint32_t { kIdle, kInProgress };

// One side of a P2P communication as this process sees it: a device buffer and its semaphore.
//
// Three kinds:
//  * a view of memory whose mappings nvfuser-ipc's handle cache owns (what IpcHandleCache hands
//    out): IpcHandle(ptr, semaphore[, tensor]);
//  * this rank's tensor, exported with a semaphore of its own: IpcHandle(tensor). Its byte form
//    is toBytes(handle) (multidevice/ipc_utils.h);
//  * another rank's exported handle, imported from that byte form: IpcHandle(bytes).
// Export and import go through nvfuser-ipc's CUDA IPC primitives.
class IpcHandle {
 public:
  NVF_API IpcHandle(at::Tensor tensor);
  NVF_API ~IpcHandle();

  // Imports the byte form (toBytes) of an IpcHandle(tensor) made by another rank.
  NVF_API IpcHandle(std::vector<uint8_t> data);

  // A view: `ptr` and `semaphore` stay owned by their allocator or mapper; `tensor`, when
  // defined, is kept alive as long as the handle.
  NVF_API IpcHandle(
      void* ptr,
      IpcSemaphore* semaphore,
      at::Tensor tensor = at::Tensor());

  IpcHandle(const IpcHandle&) = delete;
  IpcHandle& operator=(const IpcHandle&) = delete;

  void* ptr() const {
    return ptr_;
  }

  auto semaphore() const {
    return semaphore_;
  }

 private:
  enum class Kind : uint8_t { kView, kExported, kImported };

  // What an exporter publishes and an importer opens: trivially copyable, so that it survives
  // the byte form.
  struct Record {
    cudaIpcMemHandle_t buffer;
    int64_t buffer_offset;
    cudaIpcMemHandle_t semaphore;
    int64_t semaphore_offset;
    int64_t rank;
  };

  void* ptr_ = nullptr;
  IpcSemaphore* semaphore_ = nullptr;
  Kind kind_ = Kind::kView;
  Record record_{};
  // The buffer of a view or an export, kept alive with the handle.
  at::Tensor tensor_;
  // The semaphore of an export.
  at::Tensor semaphore_tensor_;
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

// Hash and equality of a tensor as a buffer: which memory it views (data pointer, storage
// offset, element size, numel). Equality is identity of that view (same data pointer, offset,
// dtype, sizes and strides), never the contents: comparing contents would launch a kernel and
// synchronise the host, and a buffer holding NaNs would never equal itself.
struct TensorHash {
  std::size_t operator()(const at::Tensor& tensor) const {
    std::size_t h = std::hash<const void*>()(tensor.data_ptr());
    auto mix = [&h](std::size_t v) {
      h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    mix(std::hash<int64_t>()(tensor.storage_offset()));
    mix(std::hash<int64_t>()(tensor.element_size()));
    mix(std::hash<int64_t>()(tensor.numel()));
    return h;
  }
};

struct TensorEqual {
  bool operator()(const at::Tensor& lhs, const at::Tensor& rhs) const {
    if (!lhs.defined() || !rhs.defined()) {
      return lhs.defined() == rhs.defined();
    }
    return lhs.data_ptr() == rhs.data_ptr() &&
        lhs.storage_offset() == rhs.storage_offset() &&
        lhs.scalar_type() == rhs.scalar_type() &&
        lhs.device() == rhs.device() && lhs.sizes() == rhs.sizes() &&
        lhs.strides() == rhs.strides();
  }
};

// Exchanges and caches the handles of P2P communications through nvfuser-ipc.
//
// exchangeHandles is collective between the ranks its communications name, not the world:
// each peer calls it with the matching communication. No store traffic, no barrier and no GPU
// work when neither side's buffer changed; at most two store round trips otherwise. Records
// are keyed per channel and buffer version, so no barrier is needed to keep a re-export from
// overwriting an unread record. Cache keys are the identity of the buffer (data pointer,
// storage offset, numel, dtype), the evaluated peer and the communication.
class IpcHandleCache {
 public:
  explicit IpcHandleCache(const ExpressionEvaluator* expr_evaluator);
  ~IpcHandleCache();

  // Exports this rank's buffers, imports the peers', and fills the cache. Must be called before
  // get() for a communication, and again whenever its buffer or peer may have changed.
  void exchangeHandles(const std::vector<P2PCommunication*>& communications);

  // The handles of `communication`'s current buffer and peer; throws when not exchanged.
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

  // A communication with one peer (in a stream-parallel loop one P2PCommunication talks to a
  // different peer in each iteration, and each of them is a channel of its own).
  using ChannelId = std::pair<P2PCommunication*, int64_t>;

  struct Channel {
    // nvfuser-ipc's tags of the channel's slots, equal on both ranks: exchange n of the channel
    // uses slot n mod slots (see semaphoreSlots in ipc_handle.cpp).
    std::vector<std::string> slot_tags;
    // Exchanges of this channel so far (equal on both ranks: every exchange pairs one call on each).
    uint64_t exchanges = 0;
    // The key it was last exchanged with, to drop the entry of a replaced buffer.
    std::optional<KeyType> last_key;
  };

  KeyType getKey(P2PCommunication* comm) const;
  static KeyType makeKey(
      P2PCommunication* comm,
      int64_t peer,
      const at::Tensor& buffer);

  // The channel of `comm` towards `peer`, named when first seen: the ordered pair of ranks and
  // its position among this cache's channels between that pair, in the order they were first
  // exchanged (program order, the same on both ranks).
  Channel& channel(P2PCommunication* comm, int64_t my_rank, int64_t peer);

  const ExpressionEvaluator* expr_evaluator_;
  std::map<ChannelId, Channel> channels_;
  std::unordered_map<std::string, int64_t> pair_counts_;
  std::unordered_map<KeyType, std::unique_ptr<P2pIpcHandle>, KeyType::Hash>
      handles_;
};

// Base class of the symmetric-memory handles of the CUDA backend's collectives, each backed by
// SymmetricTensor (CUDA VMM, NVLS multicast).
class SymmetricMemoryHandle {
 public:
  virtual ~SymmetricMemoryHandle() = default;
};

// A broadcast: the buffer and one semaphore, mapped on every rank, and bound to a multicast
// object exported by `root` when the multicast protocol is memcpy or multimem.
class SymMemForBroadcast : public SymmetricMemoryHandle {
 public:
  SymMemForBroadcast(
      Communication* communication,
      int64_t root,
      at::Tensor buffer);

  // One of several broadcasts (e.g. of an allgather), told apart by `name_suffix`.
  SymMemForBroadcast(
      at::Tensor buffer,
      int64_t root,
      const std::string& name_suffix);

  ~SymMemForBroadcast() override = default;

  void* bufferMulticastPtr() const;

  void* bufferUnicastPtr(int64_t rank) const;

  void* semaphoreMulticastPtr() const;

  void* semaphoreUnicastPtr(int64_t rank) const;

 private:
  std::unique_ptr<SymmetricTensor> buffer_;
  std::unique_ptr<SymmetricTensor> semaphore_;
};

// An allreduce with NVLink SHARP: every rank copies its input into a symmetric buffer bound to a
// multicast object (exported by rank 0); a multimem ld_reduce from the multicast address reads
// the reduction. One semaphore per rank.
class SymmetricMemoryForAllreduce : public SymmetricMemoryHandle {
 public:
  SymmetricMemoryForAllreduce(
      Communication* communication,
      at::Tensor output_buffer);

  ~SymmetricMemoryForAllreduce() override = default;

  // This rank's symmetric input buffer (copy the input here before reducing).
  at::Tensor inputBuffer() const;

  // The multicast address of the input buffers (the same on every rank).
  void* multicastPtr() const;

  // Semaphore `root_rank` of `rank`'s semaphore array.
  void* semaphoreUnicastPtr(int64_t root_rank, int64_t rank) const;

  size_t sizeBytes() const {
    return size_bytes_;
  }

 private:
  size_t size_bytes_ = 0;
  std::unique_ptr<SymmetricTensor> input_;
  std::unique_ptr<SymmetricTensor> semaphores_;
};

// A reduce to `root` with NVLink SHARP: as the allreduce, with the multicast object exported by
// the root and a single semaphore per rank.
class SymmetricMemoryForReduce : public SymmetricMemoryHandle {
 public:
  SymmetricMemoryForReduce(
      Communication* communication,
      int64_t root,
      at::Tensor output_buffer);

  ~SymmetricMemoryForReduce() override = default;

  at::Tensor inputBuffer() const;
  void* multicastPtr() const;

  void* semaphoreUnicastPtr(int64_t rank) const;

  size_t sizeBytes() const {
    return size_bytes_;
  }

 private:
  size_t size_bytes_ = 0;
  std::unique_ptr<SymmetricTensor> input_;
  std::unique_ptr<SymmetricTensor> semaphore_;
};

// An allgather as one broadcast per rank: the full output buffer is symmetric (slices are not
// VMM-aligned, so the whole buffer is mapped), root r's slice starts at r * slice size; one
// semaphore per root.
class SymMemForAllgather : public SymmetricMemoryHandle {
 public:
  SymMemForAllgather(Communication* communication, at::Tensor buffer);

  ~SymMemForAllgather() override = default;

  void* bufferMulticastPtr(int64_t root_rank) const;

  void* bufferUnicastPtr(int64_t root_rank, int64_t rank) const;

  void* semaphoreMulticastPtr(int64_t root_rank) const;

  void* semaphoreUnicastPtr(int64_t root_rank, int64_t rank) const;

 private:
  int64_t slice_size_bytes_ = 0;
  std::unique_ptr<SymmetricTensor> buffer_;
  std::unique_ptr<SymmetricTensor> semaphores_;
};

// hir::SymmetricContiguousView: the ranks' shards of a symmetric tensor mapped side by side into
// one contiguous tensor.
class SymMemForContiguousView : public SymmetricMemoryHandle {
 public:
  SymMemForContiguousView(
      at::Tensor buffer,
      hir::SymmetricContiguousView* expr);

  ~SymMemForContiguousView() override = default;

  // The contiguous view over every rank's shard.
  at::Tensor tensor() const {
    return tensor_;
  }

 private:
  std::unique_ptr<SymmetricTensor> sym_tensor_;
  at::Tensor tensor_;
};

// The symmetric memory of one alltoallv context (e.g. "moe_dispatch"): the counts exchange, the
// per-pair semaphores, and named receive buffers with the peers' addresses. Set up (a
// rendezvous of all ranks) on construction and on the first recv() of a name; afterwards every
// call is local, and the semaphore operations are stream memory operations that a CUDA graph
// can capture and replay any number of times.
class SymMemForAlltoallv : public SymmetricMemoryHandle {
 public:
  SymMemForAlltoallv(at::Device device, const std::string& tag);

  ~SymMemForAlltoallv() override = default;

  // [world] int64: this rank's send count for each peer, read by the peers.
  const at::Tensor& syncBuffer() const {
    return sync_buf_;
  }
  CUdeviceptr syncRemotePtr(int64_t rank) const {
    return sync_ptrs_.at(rank);
  }

  // Semaphores: [2 * world] int32 per rank, slot p of each half belonging to peer p:
  //   [0, world)          counts ready, signalled by peer p
  //   [world, 2 * world)  done, signalled by peer p
  // A slot is signalled (kInProgress) only by its peer and reset (kIdle) only by its owner.

  int64_t worldSize() const {
    return world_size_;
  }
  int64_t myRank() const {
    return my_rank_;
  }

  // Counts exchange, split so that the caller reads the counts between wait and reset.
  void signalCountsReady(CUstream stream);
  void waitCountsReady(CUstream stream);
  void resetCountsSem(CUstream stream);

  // Completion barrier among all ranks: signal, wait and reset.
  void doneBarrier(CUstream stream);

  struct RecvHandle {
    at::Tensor buffer;
    at::Tensor remote_ptrs; // CUDA [world] int64: each rank's address of `buffer`
  };

  //! The receive buffer `name`, created (a rendezvous of all ranks) on first use with a first
  //! dimension of `first_dim`. Later calls return it when it is large enough, and fail otherwise:
  //! a new buffer would invalidate CUDA graphs that captured the old address.
  const RecvHandle& recv(
      const std::string& name,
      int64_t first_dim,
      at::IntArrayRef extra_sizes,
      at::ScalarType dtype,
      at::Device device);

 private:
  // Semaphore slot `slot` of `rank`'s counts or done half.
  CUdeviceptr countsSemAddr(int64_t rank, int64_t slot) const;
  CUdeviceptr doneSemAddr(int64_t rank, int64_t slot) const;

  using SemAddr = CUdeviceptr (SymMemForAlltoallv::*)(int64_t, int64_t) const;
  // One cuStreamBatchMemOp over the peers: signal `value` into my slot of each peer's
  // semaphores, wait for `value` in each peer's slot of mine, or reset each peer's slot of mine.
  void batchSignal(CUstream stream, cuuint32_t value, SemAddr addr);
  void batchWait(CUstream stream, cuuint32_t value, SemAddr addr);
  void batchReset(CUstream stream, cuuint32_t value, SemAddr addr);

  int64_t world_size_ = 0;
  int64_t my_rank_ = 0;
  std::string tag_;

  at::Tensor sync_buf_;
  std::unique_ptr<SymmetricTensor> sync_sym_;
  std::vector<CUdeviceptr> sync_ptrs_;

  at::Tensor sem_buf_;
  std::unique_ptr<SymmetricTensor> sem_sym_;
  std::vector<CUdeviceptr> sem_ptrs_;

  struct RecvEntry {
    std::unique_ptr<SymmetricTensor> sym;
    RecvHandle handle;
    int64_t first_dim = 0;
  };
  std::unordered_map<std::string, RecvEntry> recv_entries_;
};

// Symmetric-memory handles by (buffer, expression, root): created on the first get() of a key
// (a rendezvous of all ranks), plain lookups afterwards (no synchronisation on a hit).
class SymmetricMemoryHandleCache {
 public:
  SymmetricMemoryHandleCache() = default;
  ~SymmetricMemoryHandleCache() = default;

  struct KeyType {
    at::Tensor buffer;
    Expr* expr;
    int64_t root;

    bool operator==(const KeyType& other) const {
      return TensorEqual{}(buffer, other.buffer) && expr == other.expr &&
          root == other.root;
    }

    struct Hash {
      std::size_t operator()(const KeyType& key) const {
        return TensorHash{}(key.buffer) ^
            (std::hash<Expr*>()(key.expr) << 1) ^
            (std::hash<int64_t>()(key.root) << 2);
      }
    };
  };

  // The handle of `key`, created on first use.
  SymmetricMemoryHandle* get(KeyType key);

 private:
  static std::unique_ptr<SymmetricMemoryHandle> create(const KeyType& key);

  std::unordered_map<
      KeyType,
      std::unique_ptr<SymmetricMemoryHandle>,
      KeyType::Hash>
      handles_;
};

// ---- SymmetricTensor's remote handles through nvfuser-ipc ---------------------------------------
//
// With the overlay applied to multidevice/symmetric_tensor.cpp (integrations/nvfuser/main/
// symmetric_overlay.py), SymmetricTensor::setupRemoteHandles, setupContiguousView and the
// destructor's unmapping call these instead of nvFuser's Unix sockets and world barriers: one
// nvfuser-ipc symmetric rendezvous per set-up, in which each rank waits only for the peers it
// maps. Multicast (setupMulticast) stays nvFuser's own. `owner` is the SymmetricTensor.
namespace nvfipc_symmetric {

// Maps every other rank's copy of `local` (VMM memory from SymmetricTensor::allocate) set up
// under `tag`; returns every rank's address in this process, in rank order (this rank's own
// data pointer for itself).
std::vector<CUdeviceptr> setupRemoteHandles(
    const void* owner,
    const at::Tensor& local,
    const std::string& tag);

// One tensor over a virtual range that holds every rank's copy in rank order ([world, ...local's
// sizes without its size-1 dimension 0]); the mapping belongs to `owner`'s set-up and is released
// with it.
at::Tensor contiguousView(const void* owner, const at::Tensor& local);

// Unmaps what `owner`'s set-up mapped here (peers' copies, the contiguous view). Never throws.
void release(const void* owner) noexcept;

} // namespace nvfipc_symmetric

} // namespace nvfuser
