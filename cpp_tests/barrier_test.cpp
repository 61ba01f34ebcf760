// Barriers across real processes: every rank is a separate copy of this binary, connected to a
// store served by the test.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"
#include "worker_util.hpp"

using nvfipc_test::ExpectAllOk;
using nvfipc_test::RunWorkers;
using nvfipc_test::ScopedServer;

namespace {

constexpr int kRepetitions = 50;

// Connects to the test's store and creates this rank's context over it.
nvfipc_status OpenContext(const nvfipc_test::WorkerEnv& env, nvfipc_store** store,
                          nvfipc_context** ctx) {
  nvfipc_status st = nvfipc_store_connect("127.0.0.1", env.store_port, 30000, 0, store);
  if (st != NVFIPC_STATUS_OK) return st;
  return nvfipc_context_create(env.rank, env.world_size, env.rank, env.world_size, *store, ctx);
}

}  // namespace

// Each round, every rank bumps a counter and then enters the world barrier; after the barrier
// the counter must show every rank's increment of that round.
NVFIPC_WORKER(WorldBarrierRepeated) {
  nvfipc_store* store = nullptr;
  nvfipc_context* ctx = nullptr;
  WORKER_CHECK_OK(OpenContext(env, &store, &ctx));
  int64_t rank = -1, world = -1;
  WORKER_CHECK_OK(nvfipc_context_rank(ctx, &rank));
  WORKER_CHECK_OK(nvfipc_context_world_size(ctx, &world));
  WORKER_CHECK(rank == env.rank && world == env.world_size, "context getters");
  for (int round = 0; round < kRepetitions; ++round) {
    int64_t count = 0;
    WORKER_CHECK_OK(nvfipc_store_add(store, "test/count", 1, nullptr));
    WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
    WORKER_CHECK_OK(nvfipc_store_add(store, "test/count", 0, &count));
    WORKER_CHECK(count >= (round + 1) * world,
                 "round " + std::to_string(round) + ": count " + std::to_string(count));
    // A second barrier keeps fast ranks from starting the next round's increment before every
    // rank has read this round's count.
    WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
  }
  WORKER_CHECK_OK(nvfipc_store_free(store));  // the context keeps its own reference
  WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
  WORKER_CHECK_OK(nvfipc_context_free(ctx));
  return 0;
}

TEST(BarrierMultiProcess, WorldBarrierReused50Times) {
  ScopedServer server;
  ASSERT_NE(server.get(), nullptr);
  auto start = std::chrono::steady_clock::now();
  ExpectAllOk(RunWorkers("WorldBarrierRepeated", 4, server.port(), 90.0));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  std::printf("4 ranks x %d world barrier pairs: %lld ms\n", kRepetitions,
              static_cast<long long>(ms));
}

// Pairs {0,1} and {2,3} synchronise independently, in different orders on the list, while a
// set {0,2} and the world interleave.
NVFIPC_WORKER(SubsetBarriers) {
  nvfipc_store* store = nullptr;
  nvfipc_context* ctx = nullptr;
  WORKER_CHECK_OK(OpenContext(env, &store, &ctx));
  const std::vector<int64_t> pair =
      env.rank < 2 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{2, 3};
  const std::string key = "test/pair" + std::to_string(pair[0]);
  for (int round = 0; round < kRepetitions; ++round) {
    WORKER_CHECK_OK(nvfipc_store_add(store, key.c_str(), 1, nullptr));
    WORKER_CHECK_OK(nvfipc_barrier(ctx, pair.data(), pair.size(), 20000));
    int64_t count = 0;
    WORKER_CHECK_OK(nvfipc_store_add(store, key.c_str(), 0, &count));
    WORKER_CHECK(count >= 2 * (round + 1), key + " = " + std::to_string(count) + " in round " +
                                               std::to_string(round));
    WORKER_CHECK_OK(nvfipc_barrier(ctx, pair.data(), pair.size(), 20000));
    if (env.rank == 0 || env.rank == 2) {
      const int64_t evens[] = {0, 2};
      WORKER_CHECK_OK(nvfipc_barrier(ctx, evens, 2, 20000));
    }
  }
  WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
  WORKER_CHECK_OK(nvfipc_context_free(ctx));
  WORKER_CHECK_OK(nvfipc_store_free(store));
  return 0;
}

TEST(BarrierMultiProcess, SubsetBarriersAreIndependentAndReusable) {
  ScopedServer server;
  ASSERT_NE(server.get(), nullptr);
  ExpectAllOk(RunWorkers("SubsetBarriers", 4, server.port(), 90.0));
}

