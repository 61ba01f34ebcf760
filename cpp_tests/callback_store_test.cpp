// A store whose operations are host callbacks (how nvFuser hands over its own c10d::Store):
// the library calls a C++ map through the nvfipc_store_callbacks vtable.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "test_util.hpp"

namespace {

// A thread-safe in-memory key-value store with blocking waits, reached only through callbacks.
class HostStore {
 public:
  static nvfipc_store_callbacks Callbacks(HostStore* self) {
    nvfipc_store_callbacks cb;
    std::memset(&cb, 0, sizeof(cb));
    cb.ctx = self;
    cb.set = &Set;
    cb.get = &Get;
    cb.add = &Add;
    cb.check = &Check;
    cb.delete_key = &DeleteKey;
    cb.wait = &Wait;
    cb.compare_set = &CompareSet;
    cb.error_message = &ErrorMessage;
    return cb;
  }

  int calls() const { return calls_; }

 private:
  static HostStore* Self(void* ctx) { return static_cast<HostStore*>(ctx); }

  static int Set(void* ctx, const char* key, size_t key_len, const uint8_t* value,
                 size_t value_len) {
    HostStore* s = Self(ctx);
    std::lock_guard<std::mutex> lock(s->mu_);
    ++s->calls_;
    s->map_[std::string(key, key_len)] =
        std::string(reinterpret_cast<const char*>(value), value_len);
    s->cv_.notify_all();
    return 0;
  }

  static bool AllPresent(HostStore* s, const char* const* keys, const size_t* lens, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (s->map_.count(std::string(keys[i], lens[i])) == 0) return false;
    }
    return true;
  }

  static int Get(void* ctx, const char* key, size_t key_len, int64_t timeout_ms,
                 uint8_t** out_value, size_t* out_len) {
    HostStore* s = Self(ctx);
    std::unique_lock<std::mutex> lock(s->mu_);
    ++s->calls_;
    const std::string k(key, key_len);
    if (!s->cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return s->map_.count(k) != 0; })) {
      s->last_error_ = "key " + k + " not set in time";
      return NVFIPC_STATUS_TIMEOUT;
    }
    const std::string& v = s->map_[k];
    *out_len = v.size();
    *out_value = nullptr;
    if (!v.empty()) {
      *out_value = static_cast<uint8_t*>(std::malloc(v.size()));
      std::memcpy(*out_value, v.data(), v.size());
    }
    return 0;
  }

  static int Add(void* ctx, const char* key, size_t key_len, int64_t delta, int64_t* out_value) {
    HostStore* s = Self(ctx);
    std::lock_guard<std::mutex> lock(s->mu_);
    ++s->calls_;
    std::string& v = s->map_[std::string(key, key_len)];
    int64_t value = (v.empty() ? 0 : std::stoll(v)) + delta;
    v = std::to_string(value);
    *out_value = value;
    s->cv_.notify_all();
    return 0;
  }

  static int Check(void* ctx, const char* const* keys, const size_t* key_lens, size_t n,
                   bool* out_ready) {
    HostStore* s = Self(ctx);
    std::lock_guard<std::mutex> lock(s->mu_);
    ++s->calls_;
    *out_ready = AllPresent(s, keys, key_lens, n);
    return 0;
  }

  static int DeleteKey(void* ctx, const char* key, size_t key_len, bool* out_deleted) {
    HostStore* s = Self(ctx);
    std::lock_guard<std::mutex> lock(s->mu_);
    ++s->calls_;
    *out_deleted = s->map_.erase(std::string(key, key_len)) != 0;
    return 0;
  }

  static int Wait(void* ctx, const char* const* keys, const size_t* key_lens, size_t n,
                  int64_t timeout_ms) {
    HostStore* s = Self(ctx);
    std::unique_lock<std::mutex> lock(s->mu_);
    ++s->calls_;
    if (!s->cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                         [&] { return AllPresent(s, keys, key_lens, n); })) {
      s->last_error_ = "wait timed out";
      return NVFIPC_STATUS_TIMEOUT;
    }
    return 0;
  }

  static int CompareSet(void* ctx, const char* key, size_t key_len, const uint8_t* expected,
                        size_t expected_len, const uint8_t* desired, size_t desired_len,
                        uint8_t** out_value, size_t* out_len) {
    HostStore* s = Self(ctx);
    std::lock_guard<std::mutex> lock(s->mu_);
    ++s->calls_;
    const std::string k(key, key_len);
    const std::string want(reinterpret_cast<const char*>(expected), expected_len);
    const std::string next(reinterpret_cast<const char*>(desired), desired_len);
    auto it = s->map_.find(k);
    std::string result;
    if (it == s->map_.end()) {
      result = want.empty() ? next : want;
      if (want.empty()) s->map_[k] = next;
    } else if (it->second == want) {
      it->second = next;
      result = next;
    } else {
      result = it->second;
    }
    s->cv_.notify_all();
    *out_len = result.size();
    *out_value = nullptr;
    if (!result.empty()) {
      *out_value = static_cast<uint8_t*>(std::malloc(result.size()));
      std::memcpy(*out_value, result.data(), result.size());
    }
    return 0;
  }

  static const char* ErrorMessage(void* ctx) { return Self(ctx)->last_error_.c_str(); }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
  std::string last_error_;
  int calls_ = 0;
};

}  // namespace

