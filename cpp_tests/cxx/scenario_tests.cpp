// The nvFuser scenarios as multi-process tests.
//
// HostScenarios: every test starts N copies of this binary (2, 4 and 8 ranks) that run the
// scenario over shared-memory host buffers: in nvfipc_cxx_tests with nvfuser-ipc's store server
// (started by the test), in nvfipc_cxx_c10d_tests with a c10d::TCPStore served by rank 0 and
// reached through the c10d adapter (as nvFuser's Communicator holds it).
//
// DeviceScenarios: the same code on CUDA buffers, run in-process as one rank of an
// `mpirun -np N` job (ranks from OMPI_COMM_WORLD_*; WORLD_RANK/WORLD_SIZE or RANK/WORLD_SIZE
// also work) when NVFIPC_TEST_DEVICE=1; skipped otherwise. Stores: rank 0 serves nvfuser-ipc's
// store at MASTER_ADDR:MASTER_PORT (nvfipc_cxx_tests) or a c10d::TCPStore at MASTER_PORT+1
// (nvfipc_cxx_c10d_tests).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "../test_util.hpp"
#include "jobs.hpp"
#include "memory.hpp"
#include "scenarios.hpp"

namespace nvfipc_cxx {
namespace {

constexpr const char* kScenarioVar = "NVFIPC_CXX_SCENARIO";
constexpr const char* kStoreVar = "NVFIPC_CXX_STORE";

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::string(v);
}

// First variable of the list that is set, as an integer.
int64_t EnvInt(std::initializer_list<const char*> names, int64_t fallback) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return std::strtoll(v, nullptr, 10);
  }
  return fallback;
}

// One rank of a HostScenarios test.
NVFIPC_WORKER(CxxScenario) {
  const std::string scenario = Env(kScenarioVar);
  const StoreKind store = Env(kStoreVar) == "c10d" ? StoreKind::C10d : StoreKind::Nvfipc;
  try {
    JobSpec spec;
    spec.rank = env.rank;
    spec.world = env.world_size;
    spec.local_rank = env.rank;
    spec.local_world = env.world_size;
    spec.port = env.store_port;
    std::unique_ptr<Job> job = OpenJob(store, spec);
    {
      std::unique_ptr<Memory> mem = MakeHostMemory();
      RunScenario(scenario, job->ctx(), *mem, "");
    }
    job->close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %lld (%s, %s store): %s\n", static_cast<long long>(env.rank),
                 scenario.c_str(), StoreKindName(store), e.what());
    return 1;
  }
  return 0;
}

using HostParam = std::tuple<std::string, int, StoreKind>;

class HostScenarios : public ::testing::TestWithParam<HostParam> {};

bool DeviceRunRequested() { return Env("NVFIPC_TEST_DEVICE") == "1"; }

TEST_P(HostScenarios, Run) {
  const auto& [scenario, np, store] = GetParam();
  if (DeviceRunRequested()) GTEST_SKIP() << "NVFIPC_TEST_DEVICE=1: only the device scenarios run";
  ::setenv(kScenarioVar, scenario.c_str(), 1);
  ::setenv(kStoreVar, StoreKindName(store), 1);
  const auto start = std::chrono::steady_clock::now();
  if (store == StoreKind::Nvfipc) {
    nvfipc_test::ScopedServer server;
    ASSERT_NE(server.get(), nullptr);
    nvfipc_test::ExpectAllOk(nvfipc_test::RunWorkers("CxxScenario", np, server.port(), 120.0));
  } else {
    const uint16_t port = nvfipc_test::FreeLoopbackPort();
    ASSERT_NE(port, 0);
    nvfipc_test::ExpectAllOk(nvfipc_test::RunWorkers("CxxScenario", np, port, 120.0));
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start).count();
  std::printf("%s, %d ranks, %s store, host memory: %lld ms\n", scenario.c_str(), np,
              StoreKindName(store), static_cast<long long>(ms));
}

// The Torch-enabled binary runs the c10d flavour, the other one nvfuser-ipc's own store.
std::vector<StoreKind> BuiltStores() {
  return {C10dBuilt() ? StoreKind::C10d : StoreKind::Nvfipc};
}

std::string ParamName(const ::testing::TestParamInfo<HostParam>& info) {
  return std::get<0>(info.param) + "_np" + std::to_string(std::get<1>(info.param)) + "_" +
         StoreKindName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Ring, HostScenarios,
                         ::testing::Combine(::testing::ValuesIn(ScenarioNames()),
                                            ::testing::Values(2, 4, 8),
                                            ::testing::ValuesIn(BuiltStores())),
                         ParamName);

