// callback/progress_bar built through the real loader and factory and driven directly: plain
// log lines every N steps when stderr is not a terminal, a bar redrawn with '\r' when asked for
// one, the fields both show, unbounded runs, and rank 0 only.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/log.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace progress_bar_test {

using ::testing::internal::CaptureStderr;
using ::testing::internal::GetCapturedStderr;

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config, std::int64_t max_steps, std::int64_t rank = 0)
      : CallbackRig("progress_bar", config, rank) {
    progress.max_steps = max_steps;
    log::set_level(log::Level::info);
  }

  std::shared_ptr<Callback>& bar = callback;


  // Each returns what went to stderr. train_begin runs with stderr captured, so it is not a tty.
  std::string train_begin() {
    CallbackContext ctx = context();
    CaptureStderr();
    bar->on_train_begin(ctx);
    return GetCapturedStderr();
  }
  std::string step_end(std::int64_t step, double loss = 2.5) {
    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.step_tokens = 1000;
    m.tokens = 1000 * step;
    m.step_time_s = 0.5;
    m.tokens_per_s = 2000;
    m.elapsed_s = 0.5 * static_cast<double>(step);
    if (progress.max_steps > 0) m.eta_s = 370.0;  // 6m10s
    progress.step = step;
    CallbackContext ctx = context();
    CaptureStderr();
    bar->on_step_end(ctx, m);
    return GetCapturedStderr();
  }
  std::string train_end() {
    CallbackContext ctx = context();
    CaptureStderr();
    bar->on_train_end(ctx);
    return GetCapturedStderr();
  }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ProgressBar, WithoutATerminalWritesALineEveryNStepsAndTheLastOne) {
  Harness h("{every: 5}", /*max_steps=*/12);  // mode auto
  EXPECT_EQ(h.train_begin(), "");
  for (std::int64_t step = 1; step <= 12; ++step) {
    const std::string out = h.step_end(step);
    if (step == 5 || step == 10) {
      EXPECT_TRUE(has(out, "step " + std::to_string(step) + "/12 (" + std::to_string(step * 100 / 12) +
                               "%) | 2.0k tok/s | loss 2.5000 | eta 6m10s\n"))
          << out;
      EXPECT_FALSE(has(out, "\r")) << out;
      EXPECT_FALSE(has(out, "[#")) << out;
    } else {
      EXPECT_EQ(out, "") << "step " << step;
    }
  }
  EXPECT_TRUE(has(h.train_end(), "step 12/12 (100%) | 2.0k tok/s | loss 2.5000 | eta 6m10s")) << "last step";
}

TEST(ProgressBar, UnboundedLinesShowCountsAndElapsedTime) {
  Harness h("{mode: lines, every: 2}", /*max_steps=*/0);
  h.train_begin();
  h.step_end(1);
  // No step limit: no total, percentage or eta; the elapsed time instead.
  const std::string line = h.step_end(2);
  EXPECT_TRUE(has(line, "step 2 | 2.0k tok/s | loss 2.5000 | elapsed 1s\n")) << line;
  EXPECT_FALSE(has(line, "%")) << line;
}

TEST(ProgressBar, BarModeRedrawsOneLineWithTheFillAndEta) {
  Harness h("{mode: bar}", /*max_steps=*/10);  // width 30
  h.train_begin();
  std::string out;
  for (std::int64_t step = 1; step <= 5; ++step) out += h.step_end(step);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 5) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 0) << out;
  const std::string last = out.substr(out.rfind('\r') + 1);
  EXPECT_EQ(last, "[" + std::string(15, '#') + std::string(15, '.') +
                      "] 5/10  50% | 2.0k tok/s | loss 2.5000 | eta 6m10s");
  // Straight to stderr: no log prefix before the bar.
  EXPECT_EQ(out.substr(0, 2), "\r[");
  EXPECT_EQ(h.train_end(), "\n");
}

TEST(ProgressBar, BarEndsItsLineAtTheLastStep) {
  Harness h("{mode: bar, width: 4}", /*max_steps=*/2);
  h.train_begin();
  EXPECT_EQ(h.step_end(1), "\r[##..] 1/2  50% | 2.0k tok/s | loss 2.5000 | eta 6m10s");
  EXPECT_EQ(h.step_end(2), "\r[####] 2/2 100% | 2.0k tok/s | loss 2.5000 | eta 6m10s\n");
  EXPECT_EQ(h.train_end(), "");  // the line is already ended
}

TEST(ProgressBar, BarWidthAndAShorterLineBlanksTheLongerOne) {
  Harness h("{mode: bar, width: 8}", /*max_steps=*/4);
  h.train_begin();
  const std::string first = h.step_end(1, /*loss=*/123456.0);
  EXPECT_EQ(first, "\r[##......] 1/4  25% | 2.0k tok/s | loss 123456.0000 | eta 6m10s");
  const std::string second = h.step_end(2, /*loss=*/1.0);
  EXPECT_EQ(second, "\r[####....] 2/4  50% | 2.0k tok/s | loss 1.0000 | eta 6m10s     ");
  EXPECT_EQ(second.size(), first.size());
}

TEST(ProgressBar, UnboundedBarShowsCountsOnly) {
  Harness h("{mode: bar}", /*max_steps=*/0);
  h.train_begin();
  const std::string out = h.step_end(3);
  EXPECT_EQ(out, "\rstep 3 | 2.0k tok/s | loss 2.5000 | elapsed 2s");
}

TEST(ProgressBar, OnlyRankZeroPrints) {
  for (const std::string mode : {"bar", "lines"}) {
    Harness h("{mode: " + mode + ", every: 1}", /*max_steps=*/10, /*rank=*/1);
    EXPECT_EQ(h.train_begin(), "");
    EXPECT_EQ(h.step_end(1), "") << mode;
    EXPECT_EQ(h.step_end(2), "") << mode;
    EXPECT_EQ(h.train_end(), "") << mode;
  }
}

}  // namespace progress_bar_test
}  // namespace tessera
