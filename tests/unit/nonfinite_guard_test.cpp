// trainer.nonfinite: a step whose loss or global gradient norm is NaN/Inf leaves the weights and
// the optimizer state as they were (skip, the default), ends the run after saving (stop, or too
// many in a row), or is applied (ignore); on several ranks every rank decides alike.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "gloo_ranks.hpp"
#include "parameter_poison.hpp"
#include "small_trainer.hpp"
#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/error.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace nonfinite_guard_test {

using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string adamw_yaml(const std::string& data) {
  return testing::components_yaml(data, "adamw", "lr: 0.01, weight_decay: 0.1");
}

StateDict weights_of(Trainer& t) {
  StateDict out;
  for (const auto& item : t.model().named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

bool all_finite(const StateDict& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!t.isfinite().all().item<bool>()) return false;
  }
  return true;
}

void expect_identical(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(t.equal(b.at(name))) << name;
}

// Step 3's gradients are poisoned: the step is skipped, leaving every bit of the weights and the
// optimizer state, and the next step trains on.
void expect_poisoned_step_skipped(const std::string& optimizer_config, bool skips_on_device) {
  TempDir dir;
  auto poison = std::make_shared<testing::ParameterPoison>(3, kNaN);
  TrainerSettings settings = testing::settings(1, 4, 5);
  EXPECT_EQ(settings.nonfinite, "skip");
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir), "adamw", optimizer_config),
                                   settings, {poison});
  Trainer& trainer = *run.trainer;
  auto optimizer = testing::built<Optimizer>(run.components, "optimizer");
  EXPECT_EQ(optimizer->can_skip_on_device(), skips_on_device);
  trainer.step();
  trainer.step();
  const StateDict weights = weights_of(trainer);
  const StateDict state = optimizer->state_dict();

  const StepMetrics poisoned = trainer.step();
  // Where the optimizer skips on the device, the step did not wait for its flag: it is judged
  // (counted, logged) at the next step. Reading `skipped` reads the flag's copy.
  EXPECT_EQ(poisoned.extra.count("nonfinite_steps"), skips_on_device ? 0u : 1u);
  EXPECT_TRUE(poisoned.skipped);
  EXPECT_TRUE(std::isnan(poisoned.loss));
  expect_identical(weights_of(trainer), weights);
  expect_identical(optimizer->state_dict(), state);

  const StepMetrics next = trainer.step();  // healthy again: trains on
  EXPECT_EQ(next.extra.at("nonfinite_steps"), 1.0);
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_FALSE(weights_of(trainer).at("wte.weight").equal(weights.at("wte.weight")));
  EXPECT_TRUE(all_finite(weights_of(trainer)));
}

// The default AdamW (fused) gets the flag on the device and the update is launched at once.
TEST(NonfiniteGuard, SkipIsTheDefaultAndLeavesWeightsAndOptimizerStateUntouched) {
  expect_poisoned_step_skipped("lr: 0.01, weight_decay: 0.1", /*skips_on_device=*/true);
}

// An optimizer that cannot skip on the device: the trainer reads the flag first and does not
// call it.
TEST(NonfiniteGuard, AnOptimizerThatCannotSkipOnTheDeviceIsNotCalled) {
  expect_poisoned_step_skipped("lr: 0.01, weight_decay: 0.1, implementation: foreach", /*skips_on_device=*/false);
}

TEST(NonfiniteGuard, IgnoreAppliesTheNonFiniteUpdate) {
  TempDir dir;
  auto poison = std::make_shared<testing::ParameterPoison>(2, kNaN);
  TrainerSettings settings = testing::settings(1, 4, 3);
  settings.nonfinite = "ignore";
  auto run = testing::make_trainer(adamw_yaml(testing::uneven_token_file(dir)), settings, {poison});
  run.trainer->fit();
  EXPECT_FALSE(all_finite(weights_of(*run.trainer)));
}

// Fused AdamW skips step 3 on the device and nobody waits for the flag: step 4 judges it, applies
// no update either, and the run ends after it, saving the weights of step 2. An optimizer without
// a device skip (foreach) is judged in step 3 itself.
void expect_stop_saves_the_last_good_state(const std::string& optimizer_config, std::int64_t last_step) {
  TempDir dir;
  auto poison = std::make_shared<testing::ParameterPoison>(3, kNaN);
  TrainerSettings settings = testing::settings(1, 4, 10);
  settings.nonfinite = "stop";
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir), "adamw", optimizer_config),
                                   settings, {poison});
  run.trainer->step();
  run.trainer->step();
  const StateDict good = weights_of(*run.trainer);
  CheckpointContext ck;
  ck.settings.at_end = false;
  ck.settings.export_at_end = false;
  ck.store = CheckpointStore(dir.file("checkpoints"), dir.file("exports"));
  run.trainer->enable_checkpoints(ck);
  try {
    run.trainer->fit();
    FAIL() << "a non-finite step with nonfinite: stop must end the run with an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 3 has a non-finite loss"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("trainer.nonfinite is stop"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run.trainer->progress().step, last_step);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(last_step));
  const auto folder = std::filesystem::path(dir.file("checkpoints")) / name;
  ASSERT_TRUE(std::filesystem::is_directory(folder));
  const LoadedCheckpoint saved = read_checkpoint(folder.string(), 0);
  expect_identical(saved.model, good);
  expect_identical(weights_of(*run.trainer), good);
}

