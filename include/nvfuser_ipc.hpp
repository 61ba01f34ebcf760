// Header-only C++17 wrapper of the nvfuser-ipc C API (nvfuser_ipc.h).
//
// * Every object owns one C handle, is move-only and frees it in a noexcept destructor (errors
//   from a destructor's free are dropped; call close() first to see them).
// * Every failing call throws nvfipc::Error (a std::runtime_error) carrying the status and the
//   library's message; each status has its own subclass (TimeoutError, NotFoundError, ...) so
//   callers can catch what they handle.
// * Streams are passed as `void*`: a CUstream or cudaStream_t converts implicitly, so this
//   header does not need cuda.h. nullptr is the legacy default stream.
//
//   nvfipc::Context ctx = nvfipc::Context::fromEnv();
//   nvfipc::HandleCache cache(ctx);
//   std::vector<nvfipc::Request> batch = {
//       nvfipc::Request::send(next, "ring", send_buf, bytes),
//       nvfipc::Request::recv(prev, "ring", recv_buf, bytes)};
//   cache.exchangeHandles(batch);
//   cache.sendPost(batch[0], stream);
//   cache.recvPost(batch[1], bytes, stream);
//   cache.sendWait(batch[0], stream);
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nvfuser_ipc.h"

namespace nvfipc {

// ---- status and errors ------------------------------------------------------------------------

enum class Status : int32_t {
  Ok = NVFIPC_STATUS_OK,
  InvalidArgument = NVFIPC_STATUS_INVALID_ARGUMENT,
  Timeout = NVFIPC_STATUS_TIMEOUT,
  Io = NVFIPC_STATUS_IO,
  Protocol = NVFIPC_STATUS_PROTOCOL,
  NotFound = NVFIPC_STATUS_NOT_FOUND,
  Cuda = NVFIPC_STATUS_CUDA,
  CudaUnavailable = NVFIPC_STATUS_CUDA_UNAVAILABLE,
  Unsupported = NVFIPC_STATUS_UNSUPPORTED,
  InvalidState = NVFIPC_STATUS_INVALID_STATE,
  Panic = NVFIPC_STATUS_PANIC,
  Internal = NVFIPC_STATUS_INTERNAL,
};

// A short lower-case name of a status ("timeout", ...).
inline const char* statusName(Status status) noexcept {
  return nvfipc_status_name(static_cast<int32_t>(status));
}

// A failed library call: `status()` is the C status, `message()` the library's explanation,
// `function()` the C function that failed; what() combines all three.
class Error : public std::runtime_error {
 public:
  Error(Status status, std::string function, std::string message)
      : std::runtime_error(function + ": " + statusName(status) + ": " + message),
        status_(status),
        function_(std::move(function)),
        message_(std::move(message)) {}

  Status status() const noexcept { return status_; }
  const std::string& function() const noexcept { return function_; }
  const std::string& message() const noexcept { return message_; }

