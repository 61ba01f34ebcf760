// The store C API: a server and clients in one process, a store built from host callbacks, and
// store operations across several processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "worker_util.hpp"

using nvfipc_test::ScopedServer;

namespace {

std::string TakeBuffer(uint8_t* data, size_t len) {
  std::string value(reinterpret_cast<const char*>(data), len);
  EXPECT_EQ(data[len], 0) << "library buffers end with a NUL byte";
  EXPECT_EQ(nvfipc_buffer_free(data, len), NVFIPC_STATUS_OK) << nvfipc_test::LastError();
  return value;
}

std::string Get(nvfipc_store* store, const char* key, int64_t timeout_ms = 1000) {
  uint8_t* data = nullptr;
  size_t len = 0;
  nvfipc_status st = nvfipc_store_get(store, key, timeout_ms, &data, &len);
  EXPECT_EQ(st, NVFIPC_STATUS_OK) << key << ": " << nvfipc_test::Describe(st);
  return st == NVFIPC_STATUS_OK ? TakeBuffer(data, len) : std::string();
}

nvfipc_status Set(nvfipc_store* store, const char* key, const std::string& value) {
  return nvfipc_store_set(store, key, reinterpret_cast<const uint8_t*>(value.data()),
                          value.size());
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(server_.get(), nullptr);
    NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server_.port(), 5000, 0, &store_));
  }
  void TearDown() override { NVFIPC_EXPECT_OK(nvfipc_store_free(store_)); }

  ScopedServer server_;
  nvfipc_store* store_ = nullptr;
};

}  // namespace

TEST(Version, HeaderMatchesLibrary) {
  EXPECT_STREQ(nvfipc_version(), NVFIPC_VERSION);
  EXPECT_STREQ(nvfipc_status_name(NVFIPC_STATUS_TIMEOUT), "timeout");
  EXPECT_STREQ(nvfipc_status_name(12345), "unknown status");
}

TEST_F(StoreTest, ServerReportsItsPort) {
  uint16_t port = 0;
  NVFIPC_ASSERT_OK(nvfipc_server_port(server_.get(), &port));
  EXPECT_EQ(port, server_.port());
  EXPECT_NE(port, 0);
}

TEST_F(StoreTest, SetGetAddAppendDelete) {
  NVFIPC_ASSERT_OK(Set(store_, "alpha", "one"));
  EXPECT_EQ(Get(store_, "alpha"), "one");

  // Binary values with embedded NUL bytes survive.
  const std::string binary("a\0b\xff", 4);
  NVFIPC_ASSERT_OK(Set(store_, "bin", binary));
  EXPECT_EQ(Get(store_, "bin"), binary);

  // Empty values: NULL is fine for a zero length; the result is still a valid buffer.
  NVFIPC_ASSERT_OK(nvfipc_store_set(store_, "empty", nullptr, 0));
  EXPECT_EQ(Get(store_, "empty"), "");

  int64_t counter = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_add(store_, "counter", 5, &counter));
  EXPECT_EQ(counter, 5);
  NVFIPC_ASSERT_OK(nvfipc_store_add(store_, "counter", -7, nullptr));
  NVFIPC_ASSERT_OK(nvfipc_store_add(store_, "counter", 0, &counter));
  EXPECT_EQ(counter, -2);

  const std::string tail = "-two";
  NVFIPC_ASSERT_OK(nvfipc_store_append(store_, "alpha",
                                       reinterpret_cast<const uint8_t*>(tail.data()),
                                       tail.size()));
  EXPECT_EQ(Get(store_, "alpha"), "one-two");

  bool deleted = false;
  NVFIPC_ASSERT_OK(nvfipc_store_delete_key(store_, "alpha", &deleted));
  EXPECT_TRUE(deleted);
  NVFIPC_ASSERT_OK(nvfipc_store_delete_key(store_, "alpha", &deleted));
  EXPECT_FALSE(deleted);
  NVFIPC_ASSERT_OK(nvfipc_store_delete_key(store_, "alpha", nullptr));
}

