// The C++ wrapper in one process: errors carry status and message, every store operation, RAII
// and moves, host buffers, a one-rank context and cache misuse.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "nvfuser_ipc.hpp"

namespace {

using nvfipc::Milliseconds;

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

static_assert(!std::is_copy_constructible_v<nvfipc::Store>);
static_assert(!std::is_copy_constructible_v<nvfipc::Context>);
static_assert(!std::is_copy_constructible_v<nvfipc::HandleCache>);
static_assert(!std::is_copy_constructible_v<nvfipc::Channel>);
static_assert(std::is_nothrow_move_assignable_v<nvfipc::Channel>);
static_assert(!std::is_copy_constructible_v<nvfipc::HostBuffer>);
static_assert(!std::is_copy_constructible_v<nvfipc::Server>);
static_assert(std::is_nothrow_move_constructible_v<nvfipc::Store>);
static_assert(std::is_nothrow_move_assignable_v<nvfipc::Context>);
static_assert(std::is_nothrow_destructible_v<nvfipc::HandleCache>);
static_assert(std::is_base_of_v<std::runtime_error, nvfipc::Error>);
static_assert(std::is_base_of_v<nvfipc::Error, nvfipc::TimeoutError>);

class WrapperStore : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = nvfipc::Server::serve("127.0.0.1", 0);
    server_.setIdleTimeout(Milliseconds(2000));
    store_ = nvfipc::Store::connect("127.0.0.1", server_.port(), Milliseconds(10000));
  }
  nvfipc::Server server_;
  nvfipc::Store store_;
};

TEST_F(WrapperStore, EveryOperation) {
  EXPECT_GT(server_.port(), 0);
  EXPECT_GE(server_.numClients(), 1u);
  store_.set("a", Bytes("hello"));
  EXPECT_EQ(store_.get("a"), Bytes("hello"));
  store_.set("s", std::string_view("text"));
  EXPECT_EQ(store_.getString("s"), "text");
  EXPECT_EQ(store_.add("n", 5), 5);
  EXPECT_EQ(store_.add("n", -2), 3);
  EXPECT_TRUE(store_.check({"a", "n"}));
  EXPECT_FALSE(store_.check({"a", "missing"}));
  store_.wait({"a", "s"}, Milliseconds(1000));
  EXPECT_TRUE(store_.deleteKey("s"));
  EXPECT_FALSE(store_.deleteKey("s"));
  EXPECT_GE(store_.numKeys(), 2);
  EXPECT_EQ(store_.compareSet("cas", {}, Bytes("v1")), Bytes("v1"));
  EXPECT_EQ(store_.compareSet("cas", Bytes("wrong"), Bytes("v2")), Bytes("v1"));
  EXPECT_EQ(store_.compareSet("cas", Bytes("v1"), Bytes("v2")), Bytes("v2"));
  store_.append("log", Bytes("ab"));
  store_.append("log", Bytes("cd"));
  EXPECT_EQ(store_.getString("log"), "abcd");
  store_.multiSet({"m1", "m2", "m3"}, {Bytes("x"), {}, Bytes("zzz")});
  auto values = store_.multiGet({"m3", "m1", "m2"}, Milliseconds(1000));
  ASSERT_EQ(values.size(), 3u);
  EXPECT_EQ(values[0], Bytes("zzz"));
  EXPECT_EQ(values[1], Bytes("x"));
  EXPECT_TRUE(values[2].empty());
  EXPECT_EQ(store_.defaultTimeout(), Milliseconds(10000));
  store_.setTimeout(Milliseconds(20000));
  EXPECT_EQ(store_.defaultTimeout(), Milliseconds(20000));
  EXPECT_GE(store_.ping(), 0);
}

