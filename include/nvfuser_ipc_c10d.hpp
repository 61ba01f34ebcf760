// Adapter from PyTorch's c10d::Store (e.g. the c10d::TCPStore of nvFuser's Communicator) to the
// nvfuser-ipc host-callback store (nvfipc_store_callbacks), header-only, C++17.
//
//   c10::intrusive_ptr<c10d::Store> store = ...;              // a c10d::TCPStore, PrefixStore...
//   nvfipc::Store s = nvfipc::c10d::storeFrom(store);          // keeps `store` alive
//   nvfipc::Context ctx = nvfipc::Context::create(rank, world, local_rank, local_world, s);
//
// At the callback boundary every C++ exception is caught: the callback returns a status and
// keeps the exception's text for `error_message` (per thread). Timeouts (c10d's DistStoreError
// or any error whose text says "timeout"/"timed out") map to NVFIPC_STATUS_TIMEOUT, network
// errors to NVFIPC_STATUS_IO, c10::NotImplementedError to NVFIPC_STATUS_UNSUPPORTED, anything
// else to NVFIPC_STATUS_IO. Values handed to the library are malloc'd and released by
// `free_value` (std::free).
//
// Timeouts: c10d's `wait(keys, 0ms)` means "no timeout", so a zero `timeout_ms` (check once) is
// implemented with `check`; a negative one uses the store's own timeout.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "nvfuser_ipc.hpp"

namespace nvfipc {
namespace c10d {

// Owns a reference to a c10d::Store and exposes it as an nvfipc_store_callbacks vtable whose
// ctx is this object. It must outlive every nvfipc store, context and cache made from the
// vtable; storeFrom() arranges that through the Store's keepalive.
class C10dStoreCallbacks {
 public:
  explicit C10dStoreCallbacks(c10::intrusive_ptr<::c10d::Store> store)
      : store_(std::move(store)) {
    if (!store_) {
      throw InvalidArgumentError(Status::InvalidArgument, "nvfipc::c10d::C10dStoreCallbacks",
                                 "the c10d store is null");
    }
  }
  C10dStoreCallbacks(const C10dStoreCallbacks&) = delete;
  C10dStoreCallbacks& operator=(const C10dStoreCallbacks&) = delete;

  // The vtable; `ctx` points to this object.
  nvfipc_store_callbacks vtable() {
    nvfipc_store_callbacks cb{};
    cb.ctx = this;
    cb.set = &Set;
    cb.get = &Get;
    cb.add = &Add;
    cb.check = &Check;
    cb.delete_key = &DeleteKey;
    cb.wait = &Wait;
    cb.compare_set = &CompareSet;
    cb.append = &Append;
    cb.num_keys = &NumKeys;
    cb.multi_set = &MultiSet;
    cb.multi_get = &MultiGet;
    cb.free_value = &FreeValue;
    cb.error_message = &ErrorMessage;
    return cb;
  }

  const c10::intrusive_ptr<::c10d::Store>& store() const noexcept { return store_; }

  // The status a callback returns for an exception's text and type (exposed for tests).
  static int classify(const std::exception& e) noexcept {
    if (dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr) {
      return NVFIPC_STATUS_UNSUPPORTED;
    }
    if (mentionsTimeout(e.what())) return NVFIPC_STATUS_TIMEOUT;
    if (dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr) return NVFIPC_STATUS_IO;
    return NVFIPC_STATUS_IO;
  }

  static bool mentionsTimeout(const char* text) noexcept {
    if (text == nullptr) return false;
    std::string lower(text);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("timeout") != std::string::npos ||
           lower.find("timed out") != std::string::npos;
  }

 private:
  // ---- boundary --------------------------------------------------------------------------

  static std::string& lastError() noexcept {
    thread_local std::string message;
    return message;
  }

  static void remember(const char* op, const char* what) noexcept {
    try {
      lastError() = std::string("c10d::Store::") + op + ": " + (what ? what : "unknown error");
    } catch (...) {
      // Out of memory while describing the failure: the status alone still reaches the caller.
    }
  }

