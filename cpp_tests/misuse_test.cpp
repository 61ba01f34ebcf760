// Misuse of the C API: NULL objects and strings, bad ranks, bad timeouts, counts and lengths
// above their limits, double frees and pointers of the wrong type. Each must return a status and
// a message, never crash.
#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

using nvfipc_test::LastError;
using nvfipc_test::ScopedServer;

namespace {

class MisuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(server_.get(), nullptr);
    NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server_.port(), 5000, 0, &store_));
    NVFIPC_ASSERT_OK(nvfipc_context_create(0, 1, 0, 1, store_, &ctx_));
  }
  void TearDown() override {
    NVFIPC_EXPECT_OK(nvfipc_context_free(ctx_));
    NVFIPC_EXPECT_OK(nvfipc_store_free(store_));
  }

  ScopedServer server_;
  nvfipc_store* store_ = nullptr;
  nvfipc_context* ctx_ = nullptr;
};

}  // namespace

TEST(LastError, EmptyUntilAFailureAndKeptAcrossSuccesses) {
  nvfipc_last_error_clear();
  EXPECT_STREQ(nvfipc_last_error_message(), "");
  EXPECT_EQ(nvfipc_last_error_status(), NVFIPC_STATUS_OK);
  EXPECT_EQ(nvfipc_store_free(nullptr), NVFIPC_STATUS_OK);
  EXPECT_STREQ(nvfipc_last_error_message(), "");
  EXPECT_EQ(nvfipc_store_set(nullptr, "k", nullptr, 0), NVFIPC_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(nvfipc_last_error_status(), NVFIPC_STATUS_INVALID_ARGUMENT);
  const std::string message = LastError();
  EXPECT_EQ(message, "nvfipc_store_set: argument `store` is NULL");
  EXPECT_EQ(nvfipc_store_free(nullptr), NVFIPC_STATUS_OK);
  EXPECT_EQ(LastError(), message) << "a success does not clear the last error";
}

TEST(Misuse, NullArgumentsOfConstructors) {
  nvfipc_store* store = nullptr;
  NVFIPC_EXPECT_ERROR(nvfipc_store_connect(nullptr, 1234, 100, 0, &store),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`host` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_connect("127.0.0.1", 1234, 100, 0, nullptr),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`out_store` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_connect("127.0.0.1", 0, 100, 0, &store),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "port 0");
  nvfipc_server* server = nullptr;
  NVFIPC_EXPECT_ERROR(nvfipc_store_serve(nullptr, 0, nullptr, &server),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`bind_host` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_serve("127.0.0.1", 0, nullptr, nullptr),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`out_server` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(0, 1, 0, 1, nullptr, nullptr),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`store` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_context_from_env(nullptr), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`out_ctx` is NULL");
  EXPECT_EQ(store, nullptr);
  EXPECT_EQ(server, nullptr);
}

TEST(Misuse, UnresolvableHostFailsCleanly) {
  nvfipc_store* store = nullptr;
  nvfipc_status st = nvfipc_store_connect("no-such-host.invalid", 1234, 200, 0, &store);
  EXPECT_NE(st, NVFIPC_STATUS_OK);
  EXPECT_NE(LastError().find("no-such-host.invalid"), std::string::npos) << LastError();
  EXPECT_EQ(store, nullptr);
}

TEST_F(MisuseTest, NullKeysValuesAndOutputs) {
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(store_, nullptr, nullptr, 0),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`key` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(store_, "k", nullptr, 5), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`value` is NULL");
  uint8_t* data = nullptr;
  size_t len = 0;
  NVFIPC_EXPECT_ERROR(nvfipc_store_get(store_, "k", 0, nullptr, &len),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`out_value` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_get(store_, "k", 0, &data, nullptr),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`out_len` is NULL");
  const char* keys[] = {"a", nullptr};
  bool all = false;
  NVFIPC_EXPECT_ERROR(nvfipc_store_check(store_, keys, 2, &all), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`keys[1]` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_check(store_, nullptr, 1, &all),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`keys` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_wait(store_, keys, 2, 0), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`keys[1]` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_num_keys(store_, nullptr), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`out_num_keys` is NULL");
  nvfipc_bytes values[] = {{nullptr, 3}};
  const char* one_key[] = {"a"};
  NVFIPC_EXPECT_ERROR(nvfipc_store_multi_set(store_, one_key, values, 1),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`values[0]` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_store_multi_get(store_, one_key, 1, 0, nullptr),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`out_values` is NULL");
  // Keys must be UTF-8.
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(store_, "bad\xff", nullptr, 0),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "not valid UTF-8");
  // Zero-length key lists are fine: nothing to wait for.
  NVFIPC_EXPECT_OK(nvfipc_store_wait(store_, nullptr, 0, 0));
  all = false;
  NVFIPC_EXPECT_OK(nvfipc_store_check(store_, nullptr, 0, &all));
  EXPECT_TRUE(all);
  NVFIPC_EXPECT_OK(nvfipc_store_multi_get(store_, nullptr, 0, 0, nullptr));
}

TEST_F(MisuseTest, TimeoutsZeroAndNegative) {
  uint8_t* data = nullptr;
  size_t len = 0;
  // 0: check once.
  NVFIPC_EXPECT_ERROR(nvfipc_store_get(store_, "absent", 0, &data, &len), NVFIPC_STATUS_TIMEOUT,
                      "absent");
  // Negative: the store's default (5 s here); a present key returns at once.
  NVFIPC_ASSERT_OK(nvfipc_store_set(store_, "present", reinterpret_cast<const uint8_t*>("1"), 1));
  NVFIPC_ASSERT_OK(nvfipc_store_get(store_, "present", -1, &data, &len));
  NVFIPC_EXPECT_OK(nvfipc_buffer_free(data, len));
  NVFIPC_EXPECT_ERROR(nvfipc_store_set_timeout(store_, 0), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "timeout_ms");
  NVFIPC_EXPECT_ERROR(nvfipc_store_set_timeout(store_, -5), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "timeout_ms");
  NVFIPC_EXPECT_OK(nvfipc_store_set_timeout(store_, 1000));
  // A TCP store knows its server: no address to give it.
  NVFIPC_EXPECT_ERROR(nvfipc_store_set_server_address(store_, "localhost", 29500),
                      NVFIPC_STATUS_UNSUPPORTED, "host callbacks");
  int64_t ms = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_default_timeout_ms(store_, &ms));
  EXPECT_EQ(ms, 1000);
  // World of one: the barrier returns at once for any timeout.
  NVFIPC_EXPECT_OK(nvfipc_barrier(ctx_, nullptr, 0, 0));
  NVFIPC_EXPECT_OK(nvfipc_barrier(ctx_, nullptr, 0, -1));
}

TEST_F(MisuseTest, BadRanks) {
  nvfipc_context* ctx = nullptr;
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(2, 2, 0, 1, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`rank` = 2");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(-1, 2, 0, 1, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`rank` = -1");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(0, 0, 0, 1, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`world_size` = 0");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(0, -4, 0, 1, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "world_size");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(0, 2, 3, 2, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`local_rank` = 3");
  NVFIPC_EXPECT_ERROR(nvfipc_context_create(0, 2, 0, 4, store_, &ctx),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "local_world_size");
  EXPECT_EQ(ctx, nullptr);

  const int64_t out_of_range[] = {7};
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx_, out_of_range, 1, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`ranks[0]` = 7");
  const int64_t negative[] = {-3};
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx_, negative, 1, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`ranks[0]` = -3");
  const int64_t duplicate[] = {0, 0};
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx_, duplicate, 2, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`n_ranks` = 2 is above the limit of the world size = 1");
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx_, nullptr, 3, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`ranks` is NULL");
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(nullptr, nullptr, 0, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`ctx` is NULL");
}

TEST_F(MisuseTest, CountsAndLengthsAboveTheirLimits) {
  // Each count below exceeds the array it describes: the library refuses it before reading the
  // array or allocating anything for it.
  const size_t huge = size_t{1} << 40;
  nvfipc_cache* cache = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_cache_create(ctx_, &cache));
  int word = 0;
  const nvfipc_request req = {1, NVFIPC_DIRECTION_SEND, NVFIPC_MEM_HOST, "t",
                              reinterpret_cast<uint64_t>(&word), sizeof word};
  const nvfipc_request two[] = {req, req};
  NVFIPC_EXPECT_ERROR(nvfipc_exchange_handles(cache, two, huge), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`n` = 1099511627776 is above the limit of NVFIPC_MAX_REQUESTS = 4096");
  NVFIPC_EXPECT_ERROR(nvfipc_exchange_handles_timeout(cache, two, NVFIPC_MAX_REQUESTS + 1, 0),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "NVFIPC_MAX_REQUESTS");
  NVFIPC_EXPECT_OK(nvfipc_cache_free(cache));

  const int64_t one[] = {0};
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx_, one, huge, 0), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`n_ranks` = 1099511627776 is above the limit of the world size = 1");
  NVFIPC_EXPECT_OK(nvfipc_barrier(ctx_, one, 1, 0));

  const char* keys[] = {"a", "b"};
  bool all = false;
  NVFIPC_EXPECT_ERROR(nvfipc_store_check(store_, keys, huge, &all),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "above the limit of NVFIPC_MAX_KEYS");
  NVFIPC_EXPECT_ERROR(nvfipc_store_wait(store_, keys, huge, 0), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`n_keys` = 1099511627776");
  nvfipc_buffer outs[2] = {};
  NVFIPC_EXPECT_ERROR(nvfipc_store_multi_get(store_, keys, huge, 0, outs),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "NVFIPC_MAX_KEYS");
  NVFIPC_EXPECT_ERROR(nvfipc_buffers_free(outs, huge), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "NVFIPC_MAX_KEYS");
  const auto* x = reinterpret_cast<const uint8_t*>("x");
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(store_, "k", x, NVFIPC_MAX_VALUE_LEN + 1),
                      NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`value` has a length of 8388609 bytes, above the limit of "
                      "NVFIPC_MAX_VALUE_LEN");
  const nvfipc_bytes spans[] = {{x, huge}};
  NVFIPC_EXPECT_ERROR(nvfipc_store_multi_set(store_, keys, spans, 1),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`values[0]` has a length of");
  const std::string long_key(NVFIPC_MAX_STRING_LEN + 1, 'k');
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(store_, long_key.c_str(), x, 1),
                      NVFIPC_STATUS_INVALID_ARGUMENT,
                      "`key` is longer than NVFIPC_MAX_STRING_LEN = 8192 bytes");
  nvfipc_store* store = nullptr;
  NVFIPC_EXPECT_ERROR(nvfipc_store_connect("127.0.0.1", server_.port(), 1000,
                                           NVFIPC_MAX_WORLD_SIZE + 1, &store),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "`wait_for_workers` = 131073");
  EXPECT_EQ(store, nullptr);
}

TEST_F(MisuseTest, BarrierWithoutThisRank) {
  nvfipc_context* ctx = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_create(0, 3, 0, 3, store_, &ctx));
  const int64_t others[] = {1, 2};
  nvfipc_status st = nvfipc_barrier(ctx, others, 2, 100);
  EXPECT_EQ(st, NVFIPC_STATUS_INVALID_ARGUMENT) << LastError();
  EXPECT_NE(LastError().find("0"), std::string::npos) << LastError();
  const int64_t duplicate[] = {0, 1, 0};
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx, duplicate, 3, 100), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "rank 0 is listed twice");
  NVFIPC_EXPECT_OK(nvfipc_context_free(ctx));
}

