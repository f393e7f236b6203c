// Callback `console_logger`: one compact progress line every N steps on rank 0, e.g.
// step 120/2000 | loss 2.3412 | grad_norm 0.812 | lr 5.99e-04 | tok/s 12.3k | mfu 41.2% | 0.21 s/step
//   | mem 2.31G | elapsed 25s | eta 6m10s
// and one line per evaluation: eval val at step 200 | loss 2.3104 | perplexity 10.08
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/run/human_format.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace human = tessera::human;
using human::format;

struct ConsoleLoggerConfig {
  std::int64_t every = 10;

  static void declare(tessera::ConfigFields<ConsoleLoggerConfig>& f) {
    f.field("every", &ConsoleLoggerConfig::every, "log every N optimizer steps (the first and last always)").at_least(1);
  }
};

class ConsoleLogger final : public tessera::Callback {
 public:
  explicit ConsoleLogger(const ConsoleLoggerConfig& config) : every_(config.every) {}

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (ctx.run.rank != 0) return;
    window_time_s_ += m.step_time_s;
    window_tokens_ += m.step_tokens;
    ++window_steps_;
    last_ = m;
    if (m.step == 1 || m.step % every_ == 0) print(ctx);
  }

  void on_evaluation_end(tessera::CallbackContext& ctx, const tessera::EvalMetrics& m) override {
    if (ctx.run.rank != 0) return;
    std::string line = "eval " + m.name + " at step " + std::to_string(m.step);
    for (const auto& [name, value] : m.values) line += " | " + name + " " + format("%.4f", value);
    tessera::log::info(line);
  }

  // The last step is always shown, even when it does not fall on `every`.
  void on_train_end(tessera::CallbackContext& ctx) override {
    if (ctx.run.rank != 0 || !last_ || window_steps_ == 0) return;
    print(ctx);
  }

 private:
  void print(const tessera::CallbackContext& ctx) {
    const tessera::StepMetrics& m = *last_;
    const std::int64_t max_steps = ctx.progress.max_steps;
    // Throughput and step time over the steps since the previous line, so one slow step (e.g.
    // the first, which warms up allocators and kernels) does not dominate.
    const double window_time = window_time_s_ > 0 ? window_time_s_ : m.step_time_s;
    std::string line = "step " + std::to_string(m.step);
    if (max_steps > 0) line += "/" + std::to_string(max_steps);
    line += " | loss " + format("%.4f", m.loss);
    line += " | grad_norm " + format("%.3f", m.grad_norm);
    line += " | lr " + format("%.2e", m.lr);
    if (window_time > 0) {
      line += " | tok/s " + human::count(static_cast<double>(window_tokens_) / window_time);
    }
    if (m.mfu) line += " | mfu " + format("%.1f%%", *m.mfu * 100.0);
    line += " | " + format("%.3g", window_time / static_cast<double>(window_steps_)) + " s/step";
    if (m.memory_peak_bytes > 0) line += " | mem " + human::count(static_cast<double>(m.memory_peak_bytes)) + "B";
    line += " | elapsed " + human::duration(m.elapsed_s);
    if (m.eta_s) line += " | eta " + human::duration(*m.eta_s);
    if (m.skipped.value() != 0) line += " | skipped";
    tessera::log::info(line);
    window_time_s_ = 0;
    window_tokens_ = 0;
    window_steps_ = 0;
  }

  std::int64_t every_;
  std::optional<tessera::StepMetrics> last_;
  double window_time_s_ = 0;  // since the previous line
  std::int64_t window_tokens_ = 0;
  std::int64_t window_steps_ = 0;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, ConsoleLoggerConfig>(
      "console_logger", "one compact progress line every N steps on rank 0",
      [](const ConsoleLoggerConfig& c) { return std::make_shared<ConsoleLogger>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_console_logger", "0.1.0", register_components)