// Rank 3 never enters the barrier; the others must time out with a message naming it.
NVFIPC_WORKER(BarrierWithMissingRank) {
  nvfipc_store* store = nullptr;
  nvfipc_context* ctx = nullptr;
  WORKER_CHECK_OK(OpenContext(env, &store, &ctx));
  const int64_t missing = env.world_size - 1;
  if (env.rank != missing) {
    auto start = std::chrono::steady_clock::now();
    nvfipc_status st = nvfipc_barrier(ctx, nullptr, 0, 500);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    const std::string message = nvfipc_test::LastError();
    WORKER_CHECK(st == NVFIPC_STATUS_TIMEOUT, "status " + nvfipc_test::Describe(st));
    WORKER_CHECK(message.find("ranks " + std::to_string(missing) + " did not arrive") !=
                     std::string::npos,
                 "message does not name rank " + std::to_string(missing) + ": " + message);
    WORKER_CHECK(ms >= 400 && ms < 10000, "timed out after " + std::to_string(ms) + " ms");
  }
  // Everyone reports done, so that the missing rank stays connected until the others have
  // diagnosed it.
  WORKER_CHECK_OK(nvfipc_store_add(store, "test/done", 1, nullptr));
  if (env.rank == missing) {
    std::vector<std::string> names;
    int64_t done = 0;
    for (int i = 0; i < 2000 && done < env.world_size; ++i) {
      WORKER_CHECK_OK(nvfipc_store_add(store, "test/done", 0, &done));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  WORKER_CHECK_OK(nvfipc_context_free(ctx));
  WORKER_CHECK_OK(nvfipc_store_free(store));
  return 0;
}

TEST(BarrierMultiProcess, TimeoutNamesTheMissingRank) {
  ScopedServer server;
  ASSERT_NE(server.get(), nullptr);
  ExpectAllOk(RunWorkers("BarrierWithMissingRank", 4, server.port(), 60.0));
}

// A zero timeout checks once: alone in a two-rank world it fails at once.
TEST(Barrier, ZeroTimeoutChecksOnce) {
  ScopedServer server;
  nvfipc_store* store = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_store_connect("127.0.0.1", server.port(), 5000, 0, &store));
  nvfipc_context* ctx = nullptr;
  NVFIPC_ASSERT_OK(nvfipc_context_create(0, 2, 0, 2, store, &ctx));
  auto start = std::chrono::steady_clock::now();
  NVFIPC_EXPECT_ERROR(nvfipc_barrier(ctx, nullptr, 0, 0), NVFIPC_STATUS_TIMEOUT,
                      "ranks 1 did not arrive");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // A single-member set has nobody to wait for.
  const int64_t self[] = {0};
  NVFIPC_EXPECT_OK(nvfipc_barrier(ctx, self, 1, 0));
  NVFIPC_EXPECT_OK(nvfipc_store_free(store));
  NVFIPC_EXPECT_OK(nvfipc_context_free(ctx));
}

// Contexts from the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT):
// local rank 0 hosts the store, the others connect to it, and the host keeps it up until every
// rank has closed.
NVFIPC_WORKER(ContextFromEnvironment) {
  nvfipc_context* ctx = nullptr;
  WORKER_CHECK_OK(nvfipc_context_from_env(&ctx));
  int64_t rank = -1, world = -1, local_rank = -1, local_world = -1;
  WORKER_CHECK_OK(nvfipc_context_rank(ctx, &rank));
  WORKER_CHECK_OK(nvfipc_context_world_size(ctx, &world));
  WORKER_CHECK_OK(nvfipc_context_local_rank(ctx, &local_rank));
  WORKER_CHECK_OK(nvfipc_context_local_world_size(ctx, &local_world));
  WORKER_CHECK(rank == env.rank && world == env.world_size && local_rank == env.rank &&
                   local_world == env.world_size,
               "context says rank " + std::to_string(rank) + " of " + std::to_string(world));
  uint16_t hosted = 0;
  WORKER_CHECK_OK(nvfipc_context_hosted_port(ctx, &hosted));
  WORKER_CHECK((hosted != 0) == (env.rank == 0), "hosted port " + std::to_string(hosted));
  for (int i = 0; i < 5; ++i) WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
  // Everyone agrees on the job id.
  const char* job_id = nullptr;
  WORKER_CHECK_OK(nvfipc_context_job_id(ctx, &job_id));
  nvfipc_store* store = nullptr;
  WORKER_CHECK_OK(nvfipc_context_store(ctx, &store));
  const std::string key = "test/job_id/" + std::to_string(env.rank);
  WORKER_CHECK_OK(nvfipc_store_set(store, key.c_str(), reinterpret_cast<const uint8_t*>(job_id),
                                   std::strlen(job_id)));
  WORKER_CHECK_OK(nvfipc_barrier(ctx, nullptr, 0, 20000));
  for (int64_t r = 0; r < env.world_size; ++r) {
    const std::string other = "test/job_id/" + std::to_string(r);
    uint8_t* data = nullptr;
    size_t len = 0;
    WORKER_CHECK_OK(nvfipc_store_get(store, other.c_str(), 0, &data, &len));
    const std::string theirs(reinterpret_cast<char*>(data), len);
    WORKER_CHECK_OK(nvfipc_buffer_free(data, len));
    WORKER_CHECK(theirs == job_id, other + " = " + theirs + ", mine " + job_id);
  }
  WORKER_CHECK_OK(nvfipc_store_free(store));
  WORKER_CHECK_OK(nvfipc_context_free(ctx));
  return 0;
}

TEST(ContextMultiProcess, FromEnvironmentRankZeroHostsTheStore) {
  // A port free a moment ago, for rank 0 to host the store on.
  const uint16_t port = nvfipc_test::FreeLoopbackPort();
  ASSERT_NE(port, 0);
  ExpectAllOk(RunWorkers("ContextFromEnvironment", 3, port, 90.0));
}