TEST_F(StoreTest, CheckWaitAndTimeouts) {
  const char* keys[] = {"w1", "w2"};
  bool all = true;
  NVFIPC_ASSERT_OK(nvfipc_store_check(store_, keys, 2, &all));
  EXPECT_FALSE(all);
  // 0 means "check once": a missing key times out at once.
  NVFIPC_EXPECT_ERROR(nvfipc_store_wait(store_, keys, 2, 0), NVFIPC_STATUS_TIMEOUT, "w1");
  NVFIPC_EXPECT_ERROR(nvfipc_store_wait(store_, keys, 2, 100), NVFIPC_STATUS_TIMEOUT,
                      "nvfipc_store_wait");
  uint8_t* data = nullptr;
  size_t len = 0;
  NVFIPC_EXPECT_ERROR(nvfipc_store_get(store_, "w1", 50, &data, &len), NVFIPC_STATUS_TIMEOUT,
                      "w1");
  EXPECT_EQ(data, nullptr) << "outputs are only written on success";

  NVFIPC_ASSERT_OK(Set(store_, "w1", "x"));
  NVFIPC_ASSERT_OK(Set(store_, "w2", "y"));
  NVFIPC_ASSERT_OK(nvfipc_store_check(store_, keys, 2, &all));
  EXPECT_TRUE(all);
  NVFIPC_EXPECT_OK(nvfipc_store_wait(store_, keys, 2, 0));
  // A negative timeout means the store's default; present keys return at once.
  NVFIPC_EXPECT_OK(nvfipc_store_wait(store_, keys, 2, -1));
  EXPECT_EQ(Get(store_, "w1", -1), "x");
  int64_t default_ms = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_default_timeout_ms(store_, &default_ms));
  EXPECT_EQ(default_ms, 5000) << "the connect timeout is the store's default timeout";
}

TEST_F(StoreTest, MultiSetMultiGetCompareSetNumKeys) {
  const char* keys[] = {"m/a", "m/b", "m/c"};
  const std::string va = "A", vc = "ccc";
  nvfipc_bytes values[] = {
      {reinterpret_cast<const uint8_t*>(va.data()), va.size()},
      {nullptr, 0},
      {reinterpret_cast<const uint8_t*>(vc.data()), vc.size()},
  };
  NVFIPC_ASSERT_OK(nvfipc_store_multi_set(store_, keys, values, 3));
  nvfipc_buffer out[3] = {};
  NVFIPC_ASSERT_OK(nvfipc_store_multi_get(store_, keys, 3, 1000, out));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out[0].data), out[0].len), "A");
  EXPECT_EQ(out[1].len, 0u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out[2].data), out[2].len), "ccc");
  NVFIPC_ASSERT_OK(nvfipc_buffers_free(out, 3));
  EXPECT_EQ(out[0].data, nullptr);
  NVFIPC_EXPECT_OK(nvfipc_buffers_free(out, 3));  // already cleared: no-op

  const char* missing[] = {"m/a", "m/never"};
  NVFIPC_EXPECT_ERROR(nvfipc_store_multi_get(store_, missing, 2, 50, out), NVFIPC_STATUS_TIMEOUT,
                      "m/never");

  const std::string desired = "B";
  uint8_t* data = nullptr;
  size_t len = 0;
  // Expected "" on a key that holds "": swapped.
  NVFIPC_ASSERT_OK(nvfipc_store_compare_set(store_, "m/b", nullptr, 0,
                                            reinterpret_cast<const uint8_t*>(desired.data()),
                                            desired.size(), &data, &len));
  EXPECT_EQ(TakeBuffer(data, len), "B");
  // Wrong expectation: unchanged, the current value comes back.
  NVFIPC_ASSERT_OK(nvfipc_store_compare_set(store_, "m/b", reinterpret_cast<const uint8_t*>("Z"),
                                            1, reinterpret_cast<const uint8_t*>("Q"), 1, &data,
                                            &len));
  EXPECT_EQ(TakeBuffer(data, len), "B");
  EXPECT_EQ(Get(store_, "m/b"), "B");

  int64_t num_keys = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_num_keys(store_, &num_keys));
  EXPECT_GE(num_keys, 3);
  int64_t rtt_us = -1;
  NVFIPC_EXPECT_OK(nvfipc_store_ping(store_, &rtt_us));
  EXPECT_GE(rtt_us, 0);
}

TEST_F(StoreTest, ManyClientsShareOneServer) {
  std::vector<nvfipc_store*> clients(8, nullptr);
  for (auto& c : clients) {
    NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server_.port(), 5000, 0, &c));
  }
  size_t connected = 0;
  NVFIPC_ASSERT_OK(nvfipc_server_num_clients(server_.get(), &connected));
  EXPECT_GE(connected, clients.size());
  for (size_t i = 0; i < clients.size(); ++i) {
    int64_t value = 0;
    NVFIPC_ASSERT_OK(nvfipc_store_add(clients[i], "shared", 1, &value));
  }
  int64_t total = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_add(store_, "shared", 0, &total));
  EXPECT_EQ(total, static_cast<int64_t>(clients.size()));
  for (auto* c : clients) NVFIPC_EXPECT_OK(nvfipc_store_free(c));
}

TEST(StoreConnect, RefusedConnectionFailsWithinTheTimeout) {
  // A port held with nothing listening: learning one from a server that was then stopped left
  // it free for any other test's or job's server to take, and the connect then succeeded.
  nvfipc_test::UnlistenedPort unlistened;
  const uint16_t port = unlistened.port();
  ASSERT_NE(port, 0);
  nvfipc_store* store = nullptr;
  nvfipc_status st = nvfipc_store_connect("127.0.0.1", port, 300, 0, &store);
  EXPECT_TRUE(st == NVFIPC_STATUS_IO || st == NVFIPC_STATUS_TIMEOUT) << nvfipc_test::Describe(st);
  EXPECT_EQ(store, nullptr);
  EXPECT_NE(nvfipc_test::LastError().find(std::to_string(port)), std::string::npos)
      << nvfipc_test::LastError();
}

