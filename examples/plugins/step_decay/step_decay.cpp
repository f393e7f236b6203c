// scheduler/step_decay: multiplies the learning rate by `gamma` every `step_size` steps (the
// classic StepLR), built out of tree against an installed Tessera.
#include <cmath>

#include "tessera/plugin.hpp"
#include "tessera/scheduler.hpp"

namespace {

class StepDecay : public tessera::Scheduler {
 public:
  explicit StepDecay(const tessera::ComponentConfig& config)
      : step_size_(config.integer("step_size")), gamma_(config.number("gamma")) {}

  double lr_factor(std::int64_t step) const override {
    return std::pow(gamma_, static_cast<double>(step / step_size_));
  }

 private:
  std::int64_t step_size_;
  double gamma_;
};

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  schema.integer("step_size", "steps between decays").default_to(100).at_least(1);
  schema.number("gamma", "multiplier at each decay").default_to(0.5).greater_than(0).at_most(1);
  registrar.add<tessera::Scheduler>("step_decay", "lr times gamma every step_size steps", schema,
                                    [](const tessera::ComponentConfig& c) { return std::make_shared<StepDecay>(c); });
}

}  // namespace

TESSERA_PLUGIN("step_decay", "1.0.0", register_components)