 private:
  Status status_;
  std::string function_;
  std::string message_;
};

#define NVFIPC_DEFINE_ERROR(Name)        \
  class Name : public Error {            \
   public:                               \
    using Error::Error;                  \
  };
NVFIPC_DEFINE_ERROR(InvalidArgumentError)
NVFIPC_DEFINE_ERROR(TimeoutError)
NVFIPC_DEFINE_ERROR(IoError)
NVFIPC_DEFINE_ERROR(ProtocolError)
NVFIPC_DEFINE_ERROR(NotFoundError)
NVFIPC_DEFINE_ERROR(CudaError)
NVFIPC_DEFINE_ERROR(CudaUnavailableError)
NVFIPC_DEFINE_ERROR(UnsupportedError)
NVFIPC_DEFINE_ERROR(InvalidStateError)
NVFIPC_DEFINE_ERROR(InternalError)
#undef NVFIPC_DEFINE_ERROR

namespace detail {

// Throws the subclass of Error that matches `status`, with this thread's last error message.
[[noreturn]] inline void throwError(nvfipc_status status, const char* function) {
  std::string message = nvfipc_last_error_message();
  Status s = static_cast<Status>(status);
  switch (s) {
    case Status::InvalidArgument: throw InvalidArgumentError(s, function, std::move(message));
    case Status::Timeout: throw TimeoutError(s, function, std::move(message));
    case Status::Io: throw IoError(s, function, std::move(message));
    case Status::Protocol: throw ProtocolError(s, function, std::move(message));
    case Status::NotFound: throw NotFoundError(s, function, std::move(message));
    case Status::Cuda: throw CudaError(s, function, std::move(message));
    case Status::CudaUnavailable: throw CudaUnavailableError(s, function, std::move(message));
    case Status::Unsupported: throw UnsupportedError(s, function, std::move(message));
    case Status::InvalidState: throw InvalidStateError(s, function, std::move(message));
    case Status::Panic:
    case Status::Internal: throw InternalError(s, function, std::move(message));
    case Status::Ok: break;
  }
  throw Error(s, function, std::move(message));
}

inline void check(nvfipc_status status, const char* function) {
  if (status != NVFIPC_STATUS_OK) throwError(status, function);
}

// Owns a buffer returned by the library and copies it into a vector.
inline std::vector<uint8_t> takeBuffer(uint8_t* data, size_t len) {
  struct Free {
    size_t len;
    void operator()(uint8_t* p) const noexcept { nvfipc_buffer_free(p, len); }
  };
  std::unique_ptr<uint8_t, Free> owner(data, Free{len});
  return data == nullptr ? std::vector<uint8_t>() : std::vector<uint8_t>(data, data + len);
}

// Key arrays for the C calls; the strings must outlive the returned vector.
inline std::vector<const char*> cKeys(const std::vector<std::string>& keys) {
  std::vector<const char*> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(k.c_str());
  return out;
}

// Unique owner of a C handle whose free function returns a status.
template <typename T, nvfipc_status (*Free)(T*)>
class Owned {
 public:
  Owned() noexcept = default;
  explicit Owned(T* raw) noexcept : raw_(raw) {}
  ~Owned() { reset(); }
  Owned(Owned&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  T* get() const noexcept { return raw_; }
  T* release() noexcept { return std::exchange(raw_, nullptr); }
  // Frees now and reports the status (the handle is gone either way).
  nvfipc_status close() noexcept { return Free(std::exchange(raw_, nullptr)); }
  void reset() noexcept {
    if (raw_ != nullptr) (void)Free(std::exchange(raw_, nullptr));
  }

 private:
  T* raw_ = nullptr;
};

// Throws InvalidStateError for calls on a moved-from or closed object.
template <typename T>
T* live(T* raw, const char* what) {
  if (raw == nullptr) {
    throw InvalidStateError(Status::InvalidState, what,
                            "the object was moved from or closed; create a new one");
  }
  return raw;
}

}  // namespace detail

// ---- timeouts ---------------------------------------------------------------------------------

using Milliseconds = std::chrono::milliseconds;
// "The object's default timeout" (store, context or cache).
inline constexpr Milliseconds kDefaultTimeout{-1};
// "Check once, do not wait".
inline constexpr Milliseconds kNoWait{0};

// ---- library-wide helpers --------------------------------------------------------------------

inline std::string version() { return nvfipc_version(); }
inline std::string lastErrorMessage() { return nvfipc_last_error_message(); }

// ---- log ------------------------------------------------------------------------------------

enum class LogLevel : int32_t {
  Off = NVFIPC_LOG_OFF,
  Warn = NVFIPC_LOG_WARN,
  Info = NVFIPC_LOG_INFO,
  Debug = NVFIPC_LOG_DEBUG,
  Trace = NVFIPC_LOG_TRACE,
};

// Receives each log line: level, subsystem ("store", "exchange", ...) and the whole line.
using LogSink = std::function<void(LogLevel, std::string_view subsystem, std::string_view line)>;

// Sets the most verbose level written for the whole process (overrides NVFIPC_DEBUG).
inline void setLogLevel(LogLevel level) {
  detail::check(nvfipc_log_set_level(static_cast<int32_t>(level)), "nvfipc_log_set_level");
}

inline LogLevel logLevel() {
  int32_t level = 0;
  detail::check(nvfipc_log_get_level(&level), "nvfipc_log_get_level");
  return static_cast<LogLevel>(level);
}

// Routes the library's log lines into `sink` (e.g. the host program's logger) instead of stderr;
// an empty sink restores stderr / NVFIPC_DEBUG_FILE. The sink is called from any thread,
// concurrently, and must be thread-safe. Sinks are kept for the process's lifetime (the library's
// threads may still be writing a line while the sink is replaced), so set one once, at start-up.
inline void setLogSink(LogSink sink) {
  if (!sink) {
    detail::check(nvfipc_log_set_callback(nullptr, nullptr), "nvfipc_log_set_callback");
    return;
  }
  // Leaked on purpose: a line may still be on its way to a replaced sink, and static
  // destruction order must not matter.
  auto* kept = new LogSink(std::move(sink));
  detail::check(nvfipc_log_set_callback(
      [](int32_t level, const char* subsystem, const char* line, void* user) {
        try {
          (*static_cast<LogSink*>(user))(static_cast<LogLevel>(level), subsystem, line);
        } catch (...) {
          // An exception must not unwind into the library's threads.
        }
      },
      kept),
      "nvfipc_log_set_callback");
}

// ---- Store ------------------------------------------------------------------------------------

// A c10d-compatible key-value store: a TCPStore client, or host callbacks. Thread-safe.
class Store {
 public:
  Store() noexcept = default;
  Store(Store&& o) noexcept = default;
  // Frees this object's handle before dropping its keepalive.
  Store& operator=(Store&& o) noexcept {
    if (this != &o) {
      handle_.reset();
      keepalive_ = std::move(o.keepalive_);
      handle_ = std::move(o.handle_);
    }
    return *this;
  }
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() { handle_.reset(); }

  // Connects to a TCPStore server (PyTorch's, nvfipc's). `timeout` bounds the connection and is
  // the store's default timeout (kDefaultTimeout: 300 s).
  static Store connect(const std::string& host, uint16_t port,
                       Milliseconds timeout = kDefaultTimeout, int64_t wait_for_workers = 0) {
    nvfipc_store* raw = nullptr;
    detail::check(nvfipc_store_connect(host.c_str(), port, timeout.count(), wait_for_workers, &raw),
                  "nvfipc_store_connect");
    return Store(raw, nullptr);
  }

  // A store over host callbacks. `keepalive` owns whatever `callbacks.ctx` points to: it is kept
  // by this store and by every Context and HandleCache made from it, so the callbacks stay valid
  // as long as the library may call them.
  static Store fromCallbacks(const nvfipc_store_callbacks& callbacks,
                             std::shared_ptr<void> keepalive) {
    nvfipc_store* raw = nullptr;
    detail::check(nvfipc_store_from_callbacks(&callbacks, &raw), "nvfipc_store_from_callbacks");
    return Store(raw, std::move(keepalive));
  }

