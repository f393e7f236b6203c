// The loop's arithmetic and control flow on the real plugins at small sizes.
#include "tessera/core/train/trainer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/process/stop_signal.hpp"
#include "tessera/core/run/training_run.hpp"
#include "small_trainer.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace trainer_test {

using testing::TempDir;
using testing::Built;
using testing::components_yaml;
using testing::make_trainer;
using testing::settings;
using testing::uneven_token_file;

std::vector<at::Tensor> weights(Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.model().parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i] - b[i]).abs().max().item<double>();
    EXPECT_LE(diff, tol) << "parameter " << i;
  }
}

void check_accumulation_matches_big_batch(const std::string& optimizer, const std::string& config) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  auto accumulated = make_trainer(components_yaml(data, optimizer, config), settings(4, 2, 3));
  auto big = make_trainer(components_yaml(data, optimizer, config), settings(1, 8, 3));
  expect_close(weights(*accumulated.trainer), weights(*big.trainer), 0.0);  // same init

  for (int step = 0; step < 3; ++step) {
    StepMetrics a = accumulated.trainer->step();
    StepMetrics b = big.trainer->step();
    EXPECT_EQ(a.target_tokens, b.target_tokens);
    EXPECT_EQ(a.step_tokens, 8 * 16);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * b.grad_norm) << "step " << step;
  }
  expect_close(weights(*accumulated.trainer), weights(*big.trainer), 2e-5);
}

TEST(Trainer, AccumulationEqualsOneBigBatchWithSgd) { check_accumulation_matches_big_batch("sgd", "lr: 0.5"); }

TEST(Trainer, AccumulationEqualsOneBigBatchWithAdamW) {
  check_accumulation_matches_big_batch("adamw", "lr: 0.01, weight_decay: 0.1");
}

TEST(Trainer, LossIsNormalisedByTheStepsTargetTokens) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  auto run = make_trainer(components_yaml(data), settings(4, 2));
  // Recompute the loss by hand from the same four micro-batches on an identical dataset.
  auto reference = make_trainer(components_yaml(data), settings(4, 2));
  auto dataset = testing::built<Dataset>(reference.components, "train_data");
  auto loss = testing::built<Loss>(reference.components, "loss");
  dataset->set_shard(0, 1);
  double sum = 0, mean_of_means = 0;
  std::int64_t count = 0;
  std::vector<std::int64_t> counts;
  for (int i = 0; i < 4; ++i) {
    Batch b = dataset->next_batch(2);
    LossSum l = loss->compute(reference.trainer->model().forward(b.input_ids), b.labels);
    sum += l.sum.item<double>();
    count += l.count.item<std::int64_t>();
    counts.push_back(b.num_target_tokens);
    mean_of_means += l.sum.item<double>() / l.count.item<double>() / 4;
  }
  ASSERT_NE(counts[0], counts[1]) << "test data should give uneven micro-batches";
  StepMetrics m = run.trainer->step();
  EXPECT_EQ(m.target_tokens, count);
  EXPECT_NEAR(m.loss, sum / count, 1e-5);
  EXPECT_GT(std::abs(m.loss - mean_of_means), 1e-4) << "a mean of means would be wrong here";
}

TEST(Trainer, ClipsByTheGlobalNormAndReportsThePreClipNorm) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  TrainerSettings s = settings(1, 4);
  s.clip_grad_norm = 0.01;
  auto run = make_trainer(components_yaml(data, "sgd", "lr: 1.0"), s);
  auto before = weights(*run.trainer);
  StepMetrics m = run.trainer->step();
  auto after = weights(*run.trainer);
  double squared = 0;
  for (size_t i = 0; i < before.size(); ++i) squared += (after[i] - before[i]).pow(2).sum().item<double>();
  // With plain SGD at lr 1 the update is the clipped gradient: its norm is the clip value.
  EXPECT_GT(m.grad_norm, 0.01);
  EXPECT_NEAR(std::sqrt(squared), 0.01, 1e-5);
}

// A test's own callback: records events and can ask the loop for things.
struct Recorder : Callback {
  std::vector<std::string> events;
  std::int64_t stop_at = 0, skip_at = 0, signal_at = 0;
  void on_train_begin(CallbackContext&) override { events.push_back("begin"); }
  void on_step_begin(CallbackContext& c) override { events.push_back("step_begin " + std::to_string(c.progress.step + 1)); }
  void on_before_optimizer_step(CallbackContext& c, const BeforeOptimizerStep&) override {
    events.push_back("before_optimizer");
    if (c.progress.step + 1 == skip_at) c.control.request_skip_step("test");
  }
  void on_step_end(CallbackContext& c, const StepMetrics& m) override {
    events.push_back("step_end " + std::to_string(m.step) + (m.skipped ? " skipped" : ""));
    if (m.step == stop_at) c.control.request_stop("test asked");
    if (m.step == signal_at) std::raise(SIGTERM);
  }
  void on_train_end(CallbackContext&) override { events.push_back("end"); }
};