// ---------------------------------------------------------------------------------------------
// Several processes on one store.
// ---------------------------------------------------------------------------------------------

NVFIPC_WORKER(StoreOpsAcrossProcesses) {
  nvfipc_store* store = nullptr;
  WORKER_CHECK_OK(nvfipc_store_connect("127.0.0.1", env.store_port, 20000, env.world_size, &store));
  const std::string mine = "rank/" + std::to_string(env.rank);
  const std::string value = "value of " + std::to_string(env.rank);
  WORKER_CHECK_OK(Set(store, mine.c_str(), value));
  int64_t arrived = 0;
  WORKER_CHECK_OK(nvfipc_store_add(store, "arrived", 1, &arrived));
  WORKER_CHECK(arrived >= 1 && arrived <= env.world_size, "arrived = " + std::to_string(arrived));
  const std::string log_entry = std::to_string(env.rank) + ";";
  WORKER_CHECK_OK(nvfipc_store_append(store, "log",
                                      reinterpret_cast<const uint8_t*>(log_entry.data()),
                                      log_entry.size()));

  std::vector<std::string> names;
  for (int64_t r = 0; r < env.world_size; ++r) names.push_back("rank/" + std::to_string(r));
  std::vector<const char*> keys;
  for (auto& n : names) keys.push_back(n.c_str());
  WORKER_CHECK_OK(nvfipc_store_wait(store, keys.data(), keys.size(), 10000));
  std::vector<nvfipc_buffer> out(keys.size());
  WORKER_CHECK_OK(nvfipc_store_multi_get(store, keys.data(), keys.size(), 10000, out.data()));
  for (int64_t r = 0; r < env.world_size; ++r) {
    std::string got(reinterpret_cast<char*>(out[r].data), out[r].len);
    WORKER_CHECK(got == "value of " + std::to_string(r), "rank " + std::to_string(r) + ": " + got);
  }
  WORKER_CHECK_OK(nvfipc_buffers_free(out.data(), out.size()));

  // Exactly one rank wins the compare-and-set.
  uint8_t* data = nullptr;
  size_t len = 0;
  WORKER_CHECK_OK(nvfipc_store_compare_set(store, "winner", nullptr, 0,
                                           reinterpret_cast<const uint8_t*>(mine.data()),
                                           mine.size(), &data, &len));
  std::string winner(reinterpret_cast<char*>(data), len);
  WORKER_CHECK_OK(nvfipc_buffer_free(data, len));
  WORKER_CHECK(winner.rfind("rank/", 0) == 0, "winner = " + winner);

  // Everybody reports the winner it saw; rank 0 checks they agree and the log is complete.
  const std::string seen_key = "seen/" + std::to_string(env.rank);
  WORKER_CHECK_OK(Set(store, seen_key.c_str(), winner));
  int64_t done = 0;
  WORKER_CHECK_OK(nvfipc_store_add(store, "done", 1, &done));
  if (env.rank == 0) {
    std::vector<std::string> seen_names;
    for (int64_t r = 0; r < env.world_size; ++r) seen_names.push_back("seen/" + std::to_string(r));
    std::vector<const char*> seen_keys;
    for (auto& n : seen_names) seen_keys.push_back(n.c_str());
    WORKER_CHECK_OK(nvfipc_store_wait(store, seen_keys.data(), seen_keys.size(), 10000));
    for (auto* k : seen_keys) {
      WORKER_CHECK_OK(nvfipc_store_get(store, k, 1000, &data, &len));
      std::string other(reinterpret_cast<char*>(data), len);
      WORKER_CHECK_OK(nvfipc_buffer_free(data, len));
      WORKER_CHECK(other == winner, std::string(k) + " saw " + other + ", rank 0 saw " + winner);
    }
    WORKER_CHECK_OK(nvfipc_store_get(store, "log", 1000, &data, &len));
    WORKER_CHECK(static_cast<int64_t>(std::count(data, data + len, ';')) == env.world_size,
                 std::string("log = ") + reinterpret_cast<char*>(data));
    WORKER_CHECK_OK(nvfipc_buffer_free(data, len));
  }
  WORKER_CHECK_OK(nvfipc_store_free(store));
  return 0;
}

TEST(StoreMultiProcess, FourProcessesShareOneStore) {
  ScopedServer server;
  ASSERT_NE(server.get(), nullptr);
  nvfipc_test::ExpectAllOk(
      nvfipc_test::RunWorkers("StoreOpsAcrossProcesses", 4, server.port(), 60.0));
}
