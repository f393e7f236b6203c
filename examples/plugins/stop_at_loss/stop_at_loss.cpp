// callback/stop_at_loss: ends the run once the loss, averaged over the last `window` steps,
// falls to `target` — an example of a callback asking the loop to stop.
#include <deque>
#include <numeric>

#include "tessera/callback.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

class StopAtLoss : public tessera::Callback {
 public:
  explicit StopAtLoss(const tessera::ComponentConfig& config)
      : target_(config.number("target")), window_(static_cast<size_t>(config.integer("window"))) {}

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
  size_t window_;
  std::deque<double> recent_;
};

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  schema.number("target", "stop when the mean loss is at or below this").greater_than(0);
  schema.integer("window", "steps the loss is averaged over").default_to(10).at_least(1);
  registrar.add<tessera::Callback>("stop_at_loss", "stops the run once the mean loss reaches a target", schema,
                                   [](const tessera::ComponentConfig& c) { return std::make_shared<StopAtLoss>(c); });
}

}  // namespace

TESSERA_PLUGIN("stop_at_loss", "1.0.0", register_components)
