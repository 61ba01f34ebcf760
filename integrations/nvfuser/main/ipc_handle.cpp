// clang-format off
/*
 * Drop-in replacement of nvFuser's csrc/multidevice/ipc_handle.cpp for nvFuser main (NVIDIA/Fuser
 * at 81c4b22fd750d377d69e24928c32233162f6b2bd), backed by the nvfuser-ipc library through its C++
 * wrapper (nvfuser_ipc.hpp) and, with NVFUSER_DISTRIBUTED, its c10d store adapter
 * (nvfuser_ipc_c10d.hpp) over the Communicator's TCPStore. The symmetric-memory handles are built
 * on nvFuser's SymmetricTensor.
 */
// clang-format on
#include "multidevice/ipc_handle.h"

#include "cuda_utils.h"
#include "multidevice/communication.h"
#include "multidevice/communicator.h"
#include "multidevice/ipc_utils.h"

#include <nvfuser_ipc.hpp>
#ifdef NVFUSER_DISTRIBUTED
#include <nvfuser_ipc_c10d.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace nvfuser {
namespace {
// How to make this nvFuser's Communicator available (for nvfuser_ipc_dropin.h's error).
constexpr const char* kCommunicatorHint =
    "set RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, or run under mpirun";
} // namespace
} // namespace nvfuser

// The process's nvfuser-ipc state, error translation, channel names and key hash, shared with the
// drop-in for nvFuser 3fe1c32124ea (integrations/nvfuser/common, on the include path by
// nvfuser_ipc.cmake).
#include "nvfuser_ipc_dropin.h"

