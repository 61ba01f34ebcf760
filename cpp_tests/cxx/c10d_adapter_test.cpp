// The c10d adapter: every store operation of nvfipc::Store over a real c10d::TCPStore, timeouts
// and exceptions mapped to statuses at the callback boundary, the lifetime of the adapter, and a
// rank 0 whose process runs the TCPStore's server keeping it until the other ranks have closed.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.hpp"
#include "nvfuser_ipc_c10d.hpp"

namespace {

using nvfipc::Milliseconds;

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10::intrusive_ptr<::c10d::TCPStore> ServeTcpStore() {
  ::c10d::TCPStoreOptions opts;
  opts.port = 0;  // any free port
  opts.isServer = true;
  opts.timeout = std::chrono::seconds(20);
  return c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", opts);
}

TEST(C10dAdapter, EveryOperationThroughTcpStore) {
  auto tcp = ServeTcpStore();
  nvfipc::Store store = nvfipc::c10d::storeFrom(tcp);
  store.set("a", Bytes("hello"));
  EXPECT_EQ(store.get("a"), Bytes("hello"));
  EXPECT_EQ(tcp->get("a"), Bytes("hello"));  // the same keys as c10d's own API
  tcp->set("from_c10d", Bytes("x"));
  EXPECT_EQ(store.getString("from_c10d", Milliseconds(1000)), "x");
  EXPECT_EQ(store.get("from_c10d", nvfipc::kNoWait), Bytes("x"));
  store.set("empty", std::vector<uint8_t>{});
  EXPECT_TRUE(store.get("empty").empty());
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", 4), 7);
  EXPECT_TRUE(store.check({"a", "n"}));
  EXPECT_FALSE(store.check({"a", "nope"}));
  store.wait({"a"}, Milliseconds(1000));
  store.wait({"a"}, nvfipc::kNoWait);
  store.wait({"a"});
  EXPECT_TRUE(store.deleteKey("a"));
  EXPECT_FALSE(store.deleteKey("a"));
  EXPECT_GE(store.numKeys(), 3);
  EXPECT_EQ(store.compareSet("cas", {}, Bytes("v1")), Bytes("v1"));
  EXPECT_EQ(store.compareSet("cas", Bytes("v1"), Bytes("v2")), Bytes("v2"));
  store.append("log", Bytes("ab"));
  store.append("log", Bytes("cd"));
  EXPECT_EQ(store.getString("log"), "abcd");
  store.multiSet({"m1", "m2"}, {Bytes("1"), Bytes("22")});
  auto values = store.multiGet({"m2", "m1"}, Milliseconds(1000));
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0], Bytes("22"));
  EXPECT_EQ(values[1], Bytes("1"));
  // Not a TCP store of the library: ping is not available.
  EXPECT_THROW(store.ping(), nvfipc::UnsupportedError);
}

