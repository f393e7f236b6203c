// Callback `health`: catches a run going wrong. Non-finite loss or gradients, loss and
// grad-norm spikes (robust z-score over a window of recent steps), and hangs (a watchdog thread:
// no progress for hang_timeout_s -> log where every rank is, then exit non-zero). Each check has
// a policy: warn | skip_step | save_and_stop | stop.
#include <ATen/ops/stack.h>
#include <ATen/ops/isfinite.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

enum class Policy { warn, skip_step, save_and_stop, stop };

Policy parse_policy(const std::string& text) {
  if (text == "skip_step") return Policy::skip_step;
  if (text == "save_and_stop") return Policy::save_and_stop;
  if (text == "stop") return Policy::stop;
  return Policy::warn;
}

// Robust z-score of `x` against `history`: 0.6745 (x - median) / MAD. The MAD has a floor of a
// millionth of the median, so a perfectly flat history does not make every wobble a spike.
double robust_z(double x, std::vector<double> history) {
  auto median_of = [](std::vector<double>& v) {
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    double m = *mid;
    if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), mid)) / 2;
    return m;
  };
  const double median = median_of(history);
  for (double& v : history) v = std::abs(v - median);
  const double mad = std::max(median_of(history), 1e-6 * std::abs(median) + 1e-12);
  return 0.6745 * (x - median) / mad;
}

// When a value is a spike: judged against the last `window` values once `min_history` were
// seen; `max_consecutive` spikes in a row are a new level.
struct SpikeRule {
  std::size_t window, min_history;
  double threshold;
  std::size_t max_consecutive;
};

// The recent values of one metric, for spike detection.
class SpikeDetector {
 public:
  SpikeDetector(std::string what, const SpikeRule& rule)
      : what_(std::move(what)),
        window_(rule.window),
        min_history_(rule.min_history),
        threshold_(rule.threshold),
        max_consecutive_(rule.max_consecutive) {}

  // The z-score when `x` is an upward spike against the history, else nothing. Values that are
  // spikes stay out of the history, so one spike does not hide the next. After max_consecutive
  // spikes in a row the values are a new level, not spikes: the history restarts from them (a
  // skip_step policy would otherwise skip every step from then on and the run would never move).
  std::optional<double> check(double x) {
    std::optional<double> spike;
    if (history_.size() >= min_history_) {
      const double z = robust_z(x, {history_.begin(), history_.end()});
      if (z > threshold_) spike = z;
    }
    if (spike) {
      recent_spikes_.push_back(x);
      if (recent_spikes_.size() < max_consecutive_) return spike;
      tessera::log::warn("health: ", recent_spikes_.size(), " ", what_, " spikes in a row: taking them as the new level");
      history_.assign(recent_spikes_.begin(), recent_spikes_.end());
      recent_spikes_.clear();
      return std::nullopt;
    }
    recent_spikes_.clear();
    history_.push_back(x);
    if (history_.size() > window_) history_.pop_front();
    return std::nullopt;
  }

 private:
  std::string what_;
  std::size_t window_, min_history_;
  double threshold_;
  std::size_t max_consecutive_;
  std::deque<double> history_;
  std::vector<double> recent_spikes_;  // the current run of consecutive spikes
};

// Where this rank is in the loop, shared with the watchdog thread.
class Whereabouts {
 public:
  void at(std::string where, bool progressed) {
    std::lock_guard<std::mutex> lock(mutex_);
    where_ = std::move(where);
    if (progressed) last_progress_ = Clock::now();
  }
  std::string where() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return where_;
  }
  double seconds_since_progress() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::chrono::duration<double>(Clock::now() - last_progress_).count();
  }

 private:
  mutable std::mutex mutex_;
  std::string where_ = "starting";
  Clock::time_point last_progress_ = Clock::now();
};

struct HealthConfig {
  std::string nonfinite = "skip_step";
  std::string loss_spike = "warn";
  std::string grad_spike = "warn";
  std::int64_t spike_window = 100;
  std::int64_t spike_min_history = 20;
  double spike_threshold = 6.0;
  std::int64_t spike_max_consecutive = 5;
  double hang_timeout_s = 0.0;
  std::int64_t hang_exit_code = 3;

  SpikeRule spikes() const {
    return {static_cast<std::size_t>(spike_window), static_cast<std::size_t>(spike_min_history), spike_threshold,
            static_cast<std::size_t>(spike_max_consecutive)};
  }

