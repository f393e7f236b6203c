// callback/jsonl_metrics built through the real loader and factory and driven directly: one
// parseable JSON object per step with the step's metrics, null for NaN/Inf, rank 0 only.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace jsonl_metrics_test {

namespace fs = std::filesystem;

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config, std::int64_t rank = 0)
      : CallbackRig("jsonl_metrics", config, rank) {
  }

  std::shared_ptr<Callback>& metrics = callback;

  void begin() {
    CallbackContext ctx = context();
    metrics->on_train_begin(ctx);
  }
  void step_end(const StepMetrics& m) {
    progress.step = m.step;
    CallbackContext ctx = context();
    metrics->on_step_end(ctx, m);
  }
  void end() {
    CallbackContext ctx = context();
    metrics->on_train_end(ctx);
  }
};

StepMetrics metrics_of(std::int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 3.0 - 0.25 * static_cast<double>(step);
  m.grad_norm = 0.125 * static_cast<double>(step);
  m.lr = 6e-4;
  m.tokens = 512 * step;
  m.step_tokens = 512;
  m.target_tokens = 500;
  m.tokens_per_s = 1024.5;
  m.step_time_s = 0.5;
  m.elapsed_s = 0.5 * static_cast<double>(step);
  return m;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JsonlMetrics, WritesOneJsonObjectPerStep) {
  Harness h("{}");
  const std::string path = h.run.run_dir + "/metrics.jsonl";
  h.begin();
  for (std::int64_t step = 1; step <= 3; ++step) h.step_end(metrics_of(step));
  h.end();
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const nlohmann::json j = nlohmann::json::parse(lines[step - 1]);
    ASSERT_TRUE(j.is_object());
    const StepMetrics m = metrics_of(step);
    EXPECT_EQ(j.at("step").get<std::int64_t>(), step);
    EXPECT_DOUBLE_EQ(j.at("loss").get<double>(), m.loss);
    EXPECT_DOUBLE_EQ(j.at("grad_norm").get<double>(), m.grad_norm);
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), m.lr);
    EXPECT_EQ(j.at("tokens").get<std::int64_t>(), m.tokens);
    EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), m.tokens_per_s);
    EXPECT_DOUBLE_EQ(j.at("step_time_s").get<double>(), m.step_time_s);
    EXPECT_EQ(j.at("step_tokens").get<std::int64_t>(), 512);
    EXPECT_EQ(j.at("target_tokens").get<std::int64_t>(), 500);
    EXPECT_DOUBLE_EQ(j.at("elapsed_s").get<double>(), m.elapsed_s);
    EXPECT_EQ(j.at("skipped").get<bool>(), false);
  }
}

TEST(JsonlMetrics, NonFiniteValuesAreNullAndExtrasAreWritten) {
  Harness h("{}");
  h.begin();
  StepMetrics m = metrics_of(1);
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.skipped = true;
  m.extra["mfu"] = 0.25;
  m.extra["router_entropy"] = std::numeric_limits<double>::quiet_NaN();
  h.step_end(m);
  h.end();
  const auto lines = read_lines(h.run.run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);  // throws if NaN leaked into the text
  EXPECT_TRUE(j.at("loss").is_null());
  EXPECT_TRUE(j.at("grad_norm").is_null());
  EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 6e-4);
  EXPECT_TRUE(j.at("skipped").get<bool>());
  EXPECT_DOUBLE_EQ(j.at("mfu").get<double>(), 0.25);
  EXPECT_TRUE(j.at("router_entropy").is_null());
}

TEST(JsonlMetrics, EachLineIsOnDiskAfterItsStep) {
  Harness h("{}");  // flush_every: 1
  h.begin();
  h.step_end(metrics_of(1));
  EXPECT_EQ(read_lines(h.run.run_dir + "/metrics.jsonl").size(), 1u);
  h.step_end(metrics_of(2));
  EXPECT_EQ(read_lines(h.run.run_dir + "/metrics.jsonl").size(), 2u);
}

TEST(JsonlMetrics, FlushesOnException) {
  Harness h("{flush_every: 1000}");
  h.begin();
  h.step_end(metrics_of(1));
  h.step_end(metrics_of(2));
  CallbackContext ctx = h.context();
  h.metrics->on_exception(ctx, "boom");
  EXPECT_EQ(read_lines(h.run.run_dir + "/metrics.jsonl").size(), 2u);
}

TEST(JsonlMetrics, TrainBeginStartsAFreshFile) {
  Harness h("{}");
  fs::create_directories(h.run.run_dir);
  std::ofstream(h.run.run_dir + "/metrics.jsonl") << "{\"step\": 99}\n{\"step\": 100}\n";
  h.begin();
  h.step_end(metrics_of(1));
  h.end();
  const auto lines = read_lines(h.run.run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]).at("step").get<int>(), 1);
}

