// Entry point of the GPU suites: one process per rank (mpirun -np N). Picks the GPU
// (local_rank % device_count, so several ranks may share one GPU), makes its primary context
// current through the runtime API like nvFuser does, creates the library context from the
// environment (the store is hosted by local rank 0 at MASTER_ADDR/MASTER_PORT), runs the tests,
// and tears everything down. With NVFIPC_GPU_JSON_DIR set, each rank writes
// <dir>/rank<r>.json with its GoogleTest results.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_common.hpp"

namespace nvfipc_gpu {

Job& job() {
  static Job j;
  return j;
}

bool VmmBuffers() {
  static const bool vmm = [] {
    const char* v = std::getenv("NVFIPC_GPU_DEVICE_MEMORY");
    return v != nullptr && std::string(v) == "vmm";
  }();
  return vmm;
}

nvfipc_status Get(const std::string& key, void* out, size_t len) {
  uint8_t* value = nullptr;
  size_t value_len = 0;
  nvfipc_status st = nvfipc_store_get(job().store, key.c_str(), job().timeout_ms, &value, &value_len);
  if (st != NVFIPC_STATUS_OK) return st;
  bool ok = value_len == len;
  if (ok) std::memcpy(out, value, len);
  nvfipc_buffer_free(value, value_len);
  if (!ok) {
    std::fprintf(stderr, "rank %lld: key %s holds %zu bytes, expected %zu\n",
                 static_cast<long long>(job().rank), key.c_str(), value_len, len);
    return NVFIPC_STATUS_PROTOCOL;
  }
  return NVFIPC_STATUS_OK;
}

cudaError_t SyncStream(cudaStream_t stream, const char* what) {
  static const int64_t limit_ms = [] {
    const char* v = std::getenv("NVFIPC_GPU_STREAM_TIMEOUT_MS");
    return v && *v ? std::atoll(v) : int64_t{30000};
  }();
  Stopwatch sw;
  for (;;) {
    cudaError_t err = cudaStreamQuery(stream);
    if (err != cudaErrorNotReady) return err;
    if (sw.micros() > 1000.0 * static_cast<double>(limit_ms)) {
      std::fprintf(stderr,
                   "rank %lld: stream still busy after %lld ms in %s: a semaphore wait was never "
                   "satisfied (peer signal lost or stream memory operations not progressing); "
                   "aborting this rank\n",
                   static_cast<long long>(job().rank), static_cast<long long>(limit_ms), what);
      std::fflush(stderr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void PrintTiming(const std::string& test, const std::string& what, double micros) {
  std::printf("NVFIPC_TIMING rank=%lld world=%lld test=%s what=%s us=%.1f\n",
              static_cast<long long>(job().rank), static_cast<long long>(job().world),
              test.c_str(), what.c_str(), micros);
  std::fflush(stdout);
}

}  // namespace nvfipc_gpu

namespace {

int64_t EnvInt(const std::vector<const char*>& names, int64_t fallback) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoll(v);
  }
  return fallback;
}

bool ChildMode() {
  const char* v = std::getenv("NVFIPC_GPU_CHILD");
  return v != nullptr && std::string(v) == "1";
}

// The output of a child job's rank: its failures and one line per test, prefixed with the
// child's rank, and none of GoogleTest's "[  PASSED  ]"/"[  FAILED  ]" lines, which
// scripts/gpu/check.sh counts in the parent job's log as the parent's ranks' results.
class ChildPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit ChildPrinter(int64_t rank) : rank_(static_cast<long long>(rank)) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("child rank %lld: %s:%d: failure\n%s\n", rank_,
                r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* res = info.result();
    const char* outcome = res->Skipped() ? "skipped" : res->Passed() ? "passed" : "failed";
    std::printf("child rank %lld: %s.%s %s in %lld ms\n", rank_, info.test_suite_name(),
                info.name(), outcome, static_cast<long long>(res->elapsed_time()));
    std::fflush(stdout);
  }

 private:
  long long rank_;
};

}  // namespace

int main(int argc, char** argv) {
  using nvfipc_gpu::job;
  job().rank = EnvInt({"OMPI_COMM_WORLD_RANK", "WORLD_RANK", "RANK"}, 0);
  job().world = EnvInt({"OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"}, 1);
  job().local_rank = EnvInt({"OMPI_COMM_WORLD_LOCAL_RANK", "WORLD_LOCAL_RANK", "LOCAL_RANK"}, 0);
  job().timeout_ms = EnvInt({"NVFIPC_GPU_TEST_TIMEOUT_MS"}, 60000);
  const bool child = ChildMode();

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::fprintf(stderr, "rank %lld: no CUDA device (%s); the GPU suites need a GPU\n",
                 static_cast<long long>(job().rank), cudaGetErrorString(err));
    return 2;
  }
  job().device = static_cast<int>(job().local_rank % count);
  if (cudaSetDevice(job().device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "rank %lld: cannot initialise device %d\n",
                 static_cast<long long>(job().rank), job().device);
    return 2;
  }

  nvfipc_status st = nvfipc_context_from_env(&job().ctx);
  if (st != NVFIPC_STATUS_OK) {
    std::fprintf(stderr, "rank %lld: nvfipc_context_from_env -> %s\n",
                 static_cast<long long>(job().rank), nvfipc_gpu::Describe(st).c_str());
    return 2;
  }
  st = nvfipc_context_store(job().ctx, &job().store);
  if (st != NVFIPC_STATUS_OK) {
    std::fprintf(stderr, "rank %lld: nvfipc_context_store -> %s\n",
                 static_cast<long long>(job().rank), nvfipc_gpu::Describe(st).c_str());
    return 2;
  }
  std::printf("%srank %lld of %lld (local %lld) on device %d of %d\n", child ? "child " : "",
              static_cast<long long>(job().rank), static_cast<long long>(job().world),
              static_cast<long long>(job().local_rank), job().device, count);

  std::vector<char*> args(argv, argv + argc);
  std::string json_flag;
  if (const char* dir = std::getenv("NVFIPC_GPU_JSON_DIR")) {
    json_flag = std::string("--gtest_output=json:") + dir + "/rank" + std::to_string(job().rank) +
                ".json";
    args.push_back(json_flag.data());
  }
  int n_args = static_cast<int>(args.size());
  ::testing::InitGoogleTest(&n_args, args.data());
  if (child) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ChildPrinter(job().rank));
  }
  int result = RUN_ALL_TESTS();

  // Everyone finishes the suites before the store host may leave. A child job's test ends
  // with a barrier of its survivors instead (the store host waits for them when it closes).
  st = child ? NVFIPC_STATUS_OK : nvfipc_gpu::Barrier();
  if (st != NVFIPC_STATUS_OK) {
    std::fprintf(stderr, "rank %lld: final barrier -> %s\n", static_cast<long long>(job().rank),
                 nvfipc_gpu::Describe(st).c_str());
    result = result ? result : 1;
  }
  nvfipc_store_free(job().store);
  st = nvfipc_context_free(job().ctx);
  if (st != NVFIPC_STATUS_OK) {
    std::fprintf(stderr, "rank %lld: nvfipc_context_free -> %s\n",
                 static_cast<long long>(job().rank), nvfipc_gpu::Describe(st).c_str());
    result = result ? result : 1;
  }
  return result;
}