  // Runs `body` and turns every exception into a status (never unwinds into the library).
  template <typename F>
  static int guarded(const char* op, F&& body) noexcept {
    try {
      body();
      return NVFIPC_STATUS_OK;
    } catch (const std::bad_alloc& e) {
      remember(op, e.what());
      return NVFIPC_STATUS_INTERNAL;
    } catch (const std::exception& e) {
      remember(op, e.what());
      return classify(e);
    } catch (...) {
      remember(op, "a non-standard C++ exception");
      return NVFIPC_STATUS_IO;
    }
  }

  static ::c10d::Store& of(void* ctx) { return *static_cast<C10dStoreCallbacks*>(ctx)->store_; }

  static std::string key(const char* k, size_t len) { return std::string(k, len); }

  static std::vector<std::string> keys(const char* const* k, const size_t* lens, size_t n) {
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) out.emplace_back(k[i], lens[i]);
    return out;
  }

  // A malloc'd copy of `v` (NULL for an empty value), as the vtable contract requires.
  static uint8_t* mallocCopy(const std::vector<uint8_t>& v) {
    if (v.empty()) return nullptr;
    auto* p = static_cast<uint8_t*>(std::malloc(v.size()));
    if (p == nullptr) throw std::bad_alloc();
    std::memcpy(p, v.data(), v.size());
    return p;
  }

  // Waits for `ks` honouring the library's timeout convention; returns false on "not there"
  // for a zero timeout.
  static bool waitFor(::c10d::Store& s, const std::vector<std::string>& ks, int64_t timeout_ms) {
    if (timeout_ms == 0) return s.check(ks);
    if (timeout_ms < 0) {
      s.wait(ks);
    } else {
      s.wait(ks, std::chrono::milliseconds(timeout_ms));
    }
    return true;
  }

  static int notThere(const char* op, const std::string& what) noexcept {
    remember(op, (what + " does not exist (checked once, timeout_ms = 0)").c_str());
    return NVFIPC_STATUS_TIMEOUT;
  }

  // ---- callbacks -------------------------------------------------------------------------

  static int Set(void* ctx, const char* k, size_t klen, const uint8_t* v, size_t vlen) {
    return guarded("set", [&] {
      of(ctx).set(key(k, klen), std::vector<uint8_t>(v, v + vlen));
    });
  }

  static int Get(void* ctx, const char* k, size_t klen, int64_t timeout_ms, uint8_t** out,
                 size_t* out_len) {
    bool present = true;
    std::string name;
    int st = guarded("get", [&] {
      name = key(k, klen);
      ::c10d::Store& s = of(ctx);
      present = waitFor(s, {name}, timeout_ms);
      if (!present) return;
      std::vector<uint8_t> v = s.get(name);
      uint8_t* copy = mallocCopy(v);
      *out = copy;
      *out_len = v.size();
    });
    if (st == NVFIPC_STATUS_OK && !present) return notThere("get", "key '" + name + "'");
    return st;
  }

  static int Add(void* ctx, const char* k, size_t klen, int64_t delta, int64_t* out) {
    return guarded("add", [&] { *out = of(ctx).add(key(k, klen), delta); });
  }

  static int Check(void* ctx, const char* const* k, const size_t* lens, size_t n, bool* ready) {
    return guarded("check", [&] { *ready = of(ctx).check(keys(k, lens, n)); });
  }

  static int DeleteKey(void* ctx, const char* k, size_t klen, bool* deleted) {
    return guarded("deleteKey", [&] { *deleted = of(ctx).deleteKey(key(k, klen)); });
  }

  static int Wait(void* ctx, const char* const* k, const size_t* lens, size_t n,
                  int64_t timeout_ms) {
    bool present = true;
    int st = guarded("wait", [&] { present = waitFor(of(ctx), keys(k, lens, n), timeout_ms); });
    if (st == NVFIPC_STATUS_OK && !present) {
      return notThere("wait", std::to_string(n) + " key(s)");
    }
    return st;
  }

