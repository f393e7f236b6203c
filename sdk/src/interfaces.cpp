// Out-of-line destructors give each SDK interface one home for its vtable and type info, so
// host and plugins agree on them across shared-library boundaries.
#include <torch/nn/module.h>

#include "tessera/callback.hpp"
#include "tessera/communicator.hpp"
#include "tessera/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/loss.hpp"
#include "tessera/model.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/scheduler.hpp"
#include "tessera/stateful.hpp"
#include "tessera/version.hpp"

namespace tessera {

const char* sdk_version() { return TESSERA_VERSION_STRING; }
std::uint32_t sdk_abi_version() { return kSdkAbiVersion; }

Error::~Error() = default;
ConfigError::ConfigError(const std::string& message, std::string field)
    : Error(message), field_(std::move(field)) {}
ConfigError::~ConfigError() = default;

Stateful::~Stateful() = default;
Model::~Model() = default;
Dataset::~Dataset() = default;
Loss::~Loss() = default;
Optimizer::~Optimizer() = default;
Scheduler::~Scheduler() = default;
Callback::~Callback() = default;
Communicator::~Communicator() = default;

std::int64_t Model::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) {
    if (p.requires_grad()) n += p.numel();
  }
  return n;
}

void TrainerControl::request_stop(std::string reason) {
  stop_ = true;
  if (stop_reason_.empty()) stop_reason_ = std::move(reason);
}
void TrainerControl::request_skip_step(std::string reason) {
  skip_ = true;
  log::warn("skipping this optimizer step: ", reason);
}
void TrainerControl::request_save(std::string reason) {
  save_ = true;
  log::info("save requested: ", reason);
}

}  // namespace tessera
