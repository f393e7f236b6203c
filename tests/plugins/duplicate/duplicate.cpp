// Registers scheduler/constant, which the bundled plugins already provide: a duplicate.
#include "tessera/plugin.hpp"
#include "tessera/components/scheduler.hpp"

namespace {
struct One : tessera::Scheduler {
  double lr_factor(std::int64_t) const override { return 1.0; }
};
void register_components(tessera::Registrar& r) {
  r.add<tessera::Scheduler, tessera::NoConfig>("constant", "a second constant scheduler",
                                               [](const tessera::NoConfig&) { return std::make_shared<One>(); });
}
}  // namespace

TESSERA_PLUGIN("duplicate", "0.0.1", register_components)