TEST_F(WrapperStore, TimeoutsThrowTimeoutErrorWithTheLibraryMessage) {
  try {
    store_.get("never", nvfipc::kNoWait);
    FAIL() << "get of a missing key did not throw";
  } catch (const nvfipc::TimeoutError& e) {
    EXPECT_EQ(e.status(), nvfipc::Status::Timeout);
    EXPECT_EQ(e.function(), "nvfipc_store_get");
    EXPECT_NE(e.message().find("never"), std::string::npos) << e.message();
    EXPECT_NE(std::string(e.what()).find("timeout"), std::string::npos) << e.what();
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(store_.wait({"never"}, Milliseconds(100)), nvfipc::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The base class catches every status.
  EXPECT_THROW(store_.multiGet({"never"}, Milliseconds(50)), nvfipc::Error);
  EXPECT_THROW(store_.multiSet({"k"}, {}), nvfipc::InvalidArgumentError);
}

TEST_F(WrapperStore, MovedFromObjectsThrowInvalidState) {
  nvfipc::Store moved = std::move(store_);
  EXPECT_FALSE(static_cast<bool>(store_));
  EXPECT_THROW(store_.set("x", Bytes("1")), nvfipc::InvalidStateError);
  moved.set("x", Bytes("1"));
  nvfipc::Store other = nvfipc::Store::connect("127.0.0.1", server_.port(), Milliseconds(5000));
  other = std::move(moved);  // frees `other`'s own connection first
  EXPECT_EQ(other.getString("x"), "1");
  other.close();
  EXPECT_THROW(other.get("x"), nvfipc::InvalidStateError);
}

TEST(Wrapper, ConnectFailureCarriesStatusAndMessage) {
  // A port nobody listens on (served and stopped a moment ago).
  uint16_t port = 0;
  {
    nvfipc::Server s = nvfipc::Server::serve("127.0.0.1", 0);
    port = s.port();
    s.close(Milliseconds(0));
  }
  try {
    nvfipc::Store::connect("127.0.0.1", port, Milliseconds(300));
    FAIL() << "connect to a closed port succeeded";
  } catch (const nvfipc::Error& e) {
    EXPECT_TRUE(e.status() == nvfipc::Status::Timeout || e.status() == nvfipc::Status::Io)
        << e.what();
    EXPECT_FALSE(e.message().empty());
    EXPECT_EQ(e.message(), nvfipc::lastErrorMessage());
  }
}

TEST(Wrapper, BadArgumentsAreInvalidArgumentErrors) {
  EXPECT_THROW(nvfipc::HostBuffer(0), nvfipc::InvalidArgumentError);
  EXPECT_FALSE(nvfipc::version().empty());
  EXPECT_EQ(nvfipc::version(), NVFIPC_VERSION);
}

TEST(Wrapper, DevicePointerChecksThrowWithTheLibraryMessage) {
  // NULL is refused before the driver is asked, with or without a GPU.
  try {
    nvfipc::cudaPointerMemory(nullptr, 16);
    FAIL() << "a NULL device pointer must throw";
  } catch (const nvfipc::InvalidArgumentError& e) {
    EXPECT_NE(e.message().find("NULL"), std::string::npos) << e.what();
  }
  if (!nvfipc::cudaAvailable()) {
    int on_host = 0;
    EXPECT_THROW(nvfipc::cudaPointerMemory(&on_host, sizeof on_host), nvfipc::Error);
  }
  const nvfipc_cuda_vmm_counters c = nvfipc::cudaVmmCounters();
  EXPECT_EQ(c.live_segments, 0u);
  EXPECT_EQ(c.live_maps, 0u);
}

TEST(Wrapper, HostBufferIsZeroedMovableAndFreedOnce) {
  nvfipc::HostBuffer a(256);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 256u);
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(a.as<uint8_t>()[i], 0) << i;
  std::memset(a.data(), 7, 256);
  nvfipc::HostBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.as<uint8_t>()[255], 7);
  nvfipc::HostBuffer c(16);
  c = std::move(b);  // frees c's own buffer
  EXPECT_EQ(c.size(), 256u);
  c.close();
  EXPECT_EQ(c.data(), nullptr);
  c.close();  // freeing NULL is a no-op
}

