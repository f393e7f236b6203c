// callback/health on a real small trainer: a planted NaN (a parameter poisoned for one step's
// forward and backward) triggers each policy; a planted loss spike is caught by the robust
// z-score; the hang watchdog's end-to-end test (a stalled process) is in the integration tests.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "callback_rig.hpp"
#include "parameter_poison.hpp"
#include "small_trainer.hpp"
#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/log.hpp"

namespace tessera {
namespace health_test {

using ::testing::internal::CaptureStderr;
using ::testing::internal::GetCapturedStderr;
using testing::TempDir;

std::string health_yaml(const std::string& config) {
  return "health: {component_key: callback, variant_key: health, config: " + config + "}\n";
}

struct PoisonedRun {
  TempDir dir;
  testing::Built run;
  core::TrainResult result;
  std::string log;
  std::vector<at::Tensor> after;  // weights at the end
};

bool all_finite(const std::vector<at::Tensor>& ws) {
  for (const auto& w : ws) {
    if (!w.isfinite().all().item<bool>()) return false;
  }
  return true;
}

std::vector<at::Tensor> weights_of(core::Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.model().parameters()) out.push_back(p.detach().clone());
  return out;
}

// Runs steps 1-2, then the poisoned step 3 and on to max_steps 5, through fit().
// The trainer's own guard (trainer.nonfinite) is off, so the health callback's policy alone acts.
std::unique_ptr<PoisonedRun> run_with_nan(const std::string& policy, bool checkpoints = false) {
  auto r = std::make_unique<PoisonedRun>();
  const std::string data = testing::uneven_token_file(r->dir);
  auto poison = std::make_shared<testing::ParameterPoison>(3, std::numeric_limits<double>::quiet_NaN());
  core::TrainerSettings settings = testing::settings(1, 4, 5);
  settings.nonfinite = "ignore";
  r->run = testing::make_trainer(testing::components_yaml(data) + health_yaml("{nonfinite: " + policy + "}"),
                                 settings, {poison}, {"health"}, r->dir.path().string());
  if (checkpoints) {
    core::CheckpointContext ck;
    ck.settings.at_end = false;
    ck.settings.export_at_end = false;
    ck.store = core::CheckpointStore(r->dir.file("checkpoints"), r->dir.file("exports"));
    r->run.trainer->enable_checkpoints(ck);
  }
  log::set_level(log::Level::info);
  CaptureStderr();
  r->result = r->run.trainer->fit();
  r->log = GetCapturedStderr();
  r->after = weights_of(*r->run.trainer);
  return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Health, WarnLetsANanStepThroughAndSaysSo) {
  auto r = run_with_nan("warn");
  EXPECT_TRUE(has(r->log, "health: non-finite loss")) << r->log;
  EXPECT_EQ(r->result.steps, 5);
  EXPECT_FALSE(all_finite(r->after)) << "the NaN update reached the weights, as warn allows";
}

TEST(Health, SkipStepKeepsTheWeightsFiniteAndTrainsOn) {
  auto r = run_with_nan("skip_step");
  EXPECT_TRUE(has(r->log, "skipping this optimizer step: health: non-finite loss at step 3")) << r->log;
  EXPECT_EQ(r->result.steps, 5);
  EXPECT_TRUE(all_finite(r->after));
  EXPECT_TRUE(std::isfinite(r->result.last_loss));
}

TEST(Health, StopEndsTheRunAfterTheNanStepWithoutApplyingIt) {
  auto r = run_with_nan("stop");
  EXPECT_EQ(r->result.steps, 3);
  EXPECT_TRUE(has(r->result.stop_reason, "health: non-finite loss at step 3")) << r->result.stop_reason;
  EXPECT_TRUE(all_finite(r->after));
}

TEST(Health, SaveAndStopWritesACleanCheckpointOfTheNanStep) {
  auto r = run_with_nan("save_and_stop", /*checkpoints=*/true);
  EXPECT_EQ(r->result.steps, 3);
  const auto folder = r->dir.path() / "checkpoints" / "step_00000003";
  ASSERT_TRUE(std::filesystem::is_directory(folder)) << r->log;
  const core::LoadedCheckpoint ck = core::read_checkpoint(folder.string(), 0);
  for (const auto& [name, t] : ck.model) EXPECT_TRUE(t.isfinite().all().item<bool>()) << name;
}

TEST(Health, ALossSpikeIsCaughtByTheRobustZScore) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  // The token embedding (the tied output layer) scaled 30x for step 9: logits explode.
  auto spike = std::make_shared<testing::ParameterPoison>(9, 30.0);
  auto run = testing::make_trainer(
      testing::components_yaml(data, "adamw", "lr: 0.001") +
          health_yaml("{loss_spike: skip_step, spike_min_history: 5, spike_window: 20}"),
      testing::settings(1, 4, 10), {spike}, {"health"}, dir.path().string());
  std::vector<bool> skipped;
  for (int i = 0; i < 10; ++i) {
    // step() leaves out on_step_end, which health does not need.
    skipped.push_back(run.trainer->step().skipped);
  }
  for (int i = 0; i < 10; ++i) EXPECT_EQ(skipped[static_cast<size_t>(i)], i == 8) << "step " << i + 1;
}

