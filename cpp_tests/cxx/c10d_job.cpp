// The c10d flavour of a job (compiled only when Torch is found).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "jobs.hpp"
#include "nvfuser_ipc_c10d.hpp"

namespace nvfipc_cxx {
namespace {

constexpr const char* kFinishedKey = "nvfipc_cxx/finished";

class C10dJob final : public Job {
 public:
  explicit C10dJob(const JobSpec& spec) : spec_(spec) {
    // As nvFuser's Communicator: default options but the port and the server flag.
    ::c10d::TCPStoreOptions opts;
    opts.port = spec.port;
    opts.isServer = spec.rank == 0;
    opts.timeout = spec.timeout;
    tcp_ = c10::make_intrusive<::c10d::TCPStore>(spec.host, opts);
    nvfipc::Store store = nvfipc::c10d::storeFrom(tcp_);
    ctx_ = nvfipc::Context::create(spec.rank, spec.world, spec.local_rank, spec.local_world,
                                   store);
  }

  void close() override {
    ctx_.close();
    if (spec_.rank != 0) {
      tcp_->add(kFinishedKey, 1);
      return;
    }
    // The server must outlive every client's last request.
    const auto deadline = std::chrono::steady_clock::now() + spec_.timeout;
    while (tcp_->add(kFinishedKey, 0) < spec_.world - 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("rank 0: the other ranks did not finish within the timeout");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  JobSpec spec_;
  c10::intrusive_ptr<::c10d::TCPStore> tcp_;
};

}  // namespace

bool C10dBuilt() { return true; }

std::unique_ptr<Job> OpenC10dJob(const JobSpec& spec) { return std::make_unique<C10dJob>(spec); }

}  // namespace nvfipc_cxx