  // For a store over host callbacks: where its server listens (what the host's own client
  // connects to), so that a rank closing after the server has gone makes no request to it
  // (nvfipc_store_set_server_address). UnsupportedError for other stores.
  void setServerAddress(const std::string& host, uint16_t port) const {
    detail::check(nvfipc_store_set_server_address(raw(), host.c_str(), port),
                  "nvfipc_store_set_server_address");
  }

  // Adopts a C store handle (ownership moves to the returned object).
  static Store adopt(nvfipc_store* raw, std::shared_ptr<void> keepalive = nullptr) noexcept {
    return Store(raw, std::move(keepalive));
  }

  void set(const std::string& key, const void* value, size_t len) const {
    detail::check(nvfipc_store_set(raw(), key.c_str(), static_cast<const uint8_t*>(value), len),
                  "nvfipc_store_set");
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) const {
    set(key, value.data(), value.size());
  }
  void set(const std::string& key, std::string_view value) const {
    set(key, value.data(), value.size());
  }

  // Waits (bounded) for `key` and returns its value; TimeoutError when it never appears.
  std::vector<uint8_t> get(const std::string& key, Milliseconds timeout = kDefaultTimeout) const {
    uint8_t* data = nullptr;
    size_t len = 0;
    detail::check(nvfipc_store_get(raw(), key.c_str(), timeout.count(), &data, &len),
                  "nvfipc_store_get");
    return detail::takeBuffer(data, len);
  }
  std::string getString(const std::string& key, Milliseconds timeout = kDefaultTimeout) const {
    std::vector<uint8_t> v = get(key, timeout);
    return std::string(v.begin(), v.end());
  }

  int64_t add(const std::string& key, int64_t delta) const {
    int64_t value = 0;
    detail::check(nvfipc_store_add(raw(), key.c_str(), delta, &value), "nvfipc_store_add");
    return value;
  }

  bool check(const std::vector<std::string>& keys) const {
    std::vector<const char*> k = detail::cKeys(keys);
    bool all = false;
    detail::check(nvfipc_store_check(raw(), k.data(), k.size(), &all), "nvfipc_store_check");
    return all;
  }

  void wait(const std::vector<std::string>& keys, Milliseconds timeout = kDefaultTimeout) const {
    std::vector<const char*> k = detail::cKeys(keys);
    detail::check(nvfipc_store_wait(raw(), k.data(), k.size(), timeout.count()),
                  "nvfipc_store_wait");
  }

  bool deleteKey(const std::string& key) const {
    bool deleted = false;
    detail::check(nvfipc_store_delete_key(raw(), key.c_str(), &deleted),
                  "nvfipc_store_delete_key");
    return deleted;
  }

  int64_t numKeys() const {
    int64_t n = 0;
    detail::check(nvfipc_store_num_keys(raw(), &n), "nvfipc_store_num_keys");
    return n;
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) const {
    uint8_t* data = nullptr;
    size_t len = 0;
    detail::check(nvfipc_store_compare_set(raw(), key.c_str(), expected.data(), expected.size(),
                                           desired.data(), desired.size(), &data, &len),
                  "nvfipc_store_compare_set");
    return detail::takeBuffer(data, len);
  }

  void append(const std::string& key, const std::vector<uint8_t>& value) const {
    detail::check(nvfipc_store_append(raw(), key.c_str(), value.data(), value.size()),
                  "nvfipc_store_append");
  }

  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) const {
    if (keys.size() != values.size()) {
      throw InvalidArgumentError(Status::InvalidArgument, "nvfipc_store_multi_set",
                                 "keys and values differ in length");
    }
    std::vector<const char*> k = detail::cKeys(keys);
    std::vector<nvfipc_bytes> v;
    v.reserve(values.size());
    for (const auto& value : values) v.push_back(nvfipc_bytes{value.data(), value.size()});
    detail::check(nvfipc_store_multi_set(raw(), k.data(), v.data(), k.size()),
                  "nvfipc_store_multi_set");
  }

  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys,
                                             Milliseconds timeout = kDefaultTimeout) const {
    std::vector<const char*> k = detail::cKeys(keys);
    std::vector<nvfipc_buffer> bufs(keys.size(), nvfipc_buffer{nullptr, 0});
    detail::check(nvfipc_store_multi_get(raw(), k.data(), k.size(), timeout.count(), bufs.data()),
                  "nvfipc_store_multi_get");
    struct FreeAll {
      std::vector<nvfipc_buffer>* b;
      ~FreeAll() { nvfipc_buffers_free(b->data(), b->size()); }
    } free_all{&bufs};
    std::vector<std::vector<uint8_t>> out;
    out.reserve(bufs.size());
    for (const auto& b : bufs) {
      out.emplace_back(b.data == nullptr ? std::vector<uint8_t>()
                                         : std::vector<uint8_t>(b.data, b.data + b.len));
    }
    return out;
  }

  Milliseconds defaultTimeout() const {
    int64_t ms = 0;
    detail::check(nvfipc_store_default_timeout_ms(raw(), &ms), "nvfipc_store_default_timeout_ms");
    return Milliseconds(ms);
  }
  // TCP stores only (UnsupportedError otherwise).
  void setTimeout(Milliseconds timeout) const {
    detail::check(nvfipc_store_set_timeout(raw(), timeout.count()), "nvfipc_store_set_timeout");
  }
  // TCP stores only: round-trip time of a PING in microseconds.
  int64_t ping() const {
    int64_t rtt = 0;
    detail::check(nvfipc_store_ping(raw(), &rtt), "nvfipc_store_ping");
    return rtt;
  }