TEST(Health, ALastingShiftIsANewLevelAfterSpikeMaxConsecutiveSteps) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  // From step 6 on the loss stays high: skipping cannot undo a change the updates did not make.
  auto shift = std::make_shared<testing::ParameterPoison>(6, 30.0, /*restore=*/false);
  auto run = testing::make_trainer(
      testing::components_yaml(data, "adamw", "lr: 0.001") +
          health_yaml("{loss_spike: skip_step, spike_min_history: 4, spike_max_consecutive: 3}"),
      testing::settings(1, 4, 12), {shift}, {"health"}, dir.path().string());
  log::set_level(log::Level::info);
  CaptureStderr();
  std::vector<bool> skipped;
  for (int i = 0; i < 12; ++i) skipped.push_back(run.trainer->step().skipped);
  const std::string log = GetCapturedStderr();
  // Steps 6 and 7 are skipped as spikes; the third in a row (step 8) starts the new level.
  for (int i = 0; i < 12; ++i) EXPECT_EQ(skipped[static_cast<size_t>(i)], i == 5 || i == 6) << "step " << i + 1;
  EXPECT_NE(log.find("health: 3 loss spikes in a row: taking them as the new level"), std::string::npos) << log;
}

TEST(Health, ANonFiniteGradientAloneIsCaught) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  // A gradient of +inf on one parameter; the loss itself stays finite.
  class InfGradient final : public Callback {
   public:
    void on_micro_batch_end(CallbackContext& ctx, const MicroBatchEnd&) override {
      if (ctx.progress.step + 1 != 2) return;
      at::Tensor g = ctx.model.parameters().back().mutable_grad();
      g.fill_(std::numeric_limits<float>::infinity());
    }
  };
  core::TrainerSettings settings = testing::settings(1, 4, 3);
  settings.nonfinite = "ignore";  // the callback's policy alone acts
  auto run = testing::make_trainer(testing::components_yaml(data) + health_yaml("{nonfinite: skip_step}"), settings,
                                   {std::make_shared<InfGradient>()}, {"health"});
  log::set_level(log::Level::info);
  CaptureStderr();
  EXPECT_FALSE(run.trainer->step().skipped);
  EXPECT_TRUE(run.trainer->step().skipped);
  EXPECT_FALSE(run.trainer->step().skipped);
  EXPECT_TRUE(has(GetCapturedStderr(), "non-finite gradients")) ;
}

// The watchdog's status file says when it was written, to well within a second, so that another
// rank's watchdog reading it takes a live rank for live (a time rounded to 6 significant digits,
// as a stream writes a double by default, was thousands of seconds off).
TEST(Health, TheWatchdogsStatusFileSaysWhenItWasWrittenToTheSecond) {
  testing::CallbackRig rig("health", "{hang_timeout_s: 600}", /*rank=*/1, /*world_size=*/2);
  CallbackContext ctx = rig.context();
  rig.callback->on_train_begin(ctx);
  const std::filesystem::path status = std::filesystem::path(rig.run.run_dir) / "health" / "rank_1.txt";
  // The watchdog writes once a poll (a second here); wait for the first, however slow the machine.
  std::string where, written_text;
  for (int i = 0; i < 600 && written_text.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(status);
    std::getline(in, where);
    std::getline(in, written_text);
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  rig.callback->on_train_end(ctx);
  ASSERT_FALSE(written_text.empty()) << "no status written to " << status;
  EXPECT_EQ(where.rfind("before step 1 (last progress ", 0), 0u) << where;
  const double written = std::stod(written_text);
  // Written within the minute before now (a slow machine's poll), never after it.
  EXPECT_LE(written, now + 0.01) << written_text;
  EXPECT_GT(written, now - 60) << written_text << ": a live rank's status would read as " << now - written
                               << " s old";
}

}  // namespace health_test
}  // namespace tessera