TEST(JsonlMetrics, AResumedRunKeepsLinesUpToItsStepAndAppends) {
  Harness h("{}");
  fs::create_directories(h.run.run_dir);
  // Steps 1-6 from a run that last saved at step 4 and died after step 6.
  {
    std::ofstream out(h.run.run_dir + "/metrics.jsonl");
    for (int s = 1; s <= 6; ++s) out << "{\"step\": " << s << "}\n";
  }
  h.progress.step = 4;  // resumed from the step-4 checkpoint
  h.begin();
  h.step_end(metrics_of(5));
  h.end();
  const auto lines = read_lines(h.run.run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(nlohmann::json::parse(lines[static_cast<size_t>(i)]).at("step").get<int>(), i + 1);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(lines[4]).at("loss").get<double>(), metrics_of(5).loss);
}

TEST(JsonlMetrics, RelativePathIsUnderTheRunDirAbsoluteIsKept) {
  {
    Harness h("{path: logs/train.jsonl}");
    h.begin();
    h.step_end(metrics_of(1));
    h.end();
    EXPECT_EQ(read_lines(h.run.run_dir + "/logs/train.jsonl").size(), 1u);
  }
  testing::TempDir elsewhere;
  const std::string absolute = elsewhere.file("abs/m.jsonl");
  Harness h("{path: " + absolute + "}");
  h.begin();
  h.step_end(metrics_of(1));
  h.end();
  EXPECT_EQ(read_lines(absolute).size(), 1u);
  EXPECT_FALSE(fs::exists(h.run.run_dir + "/metrics.jsonl"));
}

TEST(JsonlMetrics, OnlyRankZeroWrites) {
  Harness h("{}", /*rank=*/1);
  h.begin();
  h.step_end(metrics_of(1));
  h.end();
  EXPECT_FALSE(fs::exists(h.run.run_dir + "/metrics.jsonl"));
}

}  // namespace jsonl_metrics_test
}  // namespace tessera

namespace tessera {
namespace jsonl_metrics_test {

TEST(JsonlMetrics, WritesTheBreakdownMemoryMfuAndEtaWhenKnown) {
  Harness h("{}");
  h.begin();
  StepMetrics known = metrics_of(1);
  known.tokens_per_s_per_device = 512.25;
  known.mfu = 0.375;
  known.eta_s = 42.5;
  known.time_data_s = 0.125;
  known.time_forward_backward_s = 0.25;
  known.time_optimizer_s = 0.0625;
  known.time_communication_s = 0.03125;
  known.memory_in_use_bytes = 1000;
  known.memory_peak_bytes = 3000;
  known.memory_reserved_bytes = 4000;
  h.step_end(known);
  h.step_end(metrics_of(2));  // no peak FLOP/s and no limit: no mfu, no eta
  h.end();
  const auto lines = read_lines(h.run.run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  const nlohmann::json a = nlohmann::json::parse(lines[0]);
  EXPECT_DOUBLE_EQ(a.at("tokens_per_s_per_device").get<double>(), 512.25);
  EXPECT_DOUBLE_EQ(a.at("mfu").get<double>(), 0.375);
  EXPECT_DOUBLE_EQ(a.at("eta_s").get<double>(), 42.5);
  EXPECT_DOUBLE_EQ(a.at("time_data_s").get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(a.at("time_forward_backward_s").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(a.at("time_optimizer_s").get<double>(), 0.0625);
  EXPECT_DOUBLE_EQ(a.at("time_communication_s").get<double>(), 0.03125);
  EXPECT_EQ(a.at("memory_in_use_bytes").get<std::int64_t>(), 1000);
  EXPECT_EQ(a.at("memory_peak_bytes").get<std::int64_t>(), 3000);
  EXPECT_EQ(a.at("memory_reserved_bytes").get<std::int64_t>(), 4000);
  const nlohmann::json b = nlohmann::json::parse(lines[1]);
  EXPECT_FALSE(b.contains("mfu"));
  EXPECT_FALSE(b.contains("eta_s"));
}

TEST(JsonlMetrics, AnEvaluationIsOneLineMarkedEvalWithPrefixedValues) {
  Harness h("{}");
  h.begin();
  h.step_end(metrics_of(1));
  CallbackContext ctx = h.context();
  h.metrics->on_evaluation_end(ctx, EvalMetrics{1, "val", {{"loss", 2.5}, {"perplexity", 12.18}}});
  h.end();
  const auto lines = read_lines(h.run.run_dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  const nlohmann::json e = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(e.at("step").get<int>(), 1);
  EXPECT_EQ(e.at("eval").get<std::string>(), "val");
  EXPECT_DOUBLE_EQ(e.at("val/loss").get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(e.at("val/perplexity").get<double>(), 12.18);
  EXPECT_FALSE(e.contains("loss"));  // a reader of step lines is not misled
}

}  // namespace jsonl_metrics_test
}  // namespace tessera
