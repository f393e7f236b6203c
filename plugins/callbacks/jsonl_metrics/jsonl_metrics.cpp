// Callback `jsonl_metrics`: appends one JSON object per optimizer step to a file (JSON Lines),
// and one per evaluation (marked by an "eval" key), for plots and offline analysis. Rank 0 only.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/jsonl_steps.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

// JSON has no NaN or Infinity; a diverged loss is written as null so every line still parses.
nlohmann::json number(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

struct JsonlMetricsConfig {
  std::string path = "metrics.jsonl";
  std::int64_t flush_every = 1;

  static void declare(tessera::ConfigFields<JsonlMetricsConfig>& f) {
    f.field("path", &JsonlMetricsConfig::path, "output file, relative to the run directory unless absolute");
    f.field("flush_every", &JsonlMetricsConfig::flush_every, "flush the file every N lines").at_least(1);
  }
};

class JsonlMetrics final : public tessera::Callback {
 public:
  JsonlMetrics(const JsonlMetricsConfig& config, const tessera::RunContext& run)
      : flush_every_(config.flush_every), path_(tessera::in_run_dir(run, config.path)) {}

  void on_train_begin(tessera::CallbackContext& ctx) override {
    if (ctx.run.rank != 0) return;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
    // A fresh run starts a fresh file. A resumed one keeps the lines up to the step it resumed
    // at (later ones belong to the attempt that did not reach its next checkpoint) and appends.
    if (ctx.progress.step > 0) tessera::keep_jsonl_steps_up_to(path_, ctx.progress.step);
    out_.open(path_, std::ios::out | (ctx.progress.step > 0 ? std::ios::app : std::ios::trunc));
    if (!out_) throw tessera::Error("callback/jsonl_metrics: cannot open " + path_.string());
  }

  // A step's row is written when its loss has arrived from the device: at once on a CPU, a step
  // later on a GPU (by then the copy has long landed), so the sink never makes the device wait.
  // Pending rows are written before anything else is (evaluation rows, checkpoints, the end).
  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (ctx.run.rank != 0 || !out_.is_open()) return;
    write_pending();
    if (m.loss.ready() && m.grad_norm.ready()) {
      write(row(m));
    } else {
      pending_ = m;
    }
  }

  void on_checkpoint_saved(tessera::CallbackContext&, const tessera::CheckpointEvent&) override {
    write_pending();
    flush();
  }

 private:
  static nlohmann::json row(const tessera::StepMetrics& m) {
    nlohmann::json line = {
        {"step", m.step},
        {"loss", number(m.loss)},
        {"grad_norm", number(m.grad_norm)},
        {"lr", number(m.lr)},
        {"tokens", m.tokens},
        {"step_tokens", m.step_tokens},
        {"target_tokens", m.target_tokens},
        {"tokens_per_s", number(m.tokens_per_s)},
        {"tokens_per_s_per_device", number(m.tokens_per_s_per_device)},
        {"step_time_s", number(m.step_time_s)},
        {"time_data_s", number(m.time_data_s)},
        {"time_forward_backward_s", number(m.time_forward_backward_s)},
        {"time_optimizer_s", number(m.time_optimizer_s)},
        {"time_communication_s", number(m.time_communication_s)},
        {"memory_in_use_bytes", m.memory_in_use_bytes},
        {"memory_peak_bytes", m.memory_peak_bytes},
        {"memory_reserved_bytes", m.memory_reserved_bytes},
        {"elapsed_s", number(m.elapsed_s)},
        {"skipped", m.skipped.value() != 0},
    };
    if (m.mfu) line["mfu"] = number(*m.mfu);
    if (m.eta_s) line["eta_s"] = number(*m.eta_s);
    for (const auto& [name, value] : m.extra) line[name] = number(value);
    return line;
  }

  void write_pending() {
    if (!pending_) return;
    write(row(*pending_));
    pending_.reset();
  }

 public:

  // {"step": 200, "eval": "val", "val/loss": 2.31, "val/perplexity": 10.1, ...}
  void on_evaluation_end(tessera::CallbackContext& ctx, const tessera::EvalMetrics& m) override {
    if (ctx.run.rank != 0 || !out_.is_open()) return;
    write_pending();
    nlohmann::json line = {{"step", m.step}, {"eval", m.name}};
    for (const auto& [name, value] : m.values) line[m.name + "/" + name] = number(value);
    write(line);
  }

  void on_train_end(tessera::CallbackContext&) override {
    write_pending();
    flush();
  }
  // A failing run's pending row is written only if its values have landed: reading one still on
  // its way waits on the device, which a failed collective or a lost peer may never let finish.
  void on_exception(tessera::CallbackContext&, const std::string&) override {
    if (pending_ && !(pending_->loss.ready() && pending_->grad_norm.ready() && pending_->skipped.ready())) {
      tessera::log::warn("jsonl_metrics: step ", pending_->step, "'s row is left out: its loss had not arrived from ",
                         "the device when the run failed");
      pending_.reset();
    }
    write_pending();
    flush();
  }

 private:
  void write(const nlohmann::json& line) {
    out_ << line.dump() << '\n';
    if (++lines_since_flush_ >= flush_every_) flush();
  }

  void flush() {
    if (!out_.is_open()) return;
    out_.flush();
    lines_since_flush_ = 0;
  }

  std::filesystem::path path_;
  std::int64_t flush_every_;
  std::ofstream out_;
  std::int64_t lines_since_flush_ = 0;
  std::optional<tessera::StepMetrics> pending_;  // a step whose loss was still on its way
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, JsonlMetricsConfig>(
      "jsonl_metrics", "one JSON object per step appended to a file, rank 0 only",
      [](const JsonlMetricsConfig& c, const tessera::RunContext& run) { return std::make_shared<JsonlMetrics>(c, run); });
}

}  // namespace

TESSERA_PLUGIN("callback_jsonl_metrics", "0.1.0", register_components)