TEST(C10dAdapter, TimeoutsBecomeTimeoutErrors) {
  auto tcp = ServeTcpStore();
  nvfipc::Store store = nvfipc::c10d::storeFrom(tcp);
  // Zero: checked once (c10d's own zero would mean "wait forever").
  EXPECT_THROW(store.get("missing", nvfipc::kNoWait), nvfipc::TimeoutError);
  EXPECT_THROW(store.wait({"missing"}, nvfipc::kNoWait), nvfipc::TimeoutError);
  const auto start = std::chrono::steady_clock::now();
  try {
    store.get("missing", Milliseconds(200));
    FAIL() << "no timeout";
  } catch (const nvfipc::TimeoutError& e) {
    // c10d's own text travels through error_message.
    EXPECT_NE(e.message().find("c10d::Store::get"), std::string::npos) << e.message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_THROW(store.multiGet({"missing", "also"}, Milliseconds(100)), nvfipc::TimeoutError);
}

// A c10d store whose operations throw what real stores throw.
class ThrowingStore : public ::c10d::Store {
 public:
  c10::intrusive_ptr<::c10d::Store> clone() override {
    return c10::make_intrusive<ThrowingStore>();
  }
  void set(const std::string&, const std::vector<uint8_t>&) override {
    throw std::runtime_error("connection reset by peer");
  }
  std::vector<uint8_t> get(const std::string&) override {
    C10_THROW_ERROR(DistStoreError, "Socket Timeout");
  }
  int64_t add(const std::string&, int64_t) override {
    C10_THROW_ERROR(DistNetworkError, "failed to recv, got 0 bytes");
  }
  bool deleteKey(const std::string&) override { throw 42; }
  bool check(const std::vector<std::string>&) override { throw std::bad_alloc(); }
  int64_t getNumKeys() override { C10_THROW_ERROR(NotImplementedError, "no key count"); }
  void wait(const std::vector<std::string>&) override {
    C10_THROW_ERROR(DistStoreError, "wait timeout after 5ms");
  }
  void wait(const std::vector<std::string>&, const std::chrono::milliseconds&) override {
    C10_THROW_ERROR(DistStoreError, "wait timeout after 5ms");
  }
};

TEST(C10dAdapter, ExceptionsNeverCrossTheBoundary) {
  nvfipc::Store store = nvfipc::c10d::storeFrom(c10::make_intrusive<ThrowingStore>());
  try {
    store.set("k", Bytes("v"));
    FAIL();
  } catch (const nvfipc::IoError& e) {
    EXPECT_NE(e.message().find("connection reset by peer"), std::string::npos) << e.message();
  }
  EXPECT_THROW(store.get("k"), nvfipc::TimeoutError);       // DistStoreError "Socket Timeout"
  EXPECT_THROW(store.add("k", 1), nvfipc::IoError);         // DistNetworkError
  EXPECT_THROW(store.deleteKey("k"), nvfipc::IoError);      // not even a std::exception
  EXPECT_THROW(store.check({"k"}), nvfipc::InternalError);  // out of memory
  EXPECT_THROW(store.numKeys(), nvfipc::UnsupportedError);  // NotImplementedError
  EXPECT_THROW(store.wait({"k"}, Milliseconds(10)), nvfipc::TimeoutError);
  EXPECT_THROW(store.compareSet("k", {}, Bytes("v")), nvfipc::UnsupportedError);
}

TEST(C10dAdapter, ClassifiesTimeoutText) {
  using nvfipc::c10d::C10dStoreCallbacks;
  EXPECT_TRUE(C10dStoreCallbacks::mentionsTimeout("Wait Timeout after 300000ms"));
  EXPECT_TRUE(C10dStoreCallbacks::mentionsTimeout("the operation timed out"));
  EXPECT_FALSE(C10dStoreCallbacks::mentionsTimeout("connection refused"));
  EXPECT_FALSE(C10dStoreCallbacks::mentionsTimeout(nullptr));
}

TEST(C10dAdapter, AdapterLivesAsLongAsItsUsers) {
  auto tcp = ServeTcpStore();
  const auto base = tcp.use_count();
  nvfipc::Context ctx;
  {
    nvfipc::Store store = nvfipc::c10d::storeFrom(tcp);
    EXPECT_EQ(tcp.use_count(), base + 1);
    ctx = nvfipc::Context::create(0, 1, store);
  }
  EXPECT_EQ(tcp.use_count(), base + 1);  // the context still uses the adapter
  ctx.barrier(Milliseconds(5000));
  {
    nvfipc::HandleCache cache(ctx);
    ctx.close();
    EXPECT_EQ(tcp.use_count(), base + 1);  // now the cache does
  }
  EXPECT_EQ(tcp.use_count(), base);
  EXPECT_THROW(nvfipc::c10d::storeFrom(c10::intrusive_ptr<::c10d::Store>()),
               nvfipc::InvalidArgumentError);
}

// One rank of TheRankServingTheStoreStaysUntilTheOthersClose, nvFuser's way: rank 0 runs the
// c10d::TCPStore's server in its process, closes its context first and leaves at once; the others
// close theirs a moment later. Rank 0 must still be there then (its close waits for theirs), and
// their closing requests must reach the server (a failure would throw from close()).
NVFIPC_WORKER(C10dServingRank) {
  try {
    ::c10d::TCPStoreOptions opts;
    opts.port = env.store_port;
    opts.isServer = env.rank == 0;
    opts.timeout = std::chrono::seconds(20);
    auto tcp = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", opts);
    nvfipc::Context ctx = nvfipc::Context::create(env.rank, env.world_size,
                                                  nvfipc::c10d::storeFrom(tcp));
    ctx.barrier(Milliseconds(20000));
    if (env.rank == 0) {
      tcp->set("serving/pid", Bytes(std::to_string(::getpid())));
      ctx.close();
      return 0;  // the server goes with this process
    }
    const std::vector<uint8_t> pid_bytes = tcp->get("serving/pid");
    const pid_t rank0 = std::stoi(std::string(pid_bytes.begin(), pid_bytes.end()));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (::kill(rank0, 0) != 0) {
      std::fprintf(stderr, "rank %lld: rank 0 (pid %d) left before this rank closed\n",
                   static_cast<long long>(env.rank), static_cast<int>(rank0));
      return 3;
    }
    ctx.close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(env.rank), e.what());
    return 1;
  }
  return 0;
}

TEST(C10dAdapter, TheRankServingTheStoreStaysUntilTheOthersClose) {
  const uint16_t port = nvfipc_test::FreeLoopbackPort();
  ASSERT_NE(port, 0);
  nvfipc_test::ExpectAllOk(nvfipc_test::RunWorkers("C10dServingRank", 3, port, 60.0));
}

}  // namespace
