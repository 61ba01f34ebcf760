// How a rank of the scenario tests joins its job: through nvfuser-ipc's own TCPStore client, or
// through PyTorch's c10d::TCPStore (rank 0 serves, the others connect, as nvFuser's Communicator
// does) wrapped by the c10d adapter.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "nvfuser_ipc.hpp"

namespace nvfipc_cxx {

enum class StoreKind { Nvfipc, C10d };

inline const char* StoreKindName(StoreKind k) { return k == StoreKind::Nvfipc ? "nvfipc" : "c10d"; }
// For GoogleTest's parameter printing.
inline void PrintTo(StoreKind k, std::ostream* os) { *os << StoreKindName(k); }

struct JobSpec {
  int64_t rank = 0;
  int64_t world = 1;
  int64_t local_rank = 0;
  int64_t local_world = 1;
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  nvfipc::Milliseconds timeout{60000};
};

class Job {
 public:
  virtual ~Job() = default;
  const nvfipc::Context& ctx() const { return ctx_; }
  // Orderly end: every rank closes its context; the rank that serves the store keeps it up
  // until the others are done. Throws on failure.
  virtual void close() = 0;

 protected:
  nvfipc::Context ctx_;
};

// Connects to an nvfuser-ipc (or any TCPStore) server at spec.host:spec.port.
std::unique_ptr<Job> OpenNvfipcJob(const JobSpec& spec);

// Whether this binary was built with the c10d adapter (Torch found).
bool C10dBuilt();
// Rank 0 serves a c10d::TCPStore at spec.port, the others connect to it.
std::unique_ptr<Job> OpenC10dJob(const JobSpec& spec);

inline std::unique_ptr<Job> OpenJob(StoreKind kind, const JobSpec& spec) {
  return kind == StoreKind::Nvfipc ? OpenNvfipcJob(spec) : OpenC10dJob(spec);
}

}  // namespace nvfipc_cxx
