// Scheduler `constant`: the base lr after an optional linear warmup.
#include <cstdint>
#include <memory>

#include "../warmup.hpp"
#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {

struct ConstantConfig : tessera::schedulers::WarmupConfig {
  static void declare(tessera::ConfigFields<ConstantConfig>& f) { tessera::schedulers::declare_warmup(f); }
};

class ConstantScheduler final : public tessera::Scheduler {
 public:
  explicit ConstantScheduler(const ConstantConfig& config) : warmup_steps_(config.warmup_steps) {}

  double lr_factor(std::int64_t step) const override {
    return tessera::schedulers::warmup_factor(step, warmup_steps_);
  }

 private:
  std::int64_t warmup_steps_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Scheduler, ConstantConfig>(
      "constant", "constant lr after an optional linear warmup",
      [](const ConstantConfig& c) { return std::make_shared<ConstantScheduler>(c); });
}

}  // namespace

TESSERA_PLUGIN("scheduler_constant", "0.1.0", register_components)
