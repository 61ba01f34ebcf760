// Shared helpers of the C API test suites: status checks that print the library's message, and
// a launcher that runs a named worker function in N separate processes (copies of the test
// binary) with rank environment variables, like torchrun or mpirun would.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nvfuser_ipc.h"

namespace nvfipc_test {

// This thread's last error message from the library.
inline std::string LastError() { return nvfipc_last_error_message(); }

// A status plus the message, for assertion output.
inline std::string Describe(nvfipc_status status) {
  return std::string(nvfipc_status_name(static_cast<int32_t>(status))) + ": " + LastError();
}

#define NVFIPC_ASSERT_OK(expr)                                                        \
  do {                                                                                \
    nvfipc_status nvfipc_st_ = (expr);                                                \
    ASSERT_EQ(nvfipc_st_, NVFIPC_STATUS_OK) << #expr << " -> " << ::nvfipc_test::Describe(nvfipc_st_); \
  } while (0)

#define NVFIPC_EXPECT_OK(expr)                                                        \
  do {                                                                                \
    nvfipc_status nvfipc_st_ = (expr);                                                \
    EXPECT_EQ(nvfipc_st_, NVFIPC_STATUS_OK) << #expr << " -> " << ::nvfipc_test::Describe(nvfipc_st_); \
  } while (0)

// Expects `expr` to fail with `status` and a message containing `needle`.
#define NVFIPC_EXPECT_ERROR(expr, status, needle)                                     \
  do {                                                                                \
    nvfipc_status nvfipc_st_ = (expr);                                                \
    EXPECT_EQ(nvfipc_st_, (status)) << #expr << " -> " << ::nvfipc_test::Describe(nvfipc_st_); \
    EXPECT_NE(::nvfipc_test::LastError().find(needle), std::string::npos)             \
        << #expr << ": message \"" << ::nvfipc_test::LastError() << "\" lacks \"" << (needle) << "\""; \
  } while (0)

// What a worker process knows about itself.
struct WorkerEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  uint16_t store_port = 0;  // port of the store served by the launching test
};

// A worker body: returns 0 on success; prints what went wrong to stderr otherwise.
using WorkerFn = std::function<int(const WorkerEnv&)>;

// Registers worker functions by name (at static initialisation).
std::map<std::string, WorkerFn>& Workers();
struct RegisterWorker {
  RegisterWorker(const std::string& name, WorkerFn fn) { Workers()[name] = std::move(fn); }
};
#define NVFIPC_WORKER(name)                                                            \
  static int name(const ::nvfipc_test::WorkerEnv& env);                                \
  static ::nvfipc_test::RegisterWorker register_##name(#name, name);                   \
  static int name(const ::nvfipc_test::WorkerEnv& env)

// How one worker process ended.
struct WorkerExit {
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // the signal that ended it, when signaled
  bool signaled = false;
  bool killed_on_timeout = false;
  bool ok() const { return !signaled && exit_code == 0; }
};

// Runs worker `name` in `world_size` processes (ranks 0..world_size-1) with RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=store_port set, waits for all
// of them at most `timeout_s` seconds (then kills the rest) and returns how each ended.
std::vector<WorkerExit> RunWorkers(const std::string& name, int world_size, uint16_t store_port,
                                   double timeout_s);

// When this process was started as a worker, runs it and returns its exit code; otherwise -1.
int MaybeRunWorker();

// Asserts that every worker succeeded.
void ExpectAllOk(const std::vector<WorkerExit>& exits);

// A loopback TCP port that was free a moment ago (for a server a worker binds, such as rank 0's
// c10d::TCPStore); 0 when none could be found.
uint16_t FreeLoopbackPort();

// A loopback TCP port held bound with nothing listening, for as long as this object lives: a
// connection to it is refused, and no other socket (another test, another job on the machine)
// can take the port meanwhile, as it could one learnt from a server that was then stopped.
class UnlistenedPort {
 public:
  UnlistenedPort();
  ~UnlistenedPort();
  UnlistenedPort(const UnlistenedPort&) = delete;
  UnlistenedPort& operator=(const UnlistenedPort&) = delete;
  uint16_t port() const { return port_; }  // 0 when no port could be bound

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A store server on an ephemeral loopback port for the duration of a test.
class ScopedServer {
 public:
  ScopedServer();
  ~ScopedServer();
  ScopedServer(const ScopedServer&) = delete;
  ScopedServer& operator=(const ScopedServer&) = delete;
  uint16_t port() const { return port_; }
  nvfipc_server* get() const { return server_; }

 private:
  nvfipc_server* server_ = nullptr;
  uint16_t port_ = 0;
};

}  // namespace nvfipc_test