  nvfipc_store* raw() const { return detail::live(handle_.get(), "nvfipc::Store"); }
  const std::shared_ptr<void>& keepalive() const noexcept { return keepalive_; }
  explicit operator bool() const noexcept { return handle_.get() != nullptr; }
  // Frees the handle now, reporting errors (the destructor drops them).
  void close() {
    const nvfipc_status status = handle_.close();
    keepalive_.reset();
    detail::check(status, "nvfipc_store_free");
  }

 private:
  Store(nvfipc_store* raw, std::shared_ptr<void> keepalive) noexcept
      : keepalive_(std::move(keepalive)), handle_(raw) {}

  // Declared first so it is destroyed last: the callbacks outlive the store handle.
  std::shared_ptr<void> keepalive_;
  detail::Owned<nvfipc_store, nvfipc_store_free> handle_;
};

// ---- Server -----------------------------------------------------------------------------------

// An embedded TCPStore server on a background thread of this process.
class Server {
 public:
  Server() noexcept = default;

  // Listens on `bind_host`:`port` ("" or "::": every interface; port 0: a free port).
  static Server serve(const std::string& bind_host = "", uint16_t port = 0) {
    nvfipc_server* raw = nullptr;
    uint16_t actual = 0;
    detail::check(nvfipc_store_serve(bind_host.c_str(), port, &actual, &raw), "nvfipc_store_serve");
    return Server(raw, actual);
  }

  ~Server() { reset(); }
  Server(Server&& o) noexcept
      : raw_(std::exchange(o.raw_, nullptr)), port_(o.port_), idle_timeout_(o.idle_timeout_) {}
  Server& operator=(Server&& o) noexcept {
    if (this != &o) {
      reset();
      raw_ = std::exchange(o.raw_, nullptr);
      port_ = o.port_;
      idle_timeout_ = o.idle_timeout_;
    }
    return *this;
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const noexcept { return port_; }
  size_t numClients() const {
    size_t n = 0;
    detail::check(nvfipc_server_num_clients(detail::live(raw_, "nvfipc::Server"), &n),
                  "nvfipc_server_num_clients");
    return n;
  }
  // How long the destructor waits for clients to disconnect before stopping (default 30 s).
  void setIdleTimeout(Milliseconds timeout) noexcept { idle_timeout_ = timeout; }

  // Stops the server after waiting (at most `idle_timeout`) for its clients to leave; throws
  // TimeoutError when clients were still connected (the server is stopped in every case).
  void close(Milliseconds idle_timeout = Milliseconds(30000)) {
    detail::check(nvfipc_server_free(std::exchange(raw_, nullptr), idle_timeout.count()),
                  "nvfipc_server_free");
  }

  nvfipc_server* raw() const { return detail::live(raw_, "nvfipc::Server"); }

 private:
  void reset() noexcept {
    if (raw_ != nullptr) {
      (void)nvfipc_server_free(std::exchange(raw_, nullptr), idle_timeout_.count());
    }
  }

  Server(nvfipc_server* raw, uint16_t port) noexcept : raw_(raw), port_(port) {}
  nvfipc_server* raw_ = nullptr;
  uint16_t port_ = 0;
  Milliseconds idle_timeout_{30000};
};

// ---- Context ----------------------------------------------------------------------------------

// One rank's view of the job (rank, world, store) and its barriers.
class Context {
 public:
  Context() noexcept = default;
  Context(Context&& o) noexcept = default;
  // Frees this object's handle before dropping its keepalive.
  Context& operator=(Context&& o) noexcept {
    if (this != &o) {
      handle_.reset();
      keepalive_ = std::move(o.keepalive_);
      handle_ = std::move(o.handle_);
    }
    return *this;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { handle_.reset(); }

  // Rank `rank` of `world_size` over `store` (shared: the context keeps its own reference).
  static Context create(int64_t rank, int64_t world_size, int64_t local_rank,
                        int64_t local_world_size, const Store& store) {
    nvfipc_context* raw = nullptr;
    detail::check(nvfipc_context_create(rank, world_size, local_rank, local_world_size,
                                        store.raw(), &raw),
                  "nvfipc_context_create");
    return Context(raw, store.keepalive());
  }
  // All ranks on this node (local rank = rank).
  static Context create(int64_t rank, int64_t world_size, const Store& store) {
    return create(rank, world_size, rank, world_size, store);
  }

  // Over the TCPStore at host:port, which this rank serves when `host_store` is true.
  static Context connect(int64_t rank, int64_t world_size, const std::string& host, uint16_t port,
                         bool host_store, Milliseconds timeout = kDefaultTimeout) {
    nvfipc_context* raw = nullptr;
    detail::check(nvfipc_context_connect(rank, world_size, host.c_str(), port, host_store,
                                         timeout.count(), &raw),
                  "nvfipc_context_connect");
    return Context(raw, nullptr);
  }

  // From OMPI_COMM_WORLD_*, WORLD_*, SLURM_* or torchrun variables (see nvfipc_context_from_env).
  static Context fromEnv() {
    nvfipc_context* raw = nullptr;
    detail::check(nvfipc_context_from_env(&raw), "nvfipc_context_from_env");
    return Context(raw, nullptr);
  }

  int64_t rank() const { return get(nvfipc_context_rank, "nvfipc_context_rank"); }
  int64_t worldSize() const { return get(nvfipc_context_world_size, "nvfipc_context_world_size"); }
  int64_t localRank() const { return get(nvfipc_context_local_rank, "nvfipc_context_local_rank"); }
  int64_t localWorldSize() const {
    return get(nvfipc_context_local_world_size, "nvfipc_context_local_world_size");
  }
  std::string jobId() const {
    const char* id = nullptr;
    detail::check(nvfipc_context_job_id(raw(), &id), "nvfipc_context_job_id");
    return id == nullptr ? std::string() : std::string(id);
  }
  // The port of the store server this rank hosts, 0 when none.
  uint16_t hostedPort() const {
    uint16_t port = 0;
    detail::check(nvfipc_context_hosted_port(raw(), &port), "nvfipc_context_hosted_port");
    return port;
  }
  // A new reference to the context's store.
  Store store() const {
    nvfipc_store* s = nullptr;
    detail::check(nvfipc_context_store(raw(), &s), "nvfipc_context_store");
    return Store::adopt(s, keepalive_);
  }

  // Waits until every rank of `ranks` (empty: the whole world) has entered this barrier.
  void barrier(const std::vector<int64_t>& ranks = {},
               Milliseconds timeout = kDefaultTimeout) const {
    detail::check(nvfipc_barrier(raw(), ranks.empty() ? nullptr : ranks.data(), ranks.size(),
                                 timeout.count()),
                  "nvfipc_barrier");
  }
  void barrier(Milliseconds timeout) const { barrier({}, timeout); }

  // Frees the context now; a store host first waits (bounded) for the other ranks. Throws
  // TimeoutError when they did not finish (the context is freed in every case).
  void close() {
    const nvfipc_status status = handle_.close();
    keepalive_.reset();
    detail::check(status, "nvfipc_context_free");
  }

  nvfipc_context* raw() const { return detail::live(handle_.get(), "nvfipc::Context"); }
  const std::shared_ptr<void>& keepalive() const noexcept { return keepalive_; }
  explicit operator bool() const noexcept { return handle_.get() != nullptr; }

 private:
  Context(nvfipc_context* raw, std::shared_ptr<void> keepalive) noexcept
      : keepalive_(std::move(keepalive)), handle_(raw) {}

  int64_t get(nvfipc_status (*fn)(const nvfipc_context*, int64_t*), const char* name) const {
    int64_t v = 0;
    detail::check(fn(raw(), &v), name);
    return v;
  }

  std::shared_ptr<void> keepalive_;  // destroyed after handle_
  detail::Owned<nvfipc_context, nvfipc_context_free> handle_;
};

// ---- requests and handles ---------------------------------------------------------------------

enum class Direction : int32_t { Send = NVFIPC_DIRECTION_SEND, Recv = NVFIPC_DIRECTION_RECV };
enum class MemKind : int32_t { Device = NVFIPC_MEM_DEVICE, Host = NVFIPC_MEM_HOST };

// One point-to-point communication of a batch: this rank's buffer, the peer, the direction and
// a tag equal on both ranks (e.g. the communication's name).
struct Request {
  int64_t peer = -1;
  Direction direction = Direction::Send;
  MemKind kind = MemKind::Device;
  std::string tag;
  uint64_t ptr = 0;
  uint64_t bytes = 0;