TEST(Trainer, CallsCallbacksInOrderAndHonoursStopAndSkip) {
  TempDir dir;
  auto recorder = std::make_shared<Recorder>();
  recorder->stop_at = 2;
  recorder->skip_at = 1;
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), settings(1, 2, 10), {recorder});
  auto before = weights(*run.trainer);
  TrainResult r = run.trainer->fit();
  EXPECT_EQ(r.steps, 2);
  EXPECT_NE(r.stop_reason.find("test asked"), std::string::npos) << r.stop_reason;
  const std::vector<std::string> expected = {"begin", "step_begin 1", "before_optimizer", "step_end 1 skipped",
                                             "step_begin 2", "before_optimizer", "step_end 2", "end"};
  EXPECT_EQ(recorder->events, expected);
}

TEST(Trainer, SkippedStepLeavesWeightsUnchanged) {
  TempDir dir;
  auto recorder = std::make_shared<Recorder>();
  recorder->skip_at = 1;
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), settings(1, 2, 1), {recorder});
  auto before = weights(*run.trainer);
  run.trainer->fit();
  expect_close(weights(*run.trainer), before, 0.0);
}

TEST(Trainer, StopsAtMaxTokens) {
  TempDir dir;
  TrainerSettings s = settings(2, 2, 0);
  s.max_tokens = 200;  // 64 input tokens a step: stops after the 4th step (256 >= 200)
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), s);
  TrainResult r = run.trainer->fit();
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.tokens, 256);
  EXPECT_NE(r.stop_reason.find("max_tokens"), std::string::npos);
}

// max_epochs stops at the end of the data: once the samples read reach the dataset's count.
TEST(Trainer, StopsAtTheEndOfTheDataWithMaxEpochs) {
  TempDir dir;
  TrainerSettings s = settings(2, 2, 0);  // 4 samples a step
  s.max_epochs = 1;
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), s);
  TrainResult r = run.trainer->fit();
  const std::int64_t samples = run.trainer->progress().samples;
  // The uneven file has a number of windows that 4 need not divide: the step that reaches it ends the run.
  auto data = testing::built<Dataset>(run.components, "train_data");
  EXPECT_GE(samples, data->num_samples());
  EXPECT_LT(samples - 4, data->num_samples());
  EXPECT_NE(r.stop_reason.find("end of the data"), std::string::npos) << r.stop_reason;
}

TEST(Trainer, SigtermStopsCleanlyAfterTheCurrentStep) {
  TempDir dir;
  install_stop_signal_handlers();
  auto recorder = std::make_shared<Recorder>();
  recorder->signal_at = 3;
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), settings(1, 2, 100), {recorder});
  TrainResult r = run.trainer->fit();
  reset_stop_signal();
  std::signal(SIGTERM, SIG_DFL);
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.stop_reason, "received SIGTERM");
  EXPECT_EQ(recorder->events.back(), "end");
}

TEST(Trainer, SameSeedGivesTheSameLosses) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  auto a = make_trainer(components_yaml(data, "adamw", "lr: 0.01"), settings(2, 2));
  std::vector<double> first;
  for (int i = 0; i < 3; ++i) first.push_back(a.trainer->step().loss);
  auto b = make_trainer(components_yaml(data, "adamw", "lr: 0.01"), settings(2, 2));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.trainer->step().loss, first[i]) << "step " << i;
}

// trainer.prefetch: the training dataset is read ahead by the trainer's reader thread (its own
// position runs `prefetch` micro-batches ahead), while the trainer's state names the first
// micro-batch it has not used. Without prefetch the dataset is where the trainer is.
TEST(Trainer, PrefetchReadsAheadWhileTheStateStaysAtTheNextUnusedBatch) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  auto position = [](const StateDict& state) { return state.at("position").item<std::int64_t>(); };
  for (const std::int64_t prefetch : {0, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    TrainerSettings s = settings(1, 2, 5);
    s.prefetch = prefetch;
    // The reader fills its queue of `prefetch` more in microseconds; then the trainer (and with
    // it the reader thread) goes, so the dataset's own position is read with no thread running.
    // A loaded machine may not have run the reader yet: each try waits longer.
    std::int64_t read = -1;
    for (const int wait_ms : {200, 2000, 20000}) {
      auto b = make_trainer(components_yaml(data), s);
      const auto inner = testing::built<Dataset>(b.components, "train_data");
      b.trainer->step();
      EXPECT_EQ(position(b.trainer->capture().data), 2);  // one micro-batch of 2 samples used
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      b.trainer.reset();
      read = position(inner->state_dict());
      if (read == 2 + 2 * prefetch) break;
    }
    EXPECT_EQ(read, 2 + 2 * prefetch);
  }
}

TEST(Trainer, CheckpointsNeedAFolderFromTheStore) {
  // A CheckpointContext without its store would write into the working directory.
  TempDir dir;
  auto run = make_trainer(components_yaml(uneven_token_file(dir)), settings(1, 2));
  EXPECT_THROW(run.trainer->enable_checkpoints(core::CheckpointContext{}), Error);
}

// A trainer built in code gets the same refusal as a spec: a CUDA graph needs a CUDA device.
TEST(Trainer, CudaGraphNeedsACudaDevice) {
  TempDir dir;
  TrainerSettings graphed = settings(1, 2);
  graphed.cuda_graph = true;
  try {
    make_trainer(components_yaml(uneven_token_file(dir)), graphed);
    ADD_FAILURE() << "a CPU trainer accepted trainer.cuda_graph";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.cuda_graph: needs a CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace trainer_test
}  // namespace tessera::core