TEST_F(MisuseTest, DoubleFreeIsDetected) {
  nvfipc_store* extra = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server_.port(), 5000, 0, &extra));
  NVFIPC_ASSERT_OK(nvfipc_store_free(extra));
  NVFIPC_EXPECT_ERROR(nvfipc_store_free(extra), NVFIPC_STATUS_INVALID_STATE,
                      "not a live nvfipc_store");
  // Use after free is caught the same way.
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(extra, "k", nullptr, 0), NVFIPC_STATUS_INVALID_STATE,
                      "already freed");

  nvfipc_context* ctx = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_create(0, 1, 0, 1, store_, &ctx));
  NVFIPC_ASSERT_OK(nvfipc_context_free(ctx));
  NVFIPC_EXPECT_ERROR(nvfipc_context_free(ctx), NVFIPC_STATUS_INVALID_STATE,
                      "not a live nvfipc_context");
  int64_t rank = -1;
  NVFIPC_EXPECT_ERROR(nvfipc_context_rank(ctx, &rank), NVFIPC_STATUS_INVALID_STATE,
                      "nvfipc_context_rank");
  EXPECT_EQ(rank, -1);

  nvfipc_server* server = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_serve("127.0.0.1", 0, nullptr, &server));
  NVFIPC_ASSERT_OK(nvfipc_server_free(server, 0));
  NVFIPC_EXPECT_ERROR(nvfipc_server_free(server, 0), NVFIPC_STATUS_INVALID_STATE,
                      "not a live nvfipc_server");

  uint8_t* data = nullptr;
  size_t len = 0;
  NVFIPC_ASSERT_OK(nvfipc_store_set(store_, "v", reinterpret_cast<const uint8_t*>("abc"), 3));
  NVFIPC_ASSERT_OK(nvfipc_store_get(store_, "v", 0, &data, &len));
  NVFIPC_EXPECT_ERROR(nvfipc_buffer_free(data, len + 1), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "has 3 bytes");
  NVFIPC_ASSERT_OK(nvfipc_buffer_free(data, len));
  NVFIPC_EXPECT_ERROR(nvfipc_buffer_free(data, len), NVFIPC_STATUS_INVALID_STATE, "not live");
  // Memory the library did not allocate.
  uint8_t local[4] = {0, 0, 0, 0};
  NVFIPC_EXPECT_ERROR(nvfipc_buffer_free(local, 4), NVFIPC_STATUS_INVALID_STATE,
                      "not a buffer allocated by this library");
}