namespace nvfuser {

namespace {

// ---- legacy CUDA IPC export and import, through nvfuser-ipc ---------------------------------

static_assert(
    sizeof(cudaIpcMemHandle_t) == sizeof(nvfipc_cuda_ipc_handle),
    "a CUDA IPC handle is 64 bytes");
static_assert(
    sizeof(IpcSemaphore) == sizeof(int32_t),
    "semaphores are 32-bit for the stream memory operations");

int64_t sizeInBytes(const at::Tensor& tensor) {
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

// Exports the allocation holding [ptr, ptr + bytes): its handle and ptr's offset in it.
void exportRange(
    const void* ptr,
    int64_t bytes,
    cudaIpcMemHandle_t& handle,
    int64_t& offset) {
  nvfipc_cuda_ipc_handle exported{};
  uint64_t from_base = 0;
  translated("nvfuser-ipc export", [&] {
    nvfipc::detail::check(
        nvfipc_cuda_ipc_export(
            ptr, static_cast<uint64_t>(bytes), &exported, &from_base),
        "nvfipc_cuda_ipc_export");
  });
  std::memcpy(&handle, exported.bytes, sizeof(handle));
  offset = static_cast<int64_t>(from_base);
}

nvfipc_cuda_ipc_handle toLibrary(const cudaIpcMemHandle_t& handle) {
  nvfipc_cuda_ipc_handle out{};
  std::memcpy(out.bytes, &handle, sizeof(out.bytes));
  return out;
}

// Maps `rank`'s exported allocation; returns the address of `offset` in it.
void* openRange(int64_t rank, const cudaIpcMemHandle_t& handle, int64_t offset) {
  const nvfipc_cuda_ipc_handle h = toLibrary(handle);
  uint64_t base = 0;
  translated("nvfuser-ipc import", [&] {
    nvfipc::detail::check(
        nvfipc_cuda_ipc_open(rank, &h, &base), "nvfipc_cuda_ipc_open");
  });
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(base)) + offset;
}

// Unmaps what openRange mapped; reports failures on stderr (called from a destructor).
void closeRange(int64_t rank, const cudaIpcMemHandle_t& handle) noexcept {
  const nvfipc_cuda_ipc_handle h = toLibrary(handle);
  if (nvfipc_cuda_ipc_close(rank, &h) != NVFIPC_STATUS_OK) {
    std::fprintf(
        stderr,
        "nvfuser-ipc: closing an IPC handle of rank %lld: %s\n",
        static_cast<long long>(rank),
        nvfipc_last_error_message());
  }
}

// Writes `bytes` from host memory to device memory and waits until they have landed, so that a
// peer may read them as soon as the next rendezvous returns.
void copyToDeviceNow(void* dst, const void* src, size_t bytes) {
  NVFUSER_CUDA_RT_SAFE_CALL(
      cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  NVFUSER_CUDA_RT_SAFE_CALL(cudaStreamSynchronize(cudaStreamLegacy));
}

} // namespace

// ---- IpcHandle -----------------------------------------------------------------------------------

IpcHandle::IpcHandle(at::Tensor tensor)
    : ptr_(tensor.data_ptr()), kind_(Kind::kExported), tensor_(std::move(tensor)) {
  NVF_CHECK(tensor_.is_cuda(), "IpcHandle exports CUDA tensors only");
  record_.rank = Communicator::getInstance().deviceId();
  exportRange(
      ptr_, sizeInBytes(tensor_), record_.buffer, record_.buffer_offset);

  // A semaphore of its own, kIdle before anyone can import it.
  semaphore_tensor_ = at::empty(
      {1}, at::TensorOptions().dtype(at::kInt).device(tensor_.device()));
  semaphore_ = static_cast<IpcSemaphore*>(semaphore_tensor_.data_ptr());
  const IpcSemaphore idle = IpcSemaphore::kIdle;
  copyToDeviceNow(semaphore_, &idle, sizeof(idle));
  exportRange(
      semaphore_,
      sizeof(IpcSemaphore),
      record_.semaphore,
      record_.semaphore_offset);
}

IpcHandle::IpcHandle(std::vector<uint8_t> data) : kind_(Kind::kImported) {
  NVF_CHECK(
      data.size() == sizeof(IpcHandle),
      "IpcHandle(bytes) expects toBytes() of an IpcHandle, got ",
      data.size(),
      " bytes instead of ",
      sizeof(IpcHandle));
  const IpcHandle& exported = fromBytes<IpcHandle>(data);
  NVF_CHECK(
      exported.kind_ == Kind::kExported,
      "IpcHandle(bytes) expects the bytes of an IpcHandle(tensor)");
  record_ = exported.record_;
  ptr_ = openRange(record_.rank, record_.buffer, record_.buffer_offset);
  try {
    semaphore_ = static_cast<IpcSemaphore*>(openRange(
        record_.rank, record_.semaphore, record_.semaphore_offset));
  } catch (...) {
    closeRange(record_.rank, record_.buffer);
    throw;
  }
}

IpcHandle::IpcHandle(void* ptr, IpcSemaphore* semaphore, at::Tensor tensor)
    : ptr_(ptr),
      semaphore_(semaphore),
      kind_(Kind::kView),
      tensor_(std::move(tensor)) {}

IpcHandle::~IpcHandle() {
  // Views own nothing; an export's tensors release themselves.
  if (kind_ == Kind::kImported) {
    closeRange(record_.rank, record_.buffer);
    closeRange(record_.rank, record_.semaphore);
  }
}

// ---- IpcHandleCache ------------------------------------------------------------------------------

namespace {

// How many library channels (each with its own semaphore) a communication's channel rotates
// through, one per exchange. cuda_p2p.cpp's protocols write kIdle/kInProgress into the semaphore
// of the handles of the last exchange and may post the next transfer on another stream before the
// previous one has reset it (RingAllgatherOverlapTest posts a get on one stream per step and
// skips sendWait): two transfers that share a semaphore while both are in flight let a receive
// see the other's kInProgress and copy before the data is there. nvFuser's own IpcHandleCache
// gives every buffer a semaphore of its own; rotating gives the last `slots` exchanges of a
// channel different ones, so a program may have that many transfers of one communication in
// flight (RingAllgatherOverlapTest: 8 per iteration at every world size, each step a new slice;
// 4 slots let rings 0 and 1 of one step share one and failed at 4 ranks on a busy GPU). Both
// ranks count the channel's exchanges alike, so they pick the same slot. Each slot takes one of
// the 4,096 semaphores of the process's slab. NVFUSER_IPC_SEMAPHORE_SLOTS (1 to 64, default 16;
// 1: one semaphore per channel).
uint64_t semaphoreSlots() {
  static const uint64_t slots = [] {
    const char* env = std::getenv("NVFUSER_IPC_SEMAPHORE_SLOTS");
    if (env == nullptr || *env == '\0') {
      return uint64_t{16};
    }
    char* end = nullptr;
    const unsigned long long value = std::strtoull(env, &end, 10);
    NVF_CHECK(
        end != nullptr && *end == '\0' && value >= 1 && value <= 64,
        "NVFUSER_IPC_SEMAPHORE_SLOTS must be a number from 1 to 64, got \"",
        env,
        "\"");
    return static_cast<uint64_t>(value);
  }();
  return slots;
}

} // namespace

std::size_t IpcHandleCache::KeyType::Hash::operator()(
    const KeyType& key) const {
  return hashOfKey(key);
}

IpcHandleCache::IpcHandleCache(const ExpressionEvaluator* expr_evaluator)
    : expr_evaluator_(expr_evaluator) {
  NVF_ERROR(expr_evaluator_ != nullptr, "IpcHandleCache needs an evaluator");
}

IpcHandleCache::~IpcHandleCache() = default;

IpcHandleCache::KeyType IpcHandleCache::getKey(P2PCommunication* comm) const {
  return makeKey(
      comm,
      expr_evaluator_->evaluate(comm->peer()).as<int64_t>(),
      expr_evaluator_->evaluate(comm->buffer()).as<at::Tensor>());
}

IpcHandleCache::KeyType IpcHandleCache::makeKey(
    P2PCommunication* comm,
    int64_t peer,
    const at::Tensor& buffer) {
  return KeyType{
      peer,
      buffer.data_ptr(),
      buffer.storage_offset(),
      buffer.numel(),
      buffer.scalar_type(),
      comm};
}

IpcHandleCache::Channel& IpcHandleCache::channel(
    P2PCommunication* comm,
    int64_t my_rank,
    int64_t peer) {
  auto [it, inserted] = channels_.try_emplace(ChannelId{comm, peer});
  if (inserted) {
    const std::string pair = channelPair(comm, my_rank, peer);
    const std::string tag = pair + "_" + std::to_string(pair_counts_[pair]++);
    for (uint64_t slot = 0; slot < semaphoreSlots(); ++slot) {
      it->second.slot_tags.push_back(tag + "/s" + std::to_string(slot));
    }
  }
  return it->second;
}

void IpcHandleCache::exchangeHandles(
    const std::vector<P2PCommunication*>& communications) {
  const int64_t my_rank = Communicator::getInstance().deviceId();

  std::vector<nvfipc::Request> requests;
  std::vector<KeyType> keys;
  std::vector<at::Tensor> buffers;
  std::vector<Channel*> channels;
  requests.reserve(communications.size());
  keys.reserve(communications.size());
  buffers.reserve(communications.size());
  channels.reserve(communications.size());
  for (P2PCommunication* comm : communications) {
    const auto peer = expr_evaluator_->evaluate(comm->peer()).as<int64_t>();
    NVF_CHECK(peer != my_rank, "send to self not supported: ", comm->toString());
    at::Tensor buffer =
        expr_evaluator_->evaluate(comm->buffer()).as<at::Tensor>();
    NVF_CHECK(
        buffer.is_contiguous(),
        "IpcHandle only supports contiguous tensors: ",
        comm->toString());
    NVF_CHECK(
        buffer.is_cuda(),
        "IpcHandle only supports CUDA tensors: ",
        comm->toString());
    Channel& ch = channel(comm, my_rank, peer);
    nvfipc::Request request;
    request.peer = peer;
    request.direction = directionOf(comm);
    request.kind = nvfipc::MemKind::Device;
    request.tag = ch.slot_tags[ch.exchanges++ % ch.slot_tags.size()];
    request.ptr = nvfipc::Request::address(buffer.data_ptr());
    request.bytes = static_cast<uint64_t>(sizeInBytes(buffer));
    requests.push_back(std::move(request));
    keys.push_back(makeKey(comm, peer, buffer));
    buffers.push_back(std::move(buffer));
    channels.push_back(&ch);
  }

  translated("nvfuser-ipc exchangeHandles", [&] {
    std::lock_guard<std::mutex> lock(processStateMutex());
    ProcessState& state = processState();
    // Every communication goes to the library, cached or not: a hit costs a few shared-memory
    // loads there (no store traffic, no barrier, no GPU work), and it is how both sides learn
    // that the other's buffer changed.
    state.cache.exchangeHandles(requests);

    for (size_t i = 0; i < requests.size(); ++i) {
      const nvfipc::P2pHandle h = state.cache.get(requests[i]);
      // The local side keeps this rank's buffer alive while it is cached, as nvFuser's exported
      // IpcHandle did.
      auto local = std::make_unique<IpcHandle>(
          h.local().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.local().semaphore()),
          buffers[i]);
      auto peer = std::make_unique<IpcHandle>(
          h.peer().ptr(),
          reinterpret_cast<IpcSemaphore*>(h.peer().semaphore()));

      Channel& ch = *channels[i];
      if (ch.last_key.has_value() && !(*ch.last_key == keys[i])) {
        handles_.erase(*ch.last_key); // the channel's previous buffer
      }
      ch.last_key = keys[i];
      auto& slot = handles_[keys[i]];
      if (slot == nullptr) {
        slot =
            std::make_unique<P2pIpcHandle>(std::move(local), std::move(peer));
      } else {
        // Keep the object (references to it stay valid), refresh its content.
        *slot = P2pIpcHandle(std::move(local), std::move(peer));
      }
    }
  });
}

const P2pIpcHandle& IpcHandleCache::get(P2PCommunication* communication) const {
  auto it = handles_.find(getKey(communication));
  NVF_CHECK(
      it != handles_.end(),
      "No remote buffer found for ",
      communication->toString(),
      "; exchange its handles (hir::ShareMemHandles) first");
  return *it->second;
}

// ---- symmetric memory ------------------------------------------------------------------------
//
// Allocation, export and mapping of the symmetric buffers are nvFuser's SymmetricTensor (CUDA VMM
// over POSIX file descriptors, NVLS multicast); its setup is a rendezvous of all ranks. These
// handles add only the layout each collective needs and semaphores that are kIdle before any
// peer can map them. A handle is set up once; SymmetricMemoryHandleCache hits and every accessor
// are local.

namespace {

bool multicastEnabled() {
  const MulticastProtocol protocol = getMulticastProtocol();
  return protocol == MulticastProtocol::Memcpy ||
      protocol == MulticastProtocol::Multimem;
}

// `tensor` (from SymmetricTensor::allocate) mapped on every rank under `tag` (equal on all
// ranks); with `multicast_root`, also bound to the multicast object that rank exports.
std::unique_ptr<SymmetricTensor> shareSymmetric(
    const at::Tensor& tensor,
    const std::string& tag,
    std::optional<int64_t> multicast_root) {
  auto sym = std::make_unique<SymmetricTensor>(tensor);
  sym->setupRemoteHandles(tag + "_uc");
  if (multicast_root.has_value()) {
    sym->setupMulticast(*multicast_root, tag + "_mc");
  }
  return sym;
}

// `count` kIdle semaphores in a new symmetric tensor on `device`.
at::Tensor newSemaphores(int64_t count, at::Device device) {
  at::Tensor semaphores =
      SymmetricTensor::allocate({count}, at::ScalarType::Int, device);
  const std::vector<IpcSemaphore> idle(count, IpcSemaphore::kIdle);
  copyToDeviceNow(
      semaphores.data_ptr(), idle.data(), idle.size() * sizeof(IpcSemaphore));
  return semaphores;
}

// `base` advanced by `bytes`.
void* advance(void* base, int64_t bytes) {
  return static_cast<uint8_t*>(base) + bytes;
}

// The multicast root when multicast is on.
std::optional<int64_t> multicastRoot(int64_t root) {
  return multicastEnabled() ? std::optional<int64_t>(root) : std::nullopt;
}

std::string communicationTag(const char* kind, Communication* communication) {
  return std::string("symmem_") + kind + "_c" +
      std::to_string(communication->name());
}

} // namespace

SymMemForBroadcast::SymMemForBroadcast(
    Communication* communication,
    int64_t root,
    at::Tensor buffer)
    : SymMemForBroadcast(
          std::move(buffer),
          root,
          "c" + std::to_string(communication->name())) {}

SymMemForBroadcast::SymMemForBroadcast(
    at::Tensor buffer,
    int64_t root,
    const std::string& name_suffix) {
  const std::string tag = "symmem_bcast_" + name_suffix;
  buffer_ = shareSymmetric(buffer, tag + "_buf", multicastRoot(root));
  semaphore_ = shareSymmetric(
      newSemaphores(1, buffer.device()), tag + "_sem", multicastRoot(root));
}

void* SymMemForBroadcast::bufferMulticastPtr() const {
  return buffer_->multicastPtr();
}

void* SymMemForBroadcast::bufferUnicastPtr(int64_t rank) const {
  return buffer_->remoteTensor(rank).data_ptr();
}

void* SymMemForBroadcast::semaphoreMulticastPtr() const {
  return semaphore_->multicastPtr();
}

void* SymMemForBroadcast::semaphoreUnicastPtr(int64_t rank) const {
  return semaphore_->remoteTensor(rank).data_ptr();
}

SymmetricMemoryForAllreduce::SymmetricMemoryForAllreduce(
    Communication* communication,
    at::Tensor output_buffer)
    : size_bytes_(static_cast<size_t>(sizeInBytes(output_buffer))) {
  const std::string tag = communicationTag("allreduce", communication);
  const int64_t world_size = Communicator::getInstance().size();
  at::Tensor input = SymmetricTensor::allocate(
      output_buffer.sizes(),
      output_buffer.scalar_type(),
      output_buffer.device());
  // Rank 0 exports the multicast object every rank reduces through.
  input_ = shareSymmetric(input, tag + "_in", multicastRoot(0));
  // The semaphores are only read and written by address (no multicast accessor).
  semaphores_ = shareSymmetric(
      newSemaphores(world_size, output_buffer.device()),
      tag + "_sem",
      std::nullopt);
}

at::Tensor SymmetricMemoryForAllreduce::inputBuffer() const {
  return input_->localTensor();
}

void* SymmetricMemoryForAllreduce::multicastPtr() const {
  return input_->multicastPtr();
}

void* SymmetricMemoryForAllreduce::semaphoreUnicastPtr(
    int64_t root_rank,
    int64_t rank) const {
  return advance(
      semaphores_->remoteTensor(rank).data_ptr(),
      root_rank * static_cast<int64_t>(sizeof(IpcSemaphore)));
}

SymmetricMemoryForReduce::SymmetricMemoryForReduce(
    Communication* communication,
    int64_t root,
    at::Tensor output_buffer)
    : size_bytes_(static_cast<size_t>(sizeInBytes(output_buffer))) {
  const std::string tag = communicationTag("reduce", communication);
  at::Tensor input = SymmetricTensor::allocate(
      output_buffer.sizes(),
      output_buffer.scalar_type(),
      output_buffer.device());
  input_ = shareSymmetric(input, tag + "_in", multicastRoot(root));
  semaphore_ = shareSymmetric(
      newSemaphores(1, output_buffer.device()), tag + "_sem", std::nullopt);
}

at::Tensor SymmetricMemoryForReduce::inputBuffer() const {
  return input_->localTensor();
}

void* SymmetricMemoryForReduce::multicastPtr() const {
  return input_->multicastPtr();
}

void* SymmetricMemoryForReduce::semaphoreUnicastPtr(int64_t rank) const {
  return semaphore_->remoteTensor(rank).data_ptr();
}

SymMemForAllgather::SymMemForAllgather(
    Communication* communication,
    at::Tensor buffer) {
  const std::string tag = communicationTag("allgather", communication);
  const int64_t world_size = Communicator::getInstance().size();
  NVF_CHECK(
      buffer.numel() % world_size == 0,
      "allgather buffer of ",
      buffer.numel(),
      " elements does not split into ",
      world_size,
      " slices");
  slice_size_bytes_ = sizeInBytes(buffer) / world_size;
  // Slices are not VMM-aligned: the whole buffer is mapped, and slices are offsets in it.
  buffer_ = shareSymmetric(buffer, tag + "_buf", multicastRoot(0));
  semaphores_ = shareSymmetric(
      newSemaphores(world_size, buffer.device()),
      tag + "_sem",
      multicastRoot(0));
}

void* SymMemForAllgather::bufferMulticastPtr(int64_t root_rank) const {
  return advance(buffer_->multicastPtr(), root_rank * slice_size_bytes_);
}

void* SymMemForAllgather::bufferUnicastPtr(int64_t root_rank, int64_t rank)
    const {
  return advance(
      buffer_->remoteTensor(rank).data_ptr(), root_rank * slice_size_bytes_);
}

void* SymMemForAllgather::semaphoreMulticastPtr(int64_t root_rank) const {
  return advance(
      semaphores_->multicastPtr(),
      root_rank * static_cast<int64_t>(sizeof(IpcSemaphore)));
}

void* SymMemForAllgather::semaphoreUnicastPtr(int64_t root_rank, int64_t rank)
    const {
  return advance(
      semaphores_->remoteTensor(rank).data_ptr(),
      root_rank * static_cast<int64_t>(sizeof(IpcSemaphore)));
}

SymMemForContiguousView::SymMemForContiguousView(
    at::Tensor buffer,
    hir::SymmetricContiguousView* expr) {
  const std::string tag = "symmem_view_e" + std::to_string(expr->name());
  sym_tensor_ = shareSymmetric(buffer, tag, std::nullopt);
  sym_tensor_->setupContiguousView(tag);
  tensor_ = sym_tensor_->getContiguousView();
}

// ---- SymMemForAlltoallv ------------------------------------------------------------------------

namespace {

// The address of every rank's copy of `sym`.
std::vector<CUdeviceptr> remoteAddresses(
    const SymmetricTensor& sym,
    int64_t world_size) {
  std::vector<CUdeviceptr> addresses(world_size);
  for (int64_t rank = 0; rank < world_size; ++rank) {
    addresses[rank] =
        reinterpret_cast<CUdeviceptr>(sym.remoteTensor(rank).data_ptr());
  }
  return addresses;
}

CUstreamBatchMemOpParams writeOp(CUdeviceptr address, cuuint32_t value) {
  CUstreamBatchMemOpParams op{};
  op.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = address;
  op.writeValue.value = value;
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return op;
}

CUstreamBatchMemOpParams waitOp(CUdeviceptr address, cuuint32_t value) {
  CUstreamBatchMemOpParams op{};
  op.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op.waitValue.address = address;
  op.waitValue.value = value;
  op.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  return op;
}

cuuint32_t semaphoreValue(IpcSemaphore value) {
  return static_cast<cuuint32_t>(value);
}

// One cuStreamBatchMemOp on `stream` holding `make_op(peer)` for every peer of `my_rank`
// (nothing with a single rank).
template <typename MakeOp>
void batchPerPeer(
    CUstream stream,
    int64_t world_size,
    int64_t my_rank,
    MakeOp make_op) {
  std::vector<CUstreamBatchMemOpParams> ops;
  for (int64_t peer = 0; peer < world_size; ++peer) {
    if (peer != my_rank) {
      ops.push_back(make_op(peer));
    }
  }
  if (ops.empty()) {
    return;
  }
  NVFUSER_CUDA_SAFE_CALL(cuStreamBatchMemOp(
      stream, static_cast<unsigned int>(ops.size()), ops.data(), 0));
}

} // namespace

SymMemForAlltoallv::SymMemForAlltoallv(
    at::Device device,
    const std::string& tag)
    : world_size_(Communicator::getInstance().size()),
      my_rank_(Communicator::getInstance().deviceId()),
      tag_(tag) {
  sync_buf_ = SymmetricTensor::allocate({world_size_}, at::kLong, device);
  const std::vector<int64_t> zero_counts(world_size_, 0);
  copyToDeviceNow(
      sync_buf_.data_ptr(),
      zero_counts.data(),
      zero_counts.size() * sizeof(int64_t));
  sync_sym_ = shareSymmetric(sync_buf_, tag_ + "_sync", std::nullopt);
  sync_ptrs_ = remoteAddresses(*sync_sym_, world_size_);

  sem_buf_ = newSemaphores(2 * world_size_, device);
  sem_sym_ = shareSymmetric(sem_buf_, tag_ + "_sem", std::nullopt);
  sem_ptrs_ = remoteAddresses(*sem_sym_, world_size_);
}

CUdeviceptr SymMemForAlltoallv::countsSemAddr(int64_t rank, int64_t slot)
    const {
  return sem_ptrs_.at(rank) + slot * sizeof(IpcSemaphore);
}

CUdeviceptr SymMemForAlltoallv::doneSemAddr(int64_t rank, int64_t slot) const {
  return sem_ptrs_.at(rank) + (world_size_ + slot) * sizeof(IpcSemaphore);
}

void SymMemForAlltoallv::batchSignal(
    CUstream stream,
    cuuint32_t value,
    SemAddr addr) {
  batchPerPeer(stream, world_size_, my_rank_, [&](int64_t peer) {
    return writeOp((this->*addr)(peer, my_rank_), value);
  });
}

void SymMemForAlltoallv::batchWait(
    CUstream stream,
    cuuint32_t value,
    SemAddr addr) {
  batchPerPeer(stream, world_size_, my_rank_, [&](int64_t peer) {
    return waitOp((this->*addr)(my_rank_, peer), value);
  });
}

void SymMemForAlltoallv::batchReset(
    CUstream stream,
    cuuint32_t value,
    SemAddr addr) {
  batchPerPeer(stream, world_size_, my_rank_, [&](int64_t peer) {
    return writeOp((this->*addr)(my_rank_, peer), value);
  });
}

void SymMemForAlltoallv::signalCountsReady(CUstream stream) {
  batchSignal(
      stream,
      semaphoreValue(IpcSemaphore::kInProgress),
      &SymMemForAlltoallv::countsSemAddr);
}

void SymMemForAlltoallv::waitCountsReady(CUstream stream) {
  batchWait(
      stream,
      semaphoreValue(IpcSemaphore::kInProgress),
      &SymMemForAlltoallv::countsSemAddr);
}

void SymMemForAlltoallv::resetCountsSem(CUstream stream) {
  batchReset(
      stream,
      semaphoreValue(IpcSemaphore::kIdle),
      &SymMemForAlltoallv::countsSemAddr);
}

void SymMemForAlltoallv::doneBarrier(CUstream stream) {
  batchSignal(
      stream,
      semaphoreValue(IpcSemaphore::kInProgress),
      &SymMemForAlltoallv::doneSemAddr);
  batchWait(
      stream,
      semaphoreValue(IpcSemaphore::kInProgress),
      &SymMemForAlltoallv::doneSemAddr);
  batchReset(
      stream,
      semaphoreValue(IpcSemaphore::kIdle),
      &SymMemForAlltoallv::doneSemAddr);
}

const SymMemForAlltoallv::RecvHandle& SymMemForAlltoallv::recv(
    const std::string& name,
    int64_t first_dim,
    at::IntArrayRef extra_sizes,
    at::ScalarType dtype,
    at::Device device) {
  RecvEntry& entry = recv_entries_[name];
  if (entry.sym != nullptr) {
    NVF_CHECK(
        entry.first_dim >= first_dim,
        "SymMemForAlltoallv::recv: buffer '",
        name,
        "' of ",
        tag_,
        " holds ",
        entry.first_dim,
        " rows, ",
        first_dim,
        " requested; it cannot grow after its first use (CUDA graphs may have "
        "captured its address)");
    return entry.handle;
  }

  std::vector<int64_t> sizes{first_dim};
  sizes.insert(sizes.end(), extra_sizes.begin(), extra_sizes.end());
  at::Tensor buffer = SymmetricTensor::allocate(sizes, dtype, device);
  entry.sym = shareSymmetric(buffer, tag_ + "_" + name, std::nullopt);
  entry.handle.buffer = buffer;
  entry.handle.remote_ptrs = entry.sym->remotePointersTensor();
  entry.first_dim = first_dim;
  return entry.handle;
}

// ---- SymmetricMemoryHandleCache ----------------------------------------------------------------

SymmetricMemoryHandle* SymmetricMemoryHandleCache::get(KeyType key) {
  auto it = handles_.find(key);
  if (it == handles_.end()) {
    std::unique_ptr<SymmetricMemoryHandle> handle = create(key);
    it = handles_.emplace(std::move(key), std::move(handle)).first;
  }
  return it->second.get();
}

std::unique_ptr<SymmetricMemoryHandle> SymmetricMemoryHandleCache::create(
    const KeyType& key) {
  if (auto* view = dynamic_cast<hir::SymmetricContiguousView*>(key.expr)) {
    return std::make_unique<SymMemForContiguousView>(key.buffer, view);
  }
  auto* comm = dynamic_cast<Communication*>(key.expr);
  NVF_CHECK(
      comm != nullptr,
      "no symmetric-memory handle for ",
      key.expr == nullptr ? std::string("a null expression")
                          : key.expr->toString());
  switch (comm->type()) {
    case CommunicationType::Broadcast:
      return std::make_unique<SymMemForBroadcast>(comm, key.root, key.buffer);
    case CommunicationType::Allgather:
      return std::make_unique<SymMemForAllgather>(comm, key.buffer);
    case CommunicationType::Allreduce:
      return std::make_unique<SymmetricMemoryForAllreduce>(comm, key.buffer);
    case CommunicationType::Reduce:
      return std::make_unique<SymmetricMemoryForReduce>(
          comm, key.root, key.buffer);
    default:
      NVF_THROW(
          "no symmetric-memory handle for communication type ", comm->type());
  }
}

// ---- SymmetricTensor's remote handles through nvfuser-ipc ---------------------------------------

namespace {

// The nvfuser-ipc tags of the SymmetricTensors set up through the library. Callers hold
// processStateMutex().
struct SymmetricSetups {
  // By owner (the SymmetricTensor): its tag in the library.
  std::unordered_map<const void*, std::string> tags;
  // By nvFuser tag: how many set-ups have used it in this process.
  std::unordered_map<std::string, uint64_t> uses;
};

SymmetricSetups& symmetricSetups() {
  static auto* setups = new SymmetricSetups();
  return *setups;
}

} // namespace

std::vector<CUdeviceptr> nvfipc_symmetric::setupRemoteHandles(
    const void* owner,
    const at::Tensor& local,
    const std::string& tag) {
  return translated("SymmetricTensor::setupRemoteHandles", [&] {
    std::lock_guard<std::mutex> lock(processStateMutex());
    ProcessState& state = processState();
    SymmetricSetups& setups = symmetricSetups();
    NVF_ERROR(
        setups.tags.count(owner) == 0,
        "SymmetricTensor set up twice through nvfuser-ipc (tag \"",
        tag,
        "\")");
    // Set-ups are collective: every rank sets up the same tensors in the same order, so the n-th
    // set-up of `tag` names the same allocation on every rank. Numbering them gives each live
    // tensor a tag of its own in the library (nvFuser reuses tags, e.g. the default "").
    const std::string library_tag =
        "nvfuser/" + tag + "#" + std::to_string(setups.uses[tag]++);
    const auto bytes = static_cast<uint64_t>(local.numel()) *
        static_cast<uint64_t>(local.element_size());
    const auto members = state.cache.symmetricRendezvous(
        library_tag, nvfipc::MemKind::Device, local.data_ptr(), bytes);
    setups.tags.emplace(owner, library_tag);
    std::vector<CUdeviceptr> addresses(members.size(), 0);
    for (const auto& member : members) {
      addresses.at(static_cast<size_t>(member.rank)) =
          reinterpret_cast<CUdeviceptr>(member.ptr);
    }
    return addresses;
  });
}

at::Tensor nvfipc_symmetric::contiguousView(
    const void* owner,
    const at::Tensor& local) {
  return translated("SymmetricTensor::setupContiguousView", [&] {
    std::lock_guard<std::mutex> lock(processStateMutex());
    const auto found = symmetricSetups().tags.find(owner);
    NVF_CHECK(
        found != symmetricSetups().tags.end(),
        "setupContiguousView needs setupRemoteHandles first");
    const auto view = processState().cache.symmetricContiguousView(found->second);
    const auto element = static_cast<uint64_t>(local.element_size());
    NVF_ERROR(
        view.stride % element == 0,
        "contiguous view: a rank's stride of ",
        view.stride,
        " bytes is not a whole number of elements");
    std::vector<int64_t> sizes{Communicator::getInstance().size()};
    sizes.insert(sizes.end(), local.sizes().begin(), local.sizes().end());
    std::vector<int64_t> strides{static_cast<int64_t>(view.stride / element)};
    strides.insert(strides.end(), local.strides().begin(), local.strides().end());
    // The library owns the mapping (released with the SymmetricTensor), so the tensor frees
    // nothing. The rank dimension stands in for the local tensor's size-1 sharded dimension.
    return at::from_blob(
               view.base,
               sizes,
               strides,
               [](void*) {},
               at::TensorOptions()
                   .dtype(local.scalar_type())
                   .device(local.device()))
        .squeeze(1);
  });
}

void nvfipc_symmetric::release(const void* owner) noexcept {
  std::lock_guard<std::mutex> lock(processStateMutex());
  SymmetricSetups& setups = symmetricSetups();
  const auto found = setups.tags.find(owner);
  if (found == setups.tags.end()) {
    return;
  }
  const std::string library_tag = std::move(found->second);
  setups.tags.erase(found);
  ProcessState* state = processStateSlot();
  if (state == nullptr) {
    return; // released at exit: freeing the cache unmapped everything
  }
  try {
    state->cache.symmetricRelease(library_tag);
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "nvfuser-ipc: releasing symmetric tensor %s: %s\n",
        library_tag.c_str(),
        e.what());
  }
}

} // namespace nvfuser
