// Scheduler `constant`: the base lr after an optional linear warmup.
#include <cstdint>
#include <memory>

#include "../warmup.hpp"
#include "tessera/plugin.hpp"
#include "tessera/scheduler.hpp"

namespace {

class ConstantScheduler final : public tessera::Scheduler {
 public:
  explicit ConstantScheduler(const tessera::ComponentConfig& config)
      : warmup_steps_(config.integer("warmup_steps")) {}

  double lr_factor(std::int64_t step) const override {
    return tessera::schedulers::warmup_factor(step, warmup_steps_);
  }

 private:
  std::int64_t warmup_steps_;
};

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  tessera::schedulers::declare_warmup(schema);
  registrar.add<tessera::Scheduler>(
      "constant", "constant lr after an optional linear warmup", schema,
      [](const tessera::ComponentConfig& c) { return std::make_shared<ConstantScheduler>(c); });
}

}  // namespace

TESSERA_PLUGIN("scheduler_constant", "0.1.0", register_components)
