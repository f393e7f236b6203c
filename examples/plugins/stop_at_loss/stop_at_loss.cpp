// callback/stop_at_loss: ends the run once the loss, averaged over the last `window` steps,
// falls to `target` — an example of a callback asking the loop to stop.
#include <cstdint>
#include <deque>
#include <memory>
#include <numeric>

#include "tessera/components/callback.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

struct StopAtLossConfig {
  double target = 0;  // required: no default
  std::int64_t window = 10;

  static void declare(tessera::ConfigFields<StopAtLossConfig>& f) {
    f.field("target", &StopAtLossConfig::target, "stop when the mean loss is at or below this").required().greater_than(0);
    f.field("window", &StopAtLossConfig::window, "steps the loss is averaged over").at_least(1);
  }
};

class StopAtLoss : public tessera::Callback {
 public:
  explicit StopAtLoss(const StopAtLossConfig& config)
      : target_(config.target), window_(static_cast<std::size_t>(config.window)) {}

  void on_step_end(tessera::CallbackContext& context, const tessera::StepMetrics& metrics) override {
    recent_.push_back(metrics.loss);
    if (recent_.size() > window_) recent_.pop_front();
    const double mean = std::accumulate(recent_.begin(), recent_.end(), 0.0) / double(recent_.size());
    if (recent_.size() == window_ && mean <= target_) {
      tessera::log::info("stop_at_loss: mean loss ", mean, " over ", window_, " steps reached ", target_);
      context.control.request_stop("loss reached the target");
    }
  }

 private:
  double target_;
  std::size_t window_;
  std::deque<double> recent_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, StopAtLossConfig>(
      "stop_at_loss", "stops the run once the mean loss reaches a target",
      [](const StopAtLossConfig& c) { return std::make_shared<StopAtLoss>(c); });
}

}  // namespace

TESSERA_PLUGIN("stop_at_loss", "1.0.0", register_components)