TEST(NonfiniteGuard, StopSavesTheLastGoodStateAndFailsTheRun) {
  expect_stop_saves_the_last_good_state("lr: 0.01, weight_decay: 0.1", 4);
}

TEST(NonfiniteGuard, StopWithAnOptimizerThatCannotSkipOnTheDeviceEndsAtTheStepItself) {
  expect_stop_saves_the_last_good_state("lr: 0.01, weight_decay: 0.1, implementation: foreach", 3);
}

TEST(NonfiniteGuard, TooManyNonFiniteStepsInARowEndTheRun) {
  TempDir dir;
  // From step 2 on, the first parameter stays NaN: every later step is non-finite.
  auto poison = std::make_shared<testing::ParameterPoison>(2, kNaN, /*restore=*/false);
  TrainerSettings settings = testing::settings(1, 4, 50);
  settings.nonfinite_max_consecutive = 3;
  auto run = testing::make_trainer(adamw_yaml(testing::uneven_token_file(dir)), settings, {poison});
  try {
    run.trainer->fit();
    FAIL() << "three non-finite steps in a row must end the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 4 has a non-finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 non-finite steps in a row"), std::string::npos) << e.what();
  }
  // Steps 2 to 4 are non-finite; fused AdamW's flag of step 4 is judged in step 5, which applies
  // no update and is the last.
  EXPECT_EQ(run.trainer->progress().step, 5);
}

// Throws from on_step_begin of step `at`: the step fails before its skip decision.
class FailAtStepBegin final : public Callback {
 public:
  explicit FailAtStepBegin(std::int64_t at) : at_(at) {}
  void on_step_begin(CallbackContext& ctx) override {
    if (ctx.progress.step + 1 == at_) throw std::runtime_error("planted failure");
  }

 private:
  std::int64_t at_;
};

// Fused AdamW leaves step 3's flag to be judged at step 4's decision; step 4 fails before it.
// The run's error is step 4's, and step 3 is still reported as non-finite.
TEST(NonfiniteGuard, AStepFailingBeforeItsDecisionStillReportsTheNonFiniteStepBefore) {
  TempDir dir;
  auto poison = std::make_shared<testing::ParameterPoison>(3, kNaN);
  auto failure = std::make_shared<FailAtStepBegin>(4);
  auto run = testing::make_trainer(adamw_yaml(testing::uneven_token_file(dir)), testing::settings(1, 4, 10),
                                   {poison, failure});
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(run.trainer->fit(), std::exception);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("step 3 has a non-finite loss"), std::string::npos) << log;
}

// The NaN is planted on rank 1 only: both ranks skip that step (under ddp the reduced loss and
// gradient norm are NaN on both; the trainer also agrees on the flag), so the replicas stay
// identical and finite.
TEST(NonfiniteGuard, EveryRankSkipsTheSameStep) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  const std::string yaml =
      adamw_yaml(data) + "parallel: {component_key: parallel, variant_key: ddp, config: {bucket_mb: 0.005}}\n";
  std::vector<std::vector<bool>> skipped(2);
  std::vector<StateDict> final_weights(2);
  std::mutex build_mutex;
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    RunContext context;
    context.seed = 42;
    context.rank = r;
    context.world_size = 2;
    context.communicator = comm;
    BuiltComponents built;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      seed_everything(context.seed, "cpu");
      built = testing::build_components(yaml, context);
    }
    TrainerParts parts = testing::trainer_parts(built);
    if (r == 1) parts.callbacks.push_back(std::make_shared<testing::ParameterPoison>(2, kNaN));
    Trainer trainer(std::move(parts), testing::settings(1, 2, 3), context);
    for (int s = 0; s < 3; ++s) skipped[static_cast<std::size_t>(r)].push_back(trainer.step().skipped);
    final_weights[static_cast<std::size_t>(r)] = weights_of(trainer);
  });
  ASSERT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(skipped[0], (std::vector<bool>{false, true, false}));
  EXPECT_EQ(skipped[1], skipped[0]);
  EXPECT_TRUE(all_finite(final_weights[0]));
  expect_identical(final_weights[0], final_weights[1]);
}

}  // namespace nonfinite_guard_test
}  // namespace tessera::core