TEST(Wrapper, OneRankContextAndCacheMisuse) {
  nvfipc::Server server = nvfipc::Server::serve("127.0.0.1", 0);
  server.setIdleTimeout(Milliseconds(2000));
  nvfipc::Context ctx;
  {
    nvfipc::Store store = nvfipc::Store::connect("127.0.0.1", server.port(), Milliseconds(10000));
    ctx = nvfipc::Context::create(0, 1, store);
  }  // the context keeps its own reference to the store
  EXPECT_EQ(ctx.rank(), 0);
  EXPECT_EQ(ctx.worldSize(), 1);
  EXPECT_EQ(ctx.localRank(), 0);
  EXPECT_EQ(ctx.localWorldSize(), 1);
  EXPECT_FALSE(ctx.jobId().empty());
  EXPECT_EQ(ctx.hostedPort(), 0);
  ctx.barrier();
  ctx.barrier({0}, Milliseconds(1000));
  EXPECT_THROW(ctx.barrier({0, 5}, Milliseconds(100)), nvfipc::InvalidArgumentError);
  ctx.store().set("direct", Bytes("1"));

  nvfipc::HandleCache cache(ctx);
  nvfipc::HostBuffer buf(64);
  // Sending to oneself is refused, as in nvFuser ("send to self not supported").
  EXPECT_THROW(cache.exchangeHandles({nvfipc::Request::send(0, "t", buf.data(), 64,
                                                            nvfipc::MemKind::Host)}),
               nvfipc::InvalidArgumentError);
  EXPECT_THROW(cache.get(nvfipc::Request::recv(0, "t", buf.data(), 64, nvfipc::MemKind::Host)),
               nvfipc::Error);
  cache.exchangeHandles({});  // an empty batch is a no-op
  EXPECT_THROW(cache.channel(nvfipc::Request::recv(0, "t", buf.data(), 64, nvfipc::MemKind::Host)),
               nvfipc::InvalidArgumentError);
  nvfipc::Channel none;
  EXPECT_FALSE(none);
  EXPECT_THROW(none.hostSendPost(), nvfipc::InvalidStateError);
  const nvfipc::CacheStats s = cache.stats();
  EXPECT_EQ(s.opens, 0u);
  cache.close();
  EXPECT_THROW(cache.stats(), nvfipc::InvalidStateError);
  ctx.close();
  EXPECT_THROW(ctx.rank(), nvfipc::InvalidStateError);
}

}  // namespace

// The log adapter: lines reach a C++ sink with their level and subsystem, the level filter
// applies, and an empty sink restores stderr.
TEST(Wrapper, LogLinesReachTheSink) {
  struct Line {
    nvfipc::LogLevel level;
    std::string subsystem;
    std::string text;
  };
  static std::mutex mu;
  static std::vector<Line> lines;
  const nvfipc::LogLevel before = nvfipc::logLevel();
  EXPECT_THROW(nvfipc::setLogLevel(static_cast<nvfipc::LogLevel>(9)),
               nvfipc::InvalidArgumentError);
  nvfipc::setLogSink([](nvfipc::LogLevel level, std::string_view sub, std::string_view text) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back({level, std::string(sub), std::string(text)});
  });
  nvfipc::setLogLevel(nvfipc::LogLevel::Debug);
  EXPECT_EQ(nvfipc::logLevel(), nvfipc::LogLevel::Debug);
  {
    nvfipc::Server server = nvfipc::Server::serve("127.0.0.1", 0);
    server.setIdleTimeout(Milliseconds(2000));
    nvfipc::Store store = nvfipc::Store::connect("127.0.0.1", server.port(), Milliseconds(10000));
    nvfipc::Context ctx = nvfipc::Context::create(0, 1, store);
    ctx.barrier({0}, Milliseconds(1000));
    ctx.close();
  }
  nvfipc::setLogSink(nullptr);
  nvfipc::setLogLevel(before);
  std::lock_guard<std::mutex> lock(mu);
  bool context_line = false;
  for (const Line& l : lines) {
    EXPECT_NE(l.text.find("NVFIPC"), std::string::npos) << l.text;
    EXPECT_NE(l.text.find(l.subsystem + ": "), std::string::npos) << l.text;
    if (l.subsystem == "store" && l.text.find("context: rank 0 of 1") != std::string::npos) {
      EXPECT_EQ(l.level, nvfipc::LogLevel::Info) << l.text;
      EXPECT_NE(l.text.find("[rank 0]"), std::string::npos) << l.text;
      context_line = true;
    }
  }
  EXPECT_TRUE(context_line) << lines.size() << " lines, none about the context";
}