  static Request send(int64_t peer, std::string tag, const void* ptr, uint64_t bytes,
                      MemKind kind = MemKind::Device) {
    return Request{peer, Direction::Send, kind, std::move(tag), address(ptr), bytes};
  }
  static Request recv(int64_t peer, std::string tag, const void* ptr, uint64_t bytes,
                      MemKind kind = MemKind::Device) {
    return Request{peer, Direction::Recv, kind, std::move(tag), address(ptr), bytes};
  }

  // The C view; valid while this Request (its tag) is alive and unchanged.
  nvfipc_request toC() const noexcept {
    return nvfipc_request{peer, static_cast<int32_t>(direction), static_cast<int32_t>(kind),
                          tag.c_str(), ptr, bytes};
  }

  static uint64_t address(const void* p) noexcept {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  }
};

// One side of a channel: a buffer and its 32-bit semaphore, as addresses of this process.
class Buffer {
 public:
  Buffer() noexcept = default;
  Buffer(uint64_t ptr, uint64_t bytes, uint64_t semaphore) noexcept
      : ptr_(ptr), bytes_(bytes), semaphore_(semaphore) {}
  void* ptr() const noexcept { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr_)); }
  uint64_t bytes() const noexcept { return bytes_; }
  uint32_t* semaphore() const noexcept {
    return reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(semaphore_));
  }
  uint64_t address() const noexcept { return ptr_; }
  uint64_t semaphoreAddress() const noexcept { return semaphore_; }

 private:
  uint64_t ptr_ = 0;
  uint64_t bytes_ = 0;
  uint64_t semaphore_ = 0;
};