TEST(CallbackStore, OperationsGoThroughTheHostCallbacks) {
  HostStore host;
  nvfipc_store_callbacks cb = HostStore::Callbacks(&host);
  nvfipc_store* store = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_from_callbacks(&cb, &store));

  NVFIPC_ASSERT_OK(nvfipc_store_set(store, "k", reinterpret_cast<const uint8_t*>("v"), 1));
  uint8_t* data = nullptr;
  size_t len = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_get(store, "k", 100, &data, &len));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(data), len), "v");
  NVFIPC_ASSERT_OK(nvfipc_buffer_free(data, len));
  int64_t counter = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_add(store, "n", 3, &counter));
  EXPECT_EQ(counter, 3);
  const char* keys[] = {"k", "n"};
  bool all = false;
  NVFIPC_ASSERT_OK(nvfipc_store_check(store, keys, 2, &all));
  EXPECT_TRUE(all);
  NVFIPC_ASSERT_OK(nvfipc_store_wait(store, keys, 2, 100));
  bool deleted = false;
  NVFIPC_ASSERT_OK(nvfipc_store_delete_key(store, "k", &deleted));
  EXPECT_TRUE(deleted);
  EXPECT_GE(host.calls(), 6);

  // The host's timeout and message come back through the library.
  NVFIPC_EXPECT_ERROR(nvfipc_store_get(store, "k", 10, &data, &len), NVFIPC_STATUS_TIMEOUT,
                      "key k not set in time");
  // Optional operations the vtable lacks are reported as unsupported.
  int64_t num_keys = 0;
  NVFIPC_EXPECT_ERROR(nvfipc_store_num_keys(store, &num_keys), NVFIPC_STATUS_UNSUPPORTED,
                      "num_keys");
  NVFIPC_EXPECT_ERROR(nvfipc_store_ping(store, nullptr), NVFIPC_STATUS_UNSUPPORTED, "TCP");
  // Where its server listens: taken for a callback store, with the address checked.
  NVFIPC_EXPECT_OK(nvfipc_store_set_server_address(store, "localhost", 29500));
  NVFIPC_EXPECT_ERROR(nvfipc_store_set_server_address(store, nullptr, 29500),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "host");
  NVFIPC_EXPECT_ERROR(nvfipc_store_set_server_address(store, "localhost", 0),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "port");
  NVFIPC_EXPECT_OK(nvfipc_store_free(store));
}

TEST(CallbackStore, MissingRequiredCallbackIsRejected) {
  HostStore host;
  nvfipc_store_callbacks cb = HostStore::Callbacks(&host);
  cb.wait = nullptr;
  nvfipc_store* store = nullptr;
  NVFIPC_EXPECT_ERROR(nvfipc_store_from_callbacks(&cb, &store), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "wait");
  EXPECT_EQ(store, nullptr);
  NVFIPC_EXPECT_ERROR(nvfipc_store_from_callbacks(nullptr, &store),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "callbacks");
}

TEST(CallbackStore, ContextAndBarrierRunOverCallbacks) {
  // Two ranks in two threads of one process, sharing one host store: a world barrier and a
  // subset barrier, repeated.
  HostStore host;
  nvfipc_store_callbacks cb = HostStore::Callbacks(&host);
  nvfipc_store* store = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_from_callbacks(&cb, &store));
  nvfipc_status results[2] = {NVFIPC_STATUS_INTERNAL, NVFIPC_STATUS_INTERNAL};
  std::string messages[2];
  auto rank_main = [&](int64_t rank) {
    nvfipc_context* ctx = nullptr;
    nvfipc_status st = nvfipc_context_create(rank, 2, rank, 2, store, &ctx);
    for (int i = 0; st == NVFIPC_STATUS_OK && i < 10; ++i) {
      st = nvfipc_barrier(ctx, nullptr, 0, 10000);
    }
    const int64_t both[] = {1, 0};
    for (int i = 0; st == NVFIPC_STATUS_OK && i < 10; ++i) {
      st = nvfipc_barrier(ctx, both, 2, 10000);
    }
    if (st == NVFIPC_STATUS_OK) st = nvfipc_context_free(ctx);
    results[rank] = st;
    messages[rank] = nvfipc_test::LastError();
  };
  std::thread r0(rank_main, 0), r1(rank_main, 1);
  r0.join();
  r1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], NVFIPC_STATUS_OK) << "rank " << r << ": " << messages[r];
  }
  NVFIPC_EXPECT_OK(nvfipc_store_free(store));
}