  static int CompareSet(void* ctx, const char* k, size_t klen, const uint8_t* expected,
                        size_t expected_len, const uint8_t* desired, size_t desired_len,
                        uint8_t** out, size_t* out_len) {
    return guarded("compareSet", [&] {
      std::vector<uint8_t> v = of(ctx).compareSet(
          key(k, klen), std::vector<uint8_t>(expected, expected + expected_len),
          std::vector<uint8_t>(desired, desired + desired_len));
      uint8_t* copy = mallocCopy(v);
      *out = copy;
      *out_len = v.size();
    });
  }

  static int Append(void* ctx, const char* k, size_t klen, const uint8_t* v, size_t vlen) {
    return guarded("append", [&] {
      of(ctx).append(key(k, klen), std::vector<uint8_t>(v, v + vlen));
    });
  }

  static int NumKeys(void* ctx, int64_t* out) {
    return guarded("getNumKeys", [&] { *out = of(ctx).getNumKeys(); });
  }

  static int MultiSet(void* ctx, const char* const* k, const size_t* lens,
                      const uint8_t* const* values, const size_t* value_lens, size_t n) {
    return guarded("multiSet", [&] {
      std::vector<std::vector<uint8_t>> vs;
      vs.reserve(n);
      for (size_t i = 0; i < n; ++i) vs.emplace_back(values[i], values[i] + value_lens[i]);
      of(ctx).multiSet(keys(k, lens, n), vs);
    });
  }

  static int MultiGet(void* ctx, const char* const* k, const size_t* lens, size_t n,
                      int64_t timeout_ms, uint8_t** out_values, size_t* out_lens) {
    bool present = true;
    int st = guarded("multiGet", [&] {
      std::vector<std::string> ks = keys(k, lens, n);
      ::c10d::Store& s = of(ctx);
      present = waitFor(s, ks, timeout_ms);
      if (!present) return;
      std::vector<std::vector<uint8_t>> vs = s.multiGet(ks);
      if (vs.size() != n) {
        throw std::runtime_error("multiGet returned " + std::to_string(vs.size()) +
                                 " values for " + std::to_string(n) + " keys");
      }
      // Copy all first; on failure free what was copied so nothing leaks.
      std::vector<uint8_t*> copies(n, nullptr);
      try {
        for (size_t i = 0; i < n; ++i) copies[i] = mallocCopy(vs[i]);
      } catch (...) {
        for (uint8_t* p : copies) std::free(p);
        throw;
      }
      for (size_t i = 0; i < n; ++i) {
        out_values[i] = copies[i];
        out_lens[i] = vs[i].size();
      }
    });
    if (st == NVFIPC_STATUS_OK && !present) {
      return notThere("multiGet", std::to_string(n) + " key(s)");
    }
    return st;
  }

  static void FreeValue(void* /*ctx*/, uint8_t* ptr, size_t /*len*/) { std::free(ptr); }

  static const char* ErrorMessage(void* /*ctx*/) {
    const std::string& m = lastError();
    return m.empty() ? nullptr : m.c_str();
  }

  c10::intrusive_ptr<::c10d::Store> store_;
};

// An nvfipc::Store over `store`. The returned Store (and every Context/HandleCache made from
// it) keeps the adapter, and so the c10d store, alive. For a c10d::TCPStore the library is told
// where its server listens, so that a rank closing after the server's rank has left (nvFuser's
// rank 0 hosts its Communicator's TCPStore) makes no request that c10d would fail and warn about.
inline ::nvfipc::Store storeFrom(c10::intrusive_ptr<::c10d::Store> store) {
  const auto* tcp = dynamic_cast<const ::c10d::TCPStore*>(store.get());
  std::string host = tcp != nullptr ? tcp->getHost() : std::string();
  const uint16_t port = tcp != nullptr ? tcp->getPort() : 0;
  auto adapter = std::make_shared<C10dStoreCallbacks>(std::move(store));
  nvfipc_store_callbacks cb = adapter->vtable();
  ::nvfipc::Store s = ::nvfipc::Store::fromCallbacks(cb, std::move(adapter));
  if (!host.empty() && port != 0) s.setServerAddress(host, port);
  return s;
}

}  // namespace c10d
}  // namespace nvfipc