// The handles of one channel, shaped like nvFuser's P2pIpcHandle: local() is this rank's buffer
// and semaphore, peer() the peer's, both mapped into this process.
class P2pHandle {
 public:
  P2pHandle() noexcept = default;
  explicit P2pHandle(const nvfipc_p2p_handle& h) noexcept
      : raw_(h),
        local_(h.local_ptr, h.local_bytes, h.local_semaphore),
        peer_(h.peer_ptr, h.peer_bytes, h.peer_semaphore) {}
  const Buffer& local() const noexcept { return local_; }
  const Buffer& peer() const noexcept { return peer_; }
  MemKind kind() const noexcept { return static_cast<MemKind>(raw_.kind); }
  const nvfipc_p2p_handle& raw() const noexcept { return raw_; }
  // For the explicit-transfer CUDA primitives (cudaSendPost & co.).
  nvfipc_p2p_endpoint endpoint() const noexcept {
    return nvfipc_p2p_endpoint{raw_.local_ptr,     raw_.local_bytes, raw_.local_semaphore,
                               raw_.peer_ptr,      raw_.peer_bytes,  raw_.peer_semaphore};
  }

 private:
  nvfipc_p2p_handle raw_{};
  Buffer local_;
  Buffer peer_;
};

using CacheStats = nvfipc_cache_counters;

// ---- Channel ----------------------------------------------------------------------------------

// One exchanged channel opened for its transfers (HandleCache::channel): a post does no lookup.
// Stale once a later exchange replaces the channel's buffers, an exchange of it fails, or its
// cache is freed: every call then throws InvalidStateError and touches nothing; open it again
// after the exchange. Does not keep the cache alive. Move-only; freed by its destructor.
class Channel {
 public:
  Channel() noexcept = default;
  Channel(Channel&&) noexcept = default;
  Channel& operator=(Channel&&) noexcept = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  // Takes ownership of a channel from nvfipc_channel_open.
  explicit Channel(nvfipc_channel* raw) noexcept : handle_(raw) {}

  // Device P2P (nvFuser's get_zcopy), enqueued on `stream` (a CUstream / cudaStream_t).
  void sendPost(void* stream) const {
    detail::check(nvfipc_cuda_channel_send_post(raw(), stream), "nvfipc_cuda_channel_send_post");
  }
  void recvPost(uint64_t bytes, void* stream) const {
    detail::check(nvfipc_cuda_channel_recv_post(raw(), bytes, stream),
                  "nvfipc_cuda_channel_recv_post");
  }
  void sendWait(void* stream) const {
    detail::check(nvfipc_cuda_channel_send_wait(raw(), stream), "nvfipc_cuda_channel_send_wait");
  }

  // Host P2P over shared memory, run by the calling thread; recv and wait block (bounded by
  // `timeout`; kDefaultTimeout: the cache's).
  void hostSendPost() const {
    detail::check(nvfipc_host_channel_send_post(raw()), "nvfipc_host_channel_send_post");
  }
  void hostRecvPost(uint64_t bytes, Milliseconds timeout = kDefaultTimeout) const {
    detail::check(nvfipc_host_channel_recv_post(raw(), bytes, timeout.count()),
                  "nvfipc_host_channel_recv_post");
  }
  void hostSendWait(Milliseconds timeout = kDefaultTimeout) const {
    detail::check(nvfipc_host_channel_send_wait(raw(), timeout.count()),
                  "nvfipc_host_channel_send_wait");
  }

  // The channel's handles, as HandleCache::get gives them (InvalidStateError once stale).
  P2pHandle handles() const {
    nvfipc_p2p_handle h{};
    detail::check(nvfipc_channel_handles(raw(), &h), "nvfipc_channel_handles");
    return P2pHandle(h);
  }

  void close() { detail::check(handle_.close(), "nvfipc_channel_free"); }
  nvfipc_channel* raw() const { return detail::live(handle_.get(), "nvfipc::Channel"); }
  explicit operator bool() const noexcept { return handle_.get() != nullptr; }

 private:
  detail::Owned<nvfipc_channel, nvfipc_channel_free> handle_;
};

// ---- HandleCache ------------------------------------------------------------------------------

// Exchanges and caches P2P handles (nvFuser's IpcHandleCache). Thread-safe; concurrent
// exchanges must use different channels.
class HandleCache {
 public:
  HandleCache() noexcept = default;
  HandleCache(HandleCache&& o) noexcept = default;
  // Frees this object's handle before dropping its keepalive.
  HandleCache& operator=(HandleCache&& o) noexcept {
    if (this != &o) {
      handle_.reset();
      keepalive_ = std::move(o.keepalive_);
      handle_ = std::move(o.handle_);
      world_ = o.world_;
    }
    return *this;
  }
  HandleCache(const HandleCache&) = delete;
  HandleCache& operator=(const HandleCache&) = delete;
  ~HandleCache() { handle_.reset(); }

  // The cache of `ctx`'s rank; `scope` (equal on all ranks) separates several caches of one job
  // in one process.
  explicit HandleCache(const Context& ctx, const std::string& scope = "")
      : keepalive_(ctx.keepalive()), world_(ctx.worldSize()) {
    nvfipc_cache* raw = nullptr;
    if (scope.empty()) {
      detail::check(nvfipc_cache_create(ctx.raw(), &raw), "nvfipc_cache_create");
    } else {
      detail::check(nvfipc_cache_create_scoped(ctx.raw(), scope.c_str(), &raw),
                    "nvfipc_cache_create_scoped");
    }
    handle_ = detail::Owned<nvfipc_cache, nvfipc_cache_free>(raw);
  }

  // Collective with every peer named in `requests` (any order on either side). `timeout`:
  // kDefaultTimeout uses the cache's.
  void exchangeHandles(const std::vector<Request>& requests,
                       Milliseconds timeout = kDefaultTimeout) const {
    std::vector<nvfipc_request> c;
    c.reserve(requests.size());
    for (const auto& r : requests) c.push_back(r.toC());
    detail::check(nvfipc_exchange_handles_timeout(raw(), c.data(), c.size(), timeout.count()),
                  "nvfipc_exchange_handles");
  }