  static void declare(tessera::ConfigFields<HealthConfig>& f) {
    using C = HealthConfig;
    const std::vector<std::string> policies{"warn", "skip_step", "save_and_stop", "stop"};
    f.field("nonfinite", &C::nonfinite, "policy for a NaN/Inf loss or gradient: warn, skip_step, save_and_stop or stop")
        .one_of(policies);
    f.field("loss_spike", &C::loss_spike, "policy for a loss spike").one_of(policies);
    f.field("grad_spike", &C::grad_spike, "policy for a grad-norm spike").one_of(policies);
    f.field("spike_window", &C::spike_window, "recent steps the robust z-score is taken over").at_least(3);
    f.field("spike_min_history", &C::spike_min_history, "steps seen before spikes are judged").at_least(3);
    f.field("spike_threshold", &C::spike_threshold,
            "robust z-score (0.6745 (x - median) / MAD) above which a value is a spike")
        .greater_than(0);
    f.field("spike_max_consecutive", &C::spike_max_consecutive,
            "this many spikes in a row are a new level: the history restarts from them")
        .at_least(1);
    f.field("hang_timeout_s", &C::hang_timeout_s,
            "watchdog: no progress (a micro-batch, step, evaluation or save finishing) for this long ends the process "
            "(0: off)")
        .at_least(0);
    f.field("hang_exit_code", &C::hang_exit_code, "exit code when the watchdog ends a hung process").at_least(1);
  }
};

class Health final : public tessera::Callback {
 public:
  explicit Health(const HealthConfig& config)
      : nonfinite_(parse_policy(config.nonfinite)),
        loss_spike_(parse_policy(config.loss_spike)),
        grad_spike_(parse_policy(config.grad_spike)),
        loss_history_("loss", config.spikes()),
        grad_history_("grad-norm", config.spikes()),
        hang_timeout_s_(config.hang_timeout_s),
        hang_exit_code_(static_cast<int>(config.hang_exit_code)) {}

  ~Health() override { stop_watchdog(); }

  void on_train_begin(tessera::CallbackContext& ctx) override {
    rank_ = ctx.run.rank;
    world_ = ctx.run.world_size;
    status_dir_ = fs::path(ctx.run.run_dir) / "health";
    whereabouts_.at("before step " + std::to_string(ctx.progress.step + 1), true);
    if (hang_timeout_s_ > 0) start_watchdog();
  }
  void on_step_begin(tessera::CallbackContext& ctx) override {
    step_ = ctx.progress.step + 1;
    whereabouts_.at("step " + std::to_string(step_) + ": drawing data / forward-backward of micro-batch 1", false);
  }
  void on_micro_batch_end(tessera::CallbackContext&, const tessera::MicroBatchEnd& mb) override {
    whereabouts_.at("step " + std::to_string(step_) + ": micro-batch " + std::to_string(mb.index + 1) + " of " +
                        std::to_string(mb.count) + " done" +
                        (mb.index + 1 < mb.count ? "; forward-backward of the next" : "; reducing gradients"),
                    true);
  }

