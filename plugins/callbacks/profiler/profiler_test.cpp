// callback/profiler built through the real loader and factory and driven with the trainer's
// events around real forward and backward passes of a small gpt: the Chrome trace holds
// exactly the chosen window of steps, Kineto's trace has the ATen ops, the phases trace the
// step's phases, only chosen ranks write, and a run ending inside the window still writes. On a
// GPU (skipped elsewhere), the trace holds the kernels still running when the window closes.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/components/model.hpp"
#include "callback_rig.hpp"
#include "test_support.hpp"

namespace tessera {
namespace profiler_test {

namespace fs = std::filesystem;

struct Harness : testing::CallbackRig {
  explicit Harness(const std::string& config, std::int64_t rank = 0)
      : CallbackRig("profiler", config, rank, 2, "{vocab_size: 16, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 8}") {
    progress.max_steps = 6;
  }

  std::shared_ptr<Callback>& profiler = callback;
  c10::Device device{c10::kCPU};               // where the model runs and the batches are made
  std::function<void()> before_step_end;       // work of the step's end that the host only queues

  fs::path profiles() const { return fs::path(run.run_dir) / "profiles"; }

  void begin() {
    CallbackContext ctx = context();
    profiler->on_train_begin(ctx);
  }
  // One optimizer step of two micro-batches, with the events a trainer raises around it.
  void step(std::int64_t step) {
    progress.step = step - 1;
    CallbackContext ctx = context();
    profiler->on_step_begin(ctx);
    at::Tensor loss;
    for (std::int64_t i = 0; i < 2; ++i) {
      const at::Tensor ids = at::randint(16, {2, 8}, at::TensorOptions().dtype(at::kLong).device(device));
      loss = model->forward(ids).logsumexp(-1).mean();
      loss.backward();
      profiler->on_micro_batch_end(ctx, MicroBatchEnd{i, 2, loss.detach(), 16});
    }
    profiler->on_before_optimizer_step(ctx, BeforeOptimizerStep{loss.detach(), loss.detach()});
    model->zero_grad();
    progress.step = step;
    StepMetrics m;
    m.step = step;
    m.loss = loss.item<double>();
    if (before_step_end) before_step_end();
    profiler->on_step_end(ctx, m);
  }
  void end() {
    CallbackContext ctx = context();
    profiler->on_train_end(ctx);
  }
};

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), dir));
  }
  return files;
}

nlohmann::json read_trace(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::set<std::string> profiler_steps(const nlohmann::json& trace) {
  std::set<std::string> names;
  const std::regex pattern("ProfilerStep#\\d+");
  for (const auto& e : trace.at("traceEvents")) {
    if (e.contains("name") && e["name"].is_string() && std::regex_match(e["name"].get<std::string>(), pattern)) {
      names.insert(e["name"].get<std::string>());
    }
  }
  return names;
}

// The one complete event named `name`.
nlohmann::json event_named(const nlohmann::json& trace, const std::string& name) {
  nlohmann::json found;
  int count = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("name", "") == name && e.value("ph", "") == "X") {
      found = e;
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << name;
  return found;
}

bool within(const nlohmann::json& inner, const nlohmann::json& outer, double slack_us = 0) {
  const double begin = outer.at("ts").get<double>(), end = begin + outer.at("dur").get<double>();
  const double b = inner.at("ts").get<double>(), e = b + inner.at("dur").get<double>();
  return b >= begin - slack_us && e <= end + slack_us;
}

TEST(Profiler, PhasesTraceHoldsExactlyTheWindowAndTheStepPhases) {
  Harness h("{backend: phases, start_step: 3, steps: 2}");
  h.begin();
  for (std::int64_t s = 1; s <= 6; ++s) h.step(s);
  h.end();
  ASSERT_EQ(files_under(h.profiles()), std::vector<fs::path>{"rank_0/trace_steps_3-4.json"});
  const nlohmann::json trace = read_trace(h.profiles() / "rank_0/trace_steps_3-4.json");
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(profiler_steps(trace), (std::set<std::string>{"ProfilerStep#3", "ProfilerStep#4"}));

  for (const std::int64_t s : {3, 4}) {
    const nlohmann::json range = event_named(trace, "ProfilerStep#" + std::to_string(s));
    const nlohmann::json step = event_named(trace, "step " + std::to_string(s));
    EXPECT_EQ(step.at("pid"), 0);
    EXPECT_GT(step.at("dur").get<double>(), 0.0);
    EXPECT_EQ(step.at("ts"), range.at("ts"));
    EXPECT_EQ(step.at("dur"), range.at("dur"));
    // Each step's phases lie inside it, in order.
    int micro_batches = 0, optimizers = 0;
    double previous_end = step.at("ts").get<double>();
    for (const auto& e : trace.at("traceEvents")) {
      if (e.at("ph") != "X" || e.at("cat") != "phase" || e.at("args").at("step") != s) continue;
      const std::string name = e.at("name").get<std::string>();
      micro_batches += name.rfind("data + forward/backward (micro-batch ", 0) == 0;
      optimizers += name == "optimizer";
      EXPECT_TRUE(within(e, step)) << name;
      EXPECT_GE(e.at("ts").get<double>(), previous_end) << name;
      previous_end = e.at("ts").get<double>() + e.at("dur").get<double>();
    }
    EXPECT_EQ(micro_batches, 2) << "step " << s;
    EXPECT_EQ(optimizers, 1) << "step " << s;
  }
  EXPECT_EQ(event_named(trace, "step 3").at("args").at("step"), 3);
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    EXPECT_TRUE(name != "step 2" && name != "step 5") << name;
  }
}