  // The handles of an exchanged request; NotFoundError when it was not exchanged.
  P2pHandle get(const Request& request) const {
    nvfipc_request c = request.toC();
    nvfipc_p2p_handle h{};
    detail::check(nvfipc_cache_get(raw(), &c, &h), "nvfipc_cache_get");
    return P2pHandle(h);
  }

  // The channel of an exchanged request, opened for its transfers (see Channel); NotFoundError
  // when it was not exchanged.
  Channel channel(const Request& request) const {
    nvfipc_request c = request.toC();
    nvfipc_channel* raw_channel = nullptr;
    detail::check(nvfipc_channel_open(raw(), &c, &raw_channel), "nvfipc_channel_open");
    return Channel(raw_channel);
  }

  // One member's buffer of a symmetric allocation, as mapped in this process.
  struct SymmetricPeer {
    int64_t rank;
    void* ptr;
    uint64_t bytes;
  };

  // Maps every other member's buffer of the symmetric allocation `tag` (equal on every member):
  // `ptr`/`bytes` of `kind` is this rank's; `ranks` the members (empty: the world). Returns one
  // entry per member in increasing rank order (this rank's own pointer for itself). No barrier:
  // each rank waits only for the peers it maps; a second rendezvous of the same buffers is free.
  std::vector<SymmetricPeer> symmetricRendezvous(const std::string& tag, MemKind kind,
                                                 const void* ptr, uint64_t bytes,
                                                 const std::vector<int64_t>& ranks = {},
                                                 Milliseconds timeout = kDefaultTimeout) const {
    std::vector<int64_t> members = ranks;
    if (members.empty()) {
      for (int64_t r = 0; r < world_; ++r) members.push_back(r);
    }
    std::sort(members.begin(), members.end());
    std::vector<uint64_t> ptrs(members.size()), sizes(members.size());
    detail::check(
        nvfipc_symmetric_rendezvous(raw(), tag.c_str(), static_cast<int32_t>(kind),
                                    reinterpret_cast<uint64_t>(ptr), bytes,
                                    ranks.empty() ? nullptr : ranks.data(), ranks.size(),
                                    timeout.count(), ptrs.data(), sizes.data(), ptrs.size()),
        "nvfipc_symmetric_rendezvous");
    std::vector<SymmetricPeer> out;
    out.reserve(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      out.push_back({members[i], reinterpret_cast<void*>(ptrs[i]), sizes[i]});
    }
    return out;
  }

  // A contiguous view of a symmetric allocation: member i's buffer (i-th in increasing rank
  // order) at `base + i * stride`.
  struct SymmetricView {
    void* base;
    uint64_t stride;
    void* member(size_t i) const {
      return static_cast<char*>(base) + static_cast<uint64_t>(i) * stride;
    }
  };

  // Maps every member's buffer of the last rendezvous of `tag` again, in increasing rank order
  // (this rank's own included), into one reserved address range. Every member's buffer must
  // have the same size and offset within its allocation granule (InvalidArgumentError names
  // those that differ); device buffers must be VMM allocations (UnsupportedError for cudaMalloc
  // or pool memory). The view belongs to the cache: asking again returns it at no cost; it is
  // unmapped by a rendezvous of `tag` with other buffers, symmetricRelease(tag) or the cache's end.
  SymmetricView symmetricContiguousView(const std::string& tag) const {
    uint64_t base = 0, stride = 0;
    detail::check(nvfipc_symmetric_contiguous_view(raw(), tag.c_str(), &base, &stride),
                  "nvfipc_symmetric_contiguous_view");
    return {reinterpret_cast<void*>(base), stride};
  }

  // Drops, in this process, what the rendezvous of `tag` mapped (the peers' buffers and the
  // view); local and cheap: no store traffic, no waiting for peers. The pointers are invalid
  // afterwards; a later rendezvous of `tag` works whatever order the members released in.
  // Throws like every call (InvalidArgumentError when `tag` is not rendezvoused): a destructor
  // calls it inside try/catch, or calls nvfipc_symmetric_release, which never throws.
  void symmetricRelease(const std::string& tag) const {
    detail::check(nvfipc_symmetric_release(raw(), tag.c_str()), "nvfipc_symmetric_release");
  }

  CacheStats stats() const {
    CacheStats s{};
    detail::check(nvfipc_cache_stats(raw(), &s), "nvfipc_cache_stats");
    return s;
  }

  // How many replaced peer allocations stay mapped per (peer, memory kind) for buffers carved
  // again from them (default 8; 0: release every replaced mapping at once).
  void setRetainedMappings(uint32_t perPeer) const {
    detail::check(nvfipc_cache_set_retained_mappings(raw(), perPeer),
                  "nvfipc_cache_set_retained_mappings");
  }

  // Device P2P (nvFuser's get_zcopy), enqueued on `stream` (a CUstream / cudaStream_t).
  void sendPost(const Request& send, void* stream) const {
    nvfipc_request c = send.toC();
    detail::check(nvfipc_cuda_p2p_send_post(raw(), &c, stream), "nvfipc_cuda_p2p_send_post");
  }
  void recvPost(const Request& recv, uint64_t bytes, void* stream) const {
    nvfipc_request c = recv.toC();
    detail::check(nvfipc_cuda_p2p_recv_post(raw(), &c, bytes, stream), "nvfipc_cuda_p2p_recv_post");
  }
  void sendWait(const Request& send, void* stream) const {
    nvfipc_request c = send.toC();
    detail::check(nvfipc_cuda_p2p_send_wait(raw(), &c, stream), "nvfipc_cuda_p2p_send_wait");
  }

