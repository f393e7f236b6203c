// scheduler/step_decay: multiplies the learning rate by `gamma` every `step_size` steps (the
// classic StepLR), built out of tree against an installed Tessera.
#include <cmath>
#include <cstdint>
#include <memory>

#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {

// The config, declared once: the members' initialisers are the defaults the host documents and
// fills in; declare() names each field's YAML key, doc and constraints.
struct StepDecayConfig {
  std::int64_t step_size = 100;
  double gamma = 0.5;

  static void declare(tessera::ConfigFields<StepDecayConfig>& f) {
    f.field("step_size", &StepDecayConfig::step_size, "steps between decays").at_least(1);
    f.field("gamma", &StepDecayConfig::gamma, "multiplier at each decay").greater_than(0).at_most(1);
  }
};

class StepDecay : public tessera::Scheduler {
 public:
  explicit StepDecay(const StepDecayConfig& config) : config_(config) {}

  double lr_factor(std::int64_t step) const override {
    return std::pow(config_.gamma, static_cast<double>(step / config_.step_size));
  }

 private:
  StepDecayConfig config_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Scheduler, StepDecayConfig>(
      "step_decay", "lr times gamma every step_size steps",
      [](const StepDecayConfig& c) { return std::make_shared<StepDecay>(c); });
}

}  // namespace

TESSERA_PLUGIN("step_decay", "1.0.0", register_components)
