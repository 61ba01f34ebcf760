#include "jobs.hpp"

#include <stdexcept>

namespace nvfipc_cxx {
namespace {

class NvfipcJob final : public Job {
 public:
  explicit NvfipcJob(const JobSpec& spec) {
    nvfipc::Store store = nvfipc::Store::connect(spec.host, spec.port, spec.timeout);
    ctx_ = nvfipc::Context::create(spec.rank, spec.world, spec.local_rank, spec.local_world,
                                   store);
  }
  void close() override { ctx_.close(); }
};

}  // namespace

std::unique_ptr<Job> OpenNvfipcJob(const JobSpec& spec) {
  return std::make_unique<NvfipcJob>(spec);
}

#ifndef NVFIPC_CXX_HAVE_TORCH
bool C10dBuilt() { return false; }
std::unique_ptr<Job> OpenC10dJob(const JobSpec&) {
  throw std::runtime_error("this test binary was built without Torch (no c10d adapter)");
}
#endif

}  // namespace nvfipc_cxx