  void on_before_optimizer_step(tessera::CallbackContext& ctx, const tessera::BeforeOptimizerStep& s) override {
    whereabouts_.at("step " + std::to_string(step_) + ": optimizer step", false);
    // One host synchronisation for both numbers.
    const at::Tensor values = at::stack({s.loss.to(at::kFloat), s.grad_norm.to(s.loss.device(), at::kFloat)}).cpu();
    const double loss = values[0].item<double>(), grad_norm = values[1].item<double>();
    const std::string at_step = " at step " + std::to_string(step_);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      act(ctx, nonfinite_,
          !std::isfinite(loss) ? "non-finite loss" + at_step + " (" + std::to_string(loss) + ")"
                               : "non-finite gradients" + at_step + " (grad norm " + std::to_string(grad_norm) + ")");
      return;  // a non-finite value says nothing about spikes and stays out of the histories
    }
    if (auto z = loss_history_.check(loss)) {
      act(ctx, loss_spike_, "loss spike" + at_step + " (" + std::to_string(loss) + ", robust z " + std::to_string(*z) + ")");
    }
    if (auto z = grad_history_.check(grad_norm)) {
      act(ctx, grad_spike_,
          "grad-norm spike" + at_step + " (" + std::to_string(grad_norm) + ", robust z " + std::to_string(*z) + ")");
    }
  }

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics&) override {
    whereabouts_.at("between steps " + std::to_string(ctx.progress.step) + " and " +
                        std::to_string(ctx.progress.step + 1) + " (callbacks, checkpoints)",
                    true);
  }
  void on_evaluation_end(tessera::CallbackContext&, const tessera::EvalMetrics&) override {
    whereabouts_.at("after an evaluation at step " + std::to_string(step_), true);
  }
  void on_checkpoint_saved(tessera::CallbackContext&, const tessera::CheckpointEvent& e) override {
    whereabouts_.at("after saving " + e.path, true);
  }
  void on_train_end(tessera::CallbackContext&) override { stop_watchdog(); }
  void on_exception(tessera::CallbackContext&, const std::string&) override { stop_watchdog(); }

 private:
  // Every policy but warn also skips this step's update: a non-finite or spiking step's update
  // would otherwise reach the weights (and the checkpoint a stop saves).
  void act(tessera::CallbackContext& ctx, Policy policy, const std::string& what) {
    switch (policy) {
      case Policy::warn:
        tessera::log::warn("health: ", what);
        return;
      case Policy::skip_step:
        ctx.control.request_skip_step("health: " + what);
        return;
      case Policy::save_and_stop:
        ctx.control.request_skip_step("health: " + what);
        ctx.control.request_save("health: " + what);
        ctx.control.request_stop("health: " + what);
        return;
      case Policy::stop:
        ctx.control.request_skip_step("health: " + what);
        ctx.control.request_stop("health: " + what);
        return;
    }
  }

  void start_watchdog() {
    stop_watchdog();  // a second fit() starts a fresh one
    {
      std::lock_guard<std::mutex> lock(stop_mutex_);
      stopping_ = false;
    }
    std::error_code ignored;
    fs::create_directories(status_dir_, ignored);
    // An earlier attempt's status would be read as this one's by the other ranks.
    fs::remove(status_file(rank_), ignored);
    watchdog_ = std::thread([this] { watch(); });
  }

  fs::path status_file(std::int64_t rank) const { return status_dir_ / ("rank_" + std::to_string(rank) + ".txt"); }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(stop_mutex_);
      stopping_ = true;
    }
    stop_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  // This rank's whereabouts as a file the other ranks' watchdogs read: a hung rank cannot take
  // part in a collective, but its watchdog thread still writes.
  // Line 1: the position; line 2: when it was written (seconds since the epoch, to the
  // millisecond: a stream's default 6 significant digits would round it to thousands of seconds
  // and make a live rank look frozen), so a reader can tell a live rank's status from one that
  // stopped writing.
  void publish(const std::string& where, double idle_s) {
    const fs::path file = status_file(rank_);
    const fs::path tmp = file.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << where << " (last progress " << static_cast<std::int64_t>(idle_s) << " s ago)\n"
          << std::fixed << std::setprecision(3) << unix_seconds() << "\n";
    }
    std::error_code ignored;
    fs::rename(tmp, file, ignored);
  }

  void watch() {
    const auto poll = std::chrono::duration<double>(std::clamp(hang_timeout_s_ / 4, 0.05, 1.0));
    std::unique_lock<std::mutex> lock(stop_mutex_);
    while (!stop_cv_.wait_for(lock, poll, [this] { return stopping_; })) {
      const double idle = whereabouts_.seconds_since_progress();
      const std::string where = whereabouts_.where();
      publish(where, idle);
      if (idle < hang_timeout_s_) continue;
      tessera::log::error("health: no progress for ", idle, " s (hang_timeout_s ", hang_timeout_s_,
                          "); where each rank is:");
      for (std::int64_t r = 0; r < world_; ++r) {
        std::ifstream in(status_file(r));
        std::string line;
        double written = 0;
        std::getline(in, line);
        in >> written;
        const double age = unix_seconds() - written;
        if (line.empty()) {
          line = "(no status: the rank never started its watchdog, or its run directory is not shared with this one)";
        } else if (age > 5 * poll.count() + 2) {
          line += " [status not refreshed for " + std::to_string(static_cast<std::int64_t>(age)) +
                  " s: the process itself may be gone or frozen]";
        }
        tessera::log::error("health:   rank ", r, ": ", line);
      }
      tessera::log::error("health: the run looks hung; exiting with code ", hang_exit_code_,
                          " (raise hang_timeout_s if steps, evaluations or saves legitimately take longer)");
      std::_Exit(hang_exit_code_);
    }
  }

  Policy nonfinite_, loss_spike_, grad_spike_;
  SpikeDetector loss_history_, grad_history_;
  double hang_timeout_s_;
  int hang_exit_code_;
  std::int64_t rank_ = 0, world_ = 1, step_ = 0;
  fs::path status_dir_;
  Whereabouts whereabouts_;
  std::thread watchdog_;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, HealthConfig>(
      "health", "NaN/Inf and spike checks with per-check policies, and a hang watchdog",
      [](const HealthConfig& c) { return std::make_shared<Health>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_health", "0.1.0", register_components)
