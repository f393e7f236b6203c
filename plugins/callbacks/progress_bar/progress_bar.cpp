// Callback `progress_bar`: on rank 0, a one-line bar redrawn in place on a terminal
//   [###############...............] 50/100  50% | 12.3k tok/s | loss 2.3412 | eta 6m10s
// and, when stderr is not a terminal (a log file, a batch job), a plain line every N steps.
#include <unistd.h>

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

struct ProgressBarConfig {
  std::string mode = "auto";
  std::int64_t width = 30;
  std::int64_t every = 10;

  static void declare(tessera::ConfigFields<ProgressBarConfig>& f) {
    using C = ProgressBarConfig;
    f.field("mode", &C::mode, "bar: redraw one line; lines: a log line every N steps; auto: bar on a terminal")
        .one_of({"auto", "bar", "lines"});
    f.field("width", &C::width, "cells of the bar").at_least(1);
    f.field("every", &C::every, "in lines mode, a line every N optimizer steps").at_least(1);
  }
};

class ProgressBar final : public tessera::Callback {
 public:
  explicit ProgressBar(const ProgressBarConfig& config) : mode_(config.mode), width_(config.width), every_(config.every) {}

  void on_train_begin(tessera::CallbackContext& ctx) override {
    if (ctx.run.rank != 0) return;
    // A bar only makes sense where '\r' moves back over the line: an interactive terminal.
    bar_ = mode_ == "bar" || (mode_ == "auto" && ::isatty(STDERR_FILENO) == 1);
  }

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (ctx.run.rank != 0) return;
    window_tokens_ += m.step_tokens;
    window_time_s_ += m.step_time_s;
    last_ = m;
    // The newest loss that has arrived from the device: the bar is redrawn every step, and
    // reading a loss still on its way would make the host wait for the device each time. On a
    // GPU this step's is on its way; the one kept waiting is shown once it lands (it stays
    // until then, however far ahead the host runs).
    if (arriving_loss_ && arriving_loss_->ready()) {
      shown_loss_ = static_cast<double>(*arriving_loss_);
      arriving_loss_.reset();
    }
    if (m.loss.ready()) {
      shown_loss_ = static_cast<double>(m.loss);
      arriving_loss_.reset();
    } else if (!arriving_loss_) {
      arriving_loss_ = m.loss;
    }
    if (bar_) {
      redraw(ctx);
      // Done: what the run logs next (checkpoint, summary) starts on a line of its own.
      if (ctx.progress.max_steps > 0 && m.step >= ctx.progress.max_steps) finish_line();
    } else if (m.step % every_ == 0) {
      tessera::log::info(status(ctx));
    }
  }

  void on_train_end(tessera::CallbackContext& ctx) override {
    if (ctx.run.rank != 0) return;
    // Training is over: waiting for the last loss costs nothing now.
    const bool arrived_late = last_ && !last_->loss.ready();
    if (arrived_late) shown_loss_ = static_cast<double>(last_->loss);
    arriving_loss_.reset();
    if (bar_) {
      if (arrived_late && drawn_length_ > 0) redraw(ctx);  // the line still open: with the last loss
      finish_line();
    } else if (last_ && last_->step % every_ != 0) {
      tessera::log::info(status(ctx));  // the last step, when it did not fall on `every`
    }
  }

  // The error's message then starts on a line of its own.
  void on_exception(tessera::CallbackContext& ctx, const std::string&) override {
    if (ctx.run.rank == 0 && bar_) finish_line();
  }

 private:
  // "[####....] 50/100  50% | 12.3k tok/s | loss 2.3412 | eta 6m10s"; without a step limit,
  // "step 50 | 12.3k tok/s | loss 2.3412 | elapsed 25s" (and no bar).
  std::string status(const tessera::CallbackContext& ctx) {
    const tessera::StepMetrics& m = *last_;
    const std::int64_t max_steps = ctx.progress.max_steps;
    std::string text;
    if (max_steps > 0) {
      const double fraction = std::min(1.0, static_cast<double>(m.step) / static_cast<double>(max_steps));
      const auto percent = static_cast<int>(fraction * 100.0);
      if (bar_) {
        const auto filled = static_cast<std::int64_t>(fraction * static_cast<double>(width_));
        text = "[" + std::string(static_cast<std::size_t>(filled), '#') +
               std::string(static_cast<std::size_t>(width_ - filled), '.') + "] " +
               std::to_string(m.step) + "/" + std::to_string(max_steps) + " " +
               format("%3.0f", percent) + "%";
      } else {
        text = "step " + std::to_string(m.step) + "/" + std::to_string(max_steps) + " (" +
               std::to_string(percent) + "%)";
      }
    } else {
      text = "step " + std::to_string(m.step);
    }
    // Throughput over the steps since the previous output, so one slow step does not dominate.
    const double tokens_per_s = window_time_s_ > 0
                                    ? static_cast<double>(window_tokens_) / window_time_s_
                                    : m.tokens_per_s;
    text += " | " + human::count(tokens_per_s) + " tok/s";
    if (shown_loss_) text += " | loss " + format("%.4f", *shown_loss_);
    if (m.eta_s) {
      text += " | eta " + human::duration(*m.eta_s);
    } else {
      text += " | elapsed " + human::duration(m.elapsed_s);
    }
    window_tokens_ = 0;
    window_time_s_ = 0;
    return text;
  }

  // Straight to stderr, not through the logger: a log prefix on every redraw would be noise.
  void redraw(const tessera::CallbackContext& ctx) {
    std::string text = status(ctx);
    const std::size_t length = text.size();
    // Blank what is left of a longer previous line.
    if (length < drawn_length_) text.append(drawn_length_ - length, ' ');
    std::fputs(("\r" + text).c_str(), stderr);
    std::fflush(stderr);
    drawn_length_ = length;
  }

  void finish_line() {
    if (drawn_length_ == 0) return;
    std::fputs("\n", stderr);
    std::fflush(stderr);
    drawn_length_ = 0;
  }

  std::string mode_;
  std::int64_t width_;
  std::int64_t every_;
  bool bar_ = false;
  std::optional<tessera::StepMetrics> last_;
  std::optional<double> shown_loss_;               // the newest loss that has arrived
  std::optional<tessera::MetricValue> arriving_loss_;  // a step's loss still on its way
  std::int64_t window_tokens_ = 0;
  double window_time_s_ = 0;
  std::size_t drawn_length_ = 0;  // of the bar line now on screen; 0 when none
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, ProgressBarConfig>(
      "progress_bar", "a progress bar on a terminal, periodic lines elsewhere; rank 0 only",
      [](const ProgressBarConfig& c) { return std::make_shared<ProgressBar>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_progress_bar", "0.1.0", register_components)