TEST_F(MisuseTest, WrongTypePointersAreDetected) {
  // A context passed where a store is expected (and the reverse) is refused, not dereferenced.
  auto* ctx_as_store = reinterpret_cast<nvfipc_store*>(ctx_);
  NVFIPC_EXPECT_ERROR(nvfipc_store_set(ctx_as_store, "k", nullptr, 0),
                      NVFIPC_STATUS_INVALID_ARGUMENT, "is a live nvfipc_context, not a nvfipc_store");
  NVFIPC_EXPECT_ERROR(nvfipc_store_free(ctx_as_store), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "not a nvfipc_store");
  auto* store_as_ctx = reinterpret_cast<nvfipc_context*>(store_);
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(store_as_ctx, nullptr, 0, 0), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "not a nvfipc_context");
  auto* store_as_server = reinterpret_cast<nvfipc_server*>(store_);
  uint16_t port = 0;
  NVFIPC_EXPECT_ERROR(nvfipc_server_port(store_as_server, &port), NVFIPC_STATUS_INVALID_ARGUMENT,
                      "not a nvfipc_server");
  // A pointer that is no object at all.
  int not_an_object = 0;
  NVFIPC_EXPECT_ERROR(nvfipc_store_free(reinterpret_cast<nvfipc_store*>(&not_an_object)),
                      NVFIPC_STATUS_INVALID_STATE, "not created by this library");
  // The objects are still fine afterwards.
  NVFIPC_EXPECT_OK(nvfipc_store_set(store_, "still", nullptr, 0));
  int64_t world = 0;
  NVFIPC_EXPECT_OK(nvfipc_context_world_size(ctx_, &world));
  EXPECT_EQ(world, 1);
}

TEST_F(MisuseTest, ContextOutlivesItsStoreHandle) {
  nvfipc_store* store = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server_.port(), 5000, 0, &store));
  nvfipc_context* ctx = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_create(0, 1, 0, 1, store, &ctx));
  NVFIPC_ASSERT_OK(nvfipc_store_free(store));
  NVFIPC_EXPECT_OK(nvfipc_barrier(ctx, nullptr, 0, 1000));
  nvfipc_store* shared = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_store(ctx, &shared));
  NVFIPC_EXPECT_OK(nvfipc_store_set(shared, "via-context", nullptr, 0));
  const char* job_id = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_job_id(ctx, &job_id));
  EXPECT_GT(std::string(job_id).size(), 0u);
  NVFIPC_EXPECT_OK(nvfipc_store_free(shared));
  NVFIPC_EXPECT_OK(nvfipc_context_free(ctx));
}