  // Host P2P over shared memory: the same protocol, run by the calling thread. recv and wait
  // block (bounded by `timeout`).
  void hostSendPost(const Request& send) const {
    nvfipc_request c = send.toC();
    detail::check(nvfipc_host_p2p_send_post(raw(), &c), "nvfipc_host_p2p_send_post");
  }
  void hostRecvPost(const Request& recv, uint64_t bytes,
                    Milliseconds timeout = kDefaultTimeout) const {
    nvfipc_request c = recv.toC();
    detail::check(nvfipc_host_p2p_recv_post(raw(), &c, bytes, timeout.count()),
                  "nvfipc_host_p2p_recv_post");
  }
  void hostSendWait(const Request& send, Milliseconds timeout = kDefaultTimeout) const {
    nvfipc_request c = send.toC();
    detail::check(nvfipc_host_p2p_send_wait(raw(), &c, timeout.count()),
                  "nvfipc_host_p2p_send_wait");
  }

  void close() {
    const nvfipc_status status = handle_.close();
    keepalive_.reset();
    detail::check(status, "nvfipc_cache_free");
  }
  nvfipc_cache* raw() const { return detail::live(handle_.get(), "nvfipc::HandleCache"); }
  explicit operator bool() const noexcept { return handle_.get() != nullptr; }

 private:
  std::shared_ptr<void> keepalive_;  // destroyed after handle_
  detail::Owned<nvfipc_cache, nvfipc_cache_free> handle_;
  int64_t world_ = 0;
};

// nvFuser's name for the cache.
using IpcHandleCache = HandleCache;

// ---- HostBuffer -------------------------------------------------------------------------------

// Zero-filled shared-memory host memory that peers can map (MemKind::Host requests).
class HostBuffer {
 public:
  HostBuffer() noexcept = default;
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    detail::check(nvfipc_host_alloc(bytes, &ptr_), "nvfipc_host_alloc");
  }
  ~HostBuffer() { reset(); }
  HostBuffer(HostBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const noexcept { return ptr_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  size_t size() const noexcept { return bytes_; }
  // Frees now, reporting errors.
  void close() {
    bytes_ = 0;
    detail::check(nvfipc_host_free(std::exchange(ptr_, nullptr)), "nvfipc_host_free");
  }

 private:
  void reset() noexcept {
    bytes_ = 0;
    if (ptr_ != nullptr) (void)nvfipc_host_free(std::exchange(ptr_, nullptr));
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- CUDA helpers -----------------------------------------------------------------------------

// Whether a CUDA driver could be loaded (never throws for a missing driver).
inline bool cudaAvailable() {
  bool ok = false;
  detail::check(nvfipc_cuda_available(&ok), "nvfipc_cuda_available");
  return ok;
}

inline nvfipc_cuda_ipc_counters cudaIpcCounters() {
  nvfipc_cuda_ipc_counters c{};
  detail::check(nvfipc_cuda_ipc_counters_get(&c), "nvfipc_cuda_ipc_counters_get");
  return c;
}

// VMM and pool import counters of this process (imports == releases after a clean teardown).
inline nvfipc_cuda_vmm_counters cudaVmmCounters() {
  nvfipc_cuda_vmm_counters c{};
  detail::check(nvfipc_cuda_vmm_counters_get(&c), "nvfipc_cuda_vmm_counters_get");
  return c;
}

// How the exchange exports the device buffer [ptr, ptr + bytes): cudaMalloc, VMM or pool memory.
enum class DeviceMemory : int32_t {
  Legacy = NVFIPC_DEVICE_MEMORY_LEGACY,
  Vmm = NVFIPC_DEVICE_MEMORY_VMM,
  Pool = NVFIPC_DEVICE_MEMORY_POOL,
};

// Throws (with the library's message and remedy) for memory no export can share.
inline DeviceMemory cudaPointerMemory(const void* ptr, uint64_t bytes) {
  int32_t kind = -1;
  detail::check(nvfipc_cuda_pointer_memory(ptr, bytes, &kind), "nvfipc_cuda_pointer_memory");
  return static_cast<DeviceMemory>(kind);
}

// Explicit-transfer primitives on a channel's endpoint (transfer = 1, 2, ... per channel).
inline void cudaSendPost(const P2pHandle& h, uint64_t transfer, void* stream) {
  nvfipc_p2p_endpoint e = h.endpoint();
  detail::check(nvfipc_cuda_endpoint_send_post(&e, transfer, stream),
                "nvfipc_cuda_endpoint_send_post");
}
inline void cudaRecvPost(const P2pHandle& h, uint64_t transfer, uint64_t bytes, void* stream) {
  nvfipc_p2p_endpoint e = h.endpoint();
  detail::check(nvfipc_cuda_endpoint_recv_post(&e, transfer, bytes, stream),
                "nvfipc_cuda_endpoint_recv_post");
}
inline void cudaSendWait(const P2pHandle& h, uint64_t transfer, void* stream) {
  nvfipc_p2p_endpoint e = h.endpoint();
  detail::check(nvfipc_cuda_endpoint_send_wait(&e, transfer, stream),
                "nvfipc_cuda_endpoint_send_wait");
}

}  // namespace nvfipc