// ---- device scenarios under mpirun -------------------------------------------------------------

JobSpec MpiSpec(StoreKind kind) {
  JobSpec spec;
  spec.rank = EnvInt({"OMPI_COMM_WORLD_RANK", "WORLD_RANK", "RANK"}, 0);
  spec.world = EnvInt({"OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"}, 1);
  spec.local_rank = EnvInt({"OMPI_COMM_WORLD_LOCAL_RANK", "WORLD_LOCAL_RANK", "LOCAL_RANK"},
                           spec.rank);
  spec.local_world = EnvInt({"OMPI_COMM_WORLD_LOCAL_SIZE", "WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"},
                            spec.world);
  spec.host = Env("MASTER_ADDR", "127.0.0.1");
  const int64_t base = EnvInt({"MASTER_PORT"}, 29542);
  spec.port = static_cast<uint16_t>(kind == StoreKind::Nvfipc ? base : base + 1);
  spec.timeout = nvfipc::Milliseconds(EnvInt({"NVFIPC_GPU_TEST_TIMEOUT_MS"}, 60000));
  return spec;
}

// nvfuser-ipc's store served by rank 0 through the context (it waits for the others at close).
class HostedNvfipcJob final : public Job {
 public:
  explicit HostedNvfipcJob(const JobSpec& spec) {
    ctx_ = nvfipc::Context::connect(spec.rank, spec.world, spec.host, spec.port, spec.rank == 0,
                                    spec.timeout);
  }
  void close() override { ctx_.close(); }
};

// One job per store kind for the whole process, closed at the end of the run.
std::map<StoreKind, std::unique_ptr<Job>>& MpiJobs() {
  static std::map<StoreKind, std::unique_ptr<Job>> jobs;
  return jobs;
}

const Job& MpiJob(StoreKind kind) {
  auto& jobs = MpiJobs();
  auto it = jobs.find(kind);
  if (it == jobs.end()) {
    JobSpec spec = MpiSpec(kind);
    std::unique_ptr<Job> job = kind == StoreKind::Nvfipc
                                   ? std::unique_ptr<Job>(new HostedNvfipcJob(spec))
                                   : OpenC10dJob(spec);
    it = jobs.emplace(kind, std::move(job)).first;
  }
  return *it->second;
}

class MpiJobsEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto& [kind, job] : MpiJobs()) {
      try {
        job->close();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "closing the " << StoreKindName(kind) << " job: " << e.what();
      }
    }
    MpiJobs().clear();
  }
};
const auto* const kMpiJobsEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiJobsEnvironment);

using DeviceParam = std::tuple<std::string, StoreKind>;
class DeviceScenarios : public ::testing::TestWithParam<DeviceParam> {};

TEST_P(DeviceScenarios, Run) {
  const auto& [scenario, store] = GetParam();
  if (!DeviceRunRequested()) {
    GTEST_SKIP() << "device scenarios run under mpirun with NVFIPC_TEST_DEVICE=1";
  }
  if (!DeviceMemoryBuilt()) GTEST_SKIP() << "built without CUDA";
  const JobSpec spec = MpiSpec(store);
  if (spec.world < 2) GTEST_SKIP() << "needs at least 2 ranks (mpirun -np 2 or more)";
  const auto start = std::chrono::steady_clock::now();
  try {
    const Job& job = MpiJob(store);
    std::unique_ptr<Memory> mem = MakeDeviceMemory(spec.local_rank);
    RunScenario(scenario, job.ctx(), *mem,
                "device_" + scenario + "_" + StoreKindName(store));
    job.ctx().barrier();
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start).count();
  std::printf("NVFIPC_TIMING cxx_%s_%s_device rank=%lld world=%lld us=%lld\n", scenario.c_str(),
              StoreKindName(store), static_cast<long long>(spec.rank),
              static_cast<long long>(spec.world), static_cast<long long>(us));
}

std::string DeviceParamName(const ::testing::TestParamInfo<DeviceParam>& info) {
  return std::get<0>(info.param) + "_" + StoreKindName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Mpi, DeviceScenarios,
                         ::testing::Combine(::testing::ValuesIn(ScenarioNames()),
                                            ::testing::ValuesIn(BuiltStores())),
                         DeviceParamName);

}  // namespace
}  // namespace nvfipc_cxx
