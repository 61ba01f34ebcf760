#include "test_util.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <tuple>
#include <utility>

extern char** environ;

namespace nvfipc_test {

namespace {
constexpr const char* kWorkerVar = "NVFIPC_TEST_WORKER";
constexpr const char* kPortVar = "NVFIPC_TEST_STORE_PORT";

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::strtoll(value, nullptr, 10);
}
}  // namespace

std::map<std::string, WorkerFn>& Workers() {
  static std::map<std::string, WorkerFn> workers;
  return workers;
}

int MaybeRunWorker() {
  const char* name = std::getenv(kWorkerVar);
  if (name == nullptr) {
    return -1;
  }
  auto it = Workers().find(name);
  if (it == Workers().end()) {
    std::fprintf(stderr, "unknown worker '%s'\n", name);
    return 2;
  }
  WorkerEnv env;
  env.rank = EnvInt("RANK", 0);
  env.world_size = EnvInt("WORLD_SIZE", 1);
  env.store_port = static_cast<uint16_t>(EnvInt(kPortVar, 0));
  return it->second(env);
}

std::vector<WorkerExit> RunWorkers(const std::string& name, int world_size, uint16_t store_port,
                                   double timeout_s) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> vars = {
        std::string(kWorkerVar) + "=" + name,
        std::string(kPortVar) + "=" + std::to_string(store_port),
        "RANK=" + std::to_string(rank),
        "WORLD_SIZE=" + std::to_string(world_size),
        "LOCAL_RANK=" + std::to_string(rank),
        "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
        "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=" + std::to_string(store_port),
    };
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      bool overridden = false;
      for (const auto& v : vars) {
        if (entry.compare(0, v.find('=') + 1, v, 0, v.find('=') + 1) == 0) overridden = true;
      }
      if (!overridden) envp.push_back(*e);
    }
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    char* argv[] = {exe.data(), nullptr};
    pid_t pid = -1;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn of rank " << rank << " failed: " << rc;
      break;
    }
    pids.push_back(pid);
  }

  std::vector<WorkerExit> exits(pids.size());
  std::vector<bool> done(pids.size(), false);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        exits[i].signaled = WIFSIGNALED(status);
        exits[i].signal = exits[i].signaled ? WTERMSIG(status) : 0;
        exits[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(pids[i], SIGKILL);
        int status = 0;
        waitpid(pids[i], &status, 0);
        exits[i].signaled = true;
        exits[i].signal = SIGKILL;
        exits[i].killed_on_timeout = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exits;
}

void ExpectAllOk(const std::vector<WorkerExit>& exits) {
  for (size_t rank = 0; rank < exits.size(); ++rank) {
    const WorkerExit& e = exits[rank];
    EXPECT_TRUE(e.ok()) << "rank " << rank << ": "
                        << (e.killed_on_timeout ? "killed after the test timeout"
                            : e.signaled        ? "ended by signal " + std::to_string(e.signal)
                                                : "exit code " + std::to_string(e.exit_code));
  }
}

namespace {
// A TCP socket bound to an ephemeral loopback port; its fd (or -1) and the port (or 0).
std::pair<int, uint16_t> BindEphemeralLoopback() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {-1, 0};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return {-1, 0};
  }
  return {fd, ntohs(addr.sin_port)};
}
}  // namespace

uint16_t FreeLoopbackPort() {
  auto [fd, port] = BindEphemeralLoopback();
  if (fd >= 0) ::close(fd);
  return port;
}

// Bound without SO_REUSEADDR and never listening: the kernel answers a connect with a reset
// (ECONNREFUSED) and refuses every other bind of the port until the destructor closes it.
UnlistenedPort::UnlistenedPort() {
  std::tie(fd_, port_) = BindEphemeralLoopback();
  if (fd_ < 0) ADD_FAILURE() << "no loopback port could be bound";
}

UnlistenedPort::~UnlistenedPort() {
  if (fd_ >= 0) ::close(fd_);
}

ScopedServer::ScopedServer() {
  nvfipc_status st = nvfipc_store_serve("127.0.0.1", 0, &port_, &server_);
  if (st != NVFIPC_STATUS_OK) {
    ADD_FAILURE() << "nvfipc_store_serve: " << Describe(st);
  }
}

ScopedServer::~ScopedServer() {
  // Workers have exited by now; a short bounded wait covers connections still closing.
  nvfipc_status st = nvfipc_server_free(server_, 2000);
  if (st != NVFIPC_STATUS_OK) {
    ADD_FAILURE() << "nvfipc_server_free: " << Describe(st);
  }
}

}  // namespace nvfipc_test
