// callback/console_logger built through the real loader and factory and driven directly: which
// steps it logs (first, every N, the last at train end), what a line says, and rank 0 only.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/log.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace console_logger_test {

using ::testing::internal::CaptureStderr;
using ::testing::internal::GetCapturedStderr;

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config, std::int64_t rank = 0)
      : CallbackRig("console_logger", config, rank) {
    progress.max_steps = 10;
    log::set_level(log::Level::info);
  }

  std::shared_ptr<Callback>& logger = callback;
  std::optional<double> mfu;
  std::int64_t memory_peak = 0;

  // Ends step `step` and returns what was logged.
  std::string step_end(std::int64_t step, bool skipped = false) {
    StepMetrics m;
    m.step = step;
    m.loss = 2.5;
    m.grad_norm = 0.5;
    m.lr = 1e-3;
    m.step_tokens = 1000;
    m.tokens = 1000 * step;
    m.target_tokens = 900;
    m.step_time_s = 0.5;
    m.tokens_per_s = 2000;
    m.elapsed_s = 0.5 * static_cast<double>(step);
    m.skipped = skipped;
    // As the trainer computes it: steps left at this run's mean step time.
    if (progress.max_steps > 0) m.eta_s = 0.5 * static_cast<double>(progress.max_steps - step);
    m.mfu = mfu;
    m.memory_peak_bytes = memory_peak;
    progress.step = step;
    progress.tokens = m.tokens;
    CallbackContext ctx = context();
    CaptureStderr();
    logger->on_step_end(ctx, m);
    return GetCapturedStderr();
  }

  std::string train_end() {
    CallbackContext ctx = context();
    CaptureStderr();
    logger->on_train_end(ctx);
    return GetCapturedStderr();
  }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ConsoleLogger, LogsTheFirstStepEveryNAndTheLastAtTrainEnd) {
  Harness h("{every: 3}");
  for (std::int64_t step = 1; step <= 7; ++step) {
    const std::string out = h.step_end(step);
    const bool expected = step == 1 || step == 3 || step == 6;
    EXPECT_EQ(has(out, "step " + std::to_string(step) + "/10"), expected) << "step " << step << ": " << out;
    if (!expected) EXPECT_EQ(out, "") << "step " << step;
  }
  const std::string end = h.train_end();
  EXPECT_TRUE(has(end, "step 7/10")) << end;
}

TEST(ConsoleLogger, DoesNotRepeatALoggedLastStepAtTrainEnd) {
  Harness h("{every: 3}");
  for (std::int64_t step = 1; step <= 6; ++step) h.step_end(step);
  EXPECT_EQ(h.train_end(), "");
}

TEST(ConsoleLogger, TrainEndWithoutStepsLogsNothing) {
  Harness h("{every: 3}");
  EXPECT_EQ(h.train_end(), "");
}

TEST(ConsoleLogger, LineCarriesTheStepsMetrics) {
  Harness h("{every: 3}");
  h.step_end(1);
  h.step_end(2);
  const std::string line = h.step_end(3);
  EXPECT_TRUE(has(line, "step 3/10 | loss 2.5000 | grad_norm 0.500 | lr 1.00e-03")) << line;
  // Throughput over the two steps since the previous line: 2000 tokens in 1 s.
  EXPECT_TRUE(has(line, "tok/s 2.0k")) << line;
  EXPECT_TRUE(has(line, "0.5 s/step")) << line;
  EXPECT_TRUE(has(line, "elapsed 2s")) << line;
  EXPECT_TRUE(has(line, "eta 4s")) << line;  // 7 steps left at 0.5 s
  EXPECT_FALSE(has(line, "skipped")) << line;
  EXPECT_TRUE(has(h.step_end(6, /*skipped=*/true), "| skipped"));
}

TEST(ConsoleLogger, UnboundedRunShowsNoTotalOrEta) {
  Harness h("{}");
  h.progress.max_steps = 0;
  const std::string line = h.step_end(1);
  EXPECT_TRUE(has(line, "step 1 | loss")) << line;
  EXPECT_FALSE(has(line, "eta")) << line;
  EXPECT_EQ(h.step_end(5), "");   // default every is 10
  EXPECT_NE(h.step_end(10), "");
}

TEST(ConsoleLogger, ShowsMfuAndPeakMemoryWhenKnown) {
  Harness h("{every: 1}");
  EXPECT_FALSE(has(h.step_end(1), "mfu"));
  h.mfu = 0.4125;
  h.memory_peak = 2'310'000'000;
  const std::string line = h.step_end(2);
  EXPECT_TRUE(has(line, "| mfu 41.2%")) << line;
  EXPECT_TRUE(has(line, "| mem 2.31GB")) << line;
}

TEST(ConsoleLogger, LogsEachEvaluation) {
  Harness h("{}");
  CallbackContext ctx = h.context();
  CaptureStderr();
  h.logger->on_evaluation_end(ctx, EvalMetrics{200, "val", {{"loss", 2.31041}, {"perplexity", 10.0805}}});
  const std::string out = GetCapturedStderr();
  EXPECT_TRUE(has(out, "eval val at step 200 | loss 2.3104 | perplexity 10.0805")) << out;
}

TEST(ConsoleLogger, OnlyRankZeroLogs) {
  Harness h("{every: 1}", /*rank=*/1);
  EXPECT_EQ(h.step_end(1), "");
  EXPECT_EQ(h.step_end(2), "");
  EXPECT_EQ(h.train_end(), "");
}

}  // namespace console_logger_test
}  // namespace tessera