TEST(Profiler, KinetoTraceHoldsExactlyTheWindowAndTheAtenOps) {
  std::unique_ptr<Harness> h;
  try {
    h = std::make_unique<Harness>("{backend: kineto, start_step: 3, steps: 2}");
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("Kineto is not available") == std::string::npos) throw;
    GTEST_SKIP() << e.what();
  }
  h->begin();
  for (std::int64_t s = 1; s <= 6; ++s) h->step(s);
  h->end();
  ASSERT_EQ(files_under(h->profiles()), std::vector<fs::path>{"rank_0/trace_steps_3-4.json"});
  const nlohmann::json trace = read_trace(h->profiles() / "rank_0/trace_steps_3-4.json");
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(profiler_steps(trace), (std::set<std::string>{"ProfilerStep#3", "ProfilerStep#4"}));

  const nlohmann::json step3 = event_named(trace, "ProfilerStep#3");
  const nlohmann::json step4 = event_named(trace, "ProfilerStep#4");
  std::set<std::string> ops;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    if (name.rfind("aten::", 0) != 0 || e.value("ph", "") != "X") continue;
    ops.insert(name);
    // Every recorded op ran inside one of the two steps (Kineto's timestamps are in µs with
    // three decimals; allow a microsecond of rounding).
    EXPECT_TRUE(within(e, step3, 1.0) || within(e, step4, 1.0)) << name << " at " << e.at("ts");
  }
  EXPECT_TRUE(ops.count("aten::mm") || ops.count("aten::addmm") || ops.count("aten::matmul"))
      << "no matrix multiply among " << ops.size() << " ops";
}

// The window's last step ends with GPU work the host has only queued (ten 4096² matrix products,
// tens of milliseconds on any GPU): Kineto keeps only kernels that finished before it stops, so
// the profiler must wait for the device first. Every kernel launched there is in the trace.
TEST(Profiler, KinetoOnCudaHoldsTheKernelsStillRunningWhenTheWindowCloses) {
  if (!at::globalContext().hasCUDA() || c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount() == 0) {
    GTEST_SKIP() << "no CUDA GPU on this machine: this test runs on a GPU machine only";
  }
  Harness h("{backend: kineto, start_step: 2, steps: 1}");
  h.device = c10::Device("cuda:0");
  h.run.device = "cuda:0";
  h.model->to(h.device);
  h.before_step_end = [&] {
    RECORD_USER_SCOPE("queued_tail");
    const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(h.device));
    std::vector<at::Tensor> products;
    for (int i = 0; i < 10; ++i) products.push_back(at::mm(a, a));
  };
  h.begin();
  for (std::int64_t s = 1; s <= 3; ++s) h.step(s);
  h.end();
  ASSERT_EQ(files_under(h.profiles()), std::vector<fs::path>{"rank_0/trace_steps_2-2.json"});
  const nlohmann::json trace = read_trace(h.profiles() / "rank_0/trace_steps_2-2.json");
  // The host's range (on a GPU Kineto adds a gpu_user_annotation of the same name).
  nlohmann::json tail;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("name", "") == "queued_tail" && e.value("cat", "") == "user_annotation") tail = e;
  }
  ASSERT_FALSE(tail.is_null()) << "the queued_tail range is in the trace";
  std::set<std::int64_t> launched, ran;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || !e.contains("args") || !e["args"].contains("correlation")) continue;
    const std::string category = e.value("cat", ""), name = e.value("name", "");
    const auto correlation = e["args"]["correlation"].get<std::int64_t>();
    if ((category == "cuda_runtime" || category == "cuda_driver") && name.find("Launch") != std::string::npos &&
        within(e, tail, 1.0)) {
      launched.insert(correlation);
    }
    if (category == "kernel") ran.insert(correlation);
  }
  EXPECT_GE(launched.size(), 10u) << "the ten products' launches are in the trace";
  for (const std::int64_t c : launched) EXPECT_TRUE(ran.count(c)) << "kernel of launch " << c << " missing";
}

TEST(Profiler, OnlyChosenRanksWrite) {
  {
    Harness h("{backend: phases, start_step: 3, steps: 2, ranks: [1]}", /*rank=*/0);
    h.begin();
    for (std::int64_t s = 1; s <= 6; ++s) h.step(s);
    h.end();
    EXPECT_FALSE(fs::exists(h.profiles()));
  }
  Harness h("{backend: phases, start_step: 3, steps: 2, ranks: [1], dir: traces}", /*rank=*/1);
  h.begin();
  for (std::int64_t s = 1; s <= 6; ++s) h.step(s);
  h.end();
  const fs::path traces = fs::path(h.run.run_dir) / "traces";
  ASSERT_EQ(files_under(traces), std::vector<fs::path>{"rank_1/trace_steps_3-4.json"});
  const nlohmann::json trace = read_trace(traces / "rank_1/trace_steps_3-4.json");
  EXPECT_EQ(event_named(trace, "step 3").at("pid"), 1);
}

TEST(Profiler, TrainingThatEndsInsideTheWindowWritesWhatWasRecorded) {
  Harness h("{start_step: 3, steps: 5}");  // backend auto: Kineto where this LibTorch has it
  h.begin();
  for (std::int64_t s = 1; s <= 4; ++s) h.step(s);
  EXPECT_FALSE(fs::exists(h.profiles()));  // nothing before the window closes
  h.end();
  ASSERT_EQ(files_under(h.profiles()), std::vector<fs::path>{"rank_0/trace_steps_3-4.json"});
  const nlohmann::json trace = read_trace(h.profiles() / "rank_0/trace_steps_3-4.json");
  EXPECT_EQ(profiler_steps(trace), (std::set<std::string>{"ProfilerStep#3", "ProfilerStep#4"}));
}

}  // namespace profiler_test
}  // namespace tessera
