// callback/evaluation in a real small trainer: when it evaluates, that the validation loss is
// the summed loss over the fixed evaluation batches divided by their target tokens (recomputed
// by hand), that every evaluation sees the same batches, and that the result reaches the sinks.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <cmath>
#include <fstream>
#include <mutex>

#include <nlohmann/json.hpp>

#include "gloo_ranks.hpp"
#include "small_trainer.hpp"

namespace tessera {
namespace evaluation_test {

using testing::TempDir;

std::string evaluation_yaml(const std::string& val, const std::string& extra) {
  return "eval: {component_key: callback, variant_key: evaluation,\n"
         "       config: {data: {component_key: dataset, variant_key: tokens,\n"
         "                       config: {path: " + val + ", seq_len: 16, ignore_token: 0}},\n"
         "                loss: {instance_key: loss}, batches: 3, micro_batch_size: 2" + extra + "}}\n"
         "sink: {component_key: callback, variant_key: jsonl_metrics}\n";
}

std::vector<nlohmann::json> eval_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    auto row = nlohmann::json::parse(line);
    if (row.contains("eval")) out.push_back(row);
  }
  return out;
}

// The loss over the first `batches` micro-batches of a fresh dataset on `val`, by hand.
double hand_loss(Model& model, const std::string& val, int batches) {
  RunContext run;
  run.seed = 42;  // make_trainer's: the dataset's order derives from it
  auto parts = testing::build_components(
      "data: {component_key: dataset, variant_key: tokens, config: {path: " + val + ", seq_len: 16, ignore_token: 0}}\n"
      "loss: {component_key: loss, variant_key: cross_entropy}\n", run);
  auto data = testing::built<Dataset>(parts, "data");
  auto loss = testing::built<Loss>(parts, "loss");
  data->set_shard(0, 1);
  c10::NoGradGuard no_grad;
  model.eval();
  double sum = 0;
  std::int64_t targets = 0;
  for (int i = 0; i < batches; ++i) {
    Batch b = data->next_batch(2);
    sum += loss->compute(model.forward(b.input_ids), b.labels).sum.item<double>();
    targets += b.num_target_tokens;
  }
  model.train();
  return sum / static_cast<double>(targets);
}

TEST(Evaluation, EveryNStepsAndAtTheEndWithTheLossOfTheFixedBatches) {
  TempDir dir;
  const std::string train = testing::uneven_token_file(dir);
  const std::string val = train;  // same format; the dataset is rewound before each evaluation
  auto run = testing::make_trainer(testing::components_yaml(train) + evaluation_yaml(val, ", every: 2"),
                                   testing::settings(1, 2, 5), {}, {"eval", "sink"}, dir.path().string());
  run.trainer->fit();
  const auto lines = eval_lines(dir.file("metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);  // steps 2 and 4, and 5 at the end
  EXPECT_EQ(lines[0].at("step").get<int>(), 2);
  EXPECT_EQ(lines[1].at("step").get<int>(), 4);
  EXPECT_EQ(lines[2].at("step").get<int>(), 5);
  // The last evaluation ran on the final weights: recompute it by hand.
  const double expected = hand_loss(run.trainer->model(), val, 3);
  const double loss = lines[2].at("val/loss").get<double>();
  EXPECT_NEAR(loss, expected, 1e-6 * expected);
  EXPECT_NEAR(lines[2].at("val/perplexity").get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  EXPECT_EQ(lines[2].at("val/tokens").get<double>(), 3 * 2 * 16);
  // Training changed the weights between evaluations, and the same batches show it.
  EXPECT_NE(lines[0].at("val/loss").get<double>(), loss);
  // The model is back in training mode.
  EXPECT_TRUE(run.trainer->model().is_training());
}

TEST(Evaluation, TheSameWeightsGiveTheSameLossEveryTime) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  // A negligible learning rate: the weights barely change, so evaluations of the same batches
  // agree closely; different batches of this uneven data would differ by far more.
  auto run = testing::make_trainer(testing::components_yaml(data, "sgd", "lr: 1.0e-12") + evaluation_yaml(data, ", every: 1"),
                                   testing::settings(1, 2, 3), {}, {"eval", "sink"}, dir.path().string());
  run.trainer->fit();
  const auto lines = eval_lines(dir.file("metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);  // at_end adds none: step 3 was just evaluated
  const double first = lines[0].at("val/loss").get<double>();
  EXPECT_NEAR(lines[1].at("val/loss").get<double>(), first, 1e-7 * first);
  EXPECT_NEAR(lines[2].at("val/loss").get<double>(), first, 1e-7 * first);
}

// Keeps what an evaluation announced, as the trainer's dispatch would hand it to the sinks.
class Announcements final : public CallbackEvents {
 public:
  void evaluation_end(CallbackContext&, const EvalMetrics& metrics) override { seen.push_back(metrics); }
  std::vector<EvalMetrics> seen;
};

const char* kEvalModel =
    "model: {component_key: model, variant_key: gpt, config: {vocab_size: 32, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16}}\n";

// Two Gloo ranks each evaluate their shard; the result must be Σ loss / Σ target tokens over both
// shards' batches (computed here in one process), which on this unevenly padded data is not the
// mean of the two ranks' own losses.
TEST(Evaluation, TwoRanksReduceSummedLossAndTokens) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  const std::string eval = "eval: {component_key: callback, variant_key: evaluation, config: {every: 1, batches: 2,"
                           " micro_batch_size: 2, loss: {component_key: loss, variant_key: cross_entropy},"
                           " data: {component_key: dataset, variant_key: tokens, config: {path: " + data +
                           ", seq_len: 16, ignore_token: 0}}}}\n";
  std::mutex build;
  std::vector<double> announced(2, 0);
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    RunContext run;
    run.seed = 42;
    run.rank = r;
    run.world_size = 2;
    run.communicator = std::move(comm);
    core::BuiltComponents built;
    {
      std::lock_guard<std::mutex> lock(build);  // the same initial weights on both ranks
      core::seed_everything(42, "cpu");
      built = testing::build_components(std::string(kEvalModel) + eval, run);
    }
    auto model = testing::built<Model>(built, "model");
    auto callback = testing::built<Callback>(built, "eval");
    TrainProgress progress;
    TrainerControl control;
    Announcements sink;
    CallbackContext ctx{run, progress, *model, control, &sink};
    callback->on_train_begin(ctx);
    progress.step = 1;
    StepMetrics m;
    m.step = 1;
    callback->on_step_end(ctx, m);
    if (sink.seen.size() != 1) throw std::runtime_error("expected one announced evaluation");
    announced[static_cast<std::size_t>(r)] = sink.seen[0].values.at("loss");
  });
  ASSERT_EQ(errors, std::vector<std::string>(2, ""));

  // By hand: both shards' batches in one process, with the same weights.
  RunContext run;
  run.seed = 42;
  core::seed_everything(42, "cpu");
  auto built = testing::build_components(std::string(kEvalModel) + "loss: {component_key: loss, variant_key: cross_entropy}\n", run);
  auto model = testing::built<Model>(built, "model");
  auto loss = testing::built<Loss>(built, "loss");
  model->eval();
  c10::NoGradGuard no_grad;
  double sum = 0, tokens = 0, mean_of_means = 0;
  for (std::int64_t r = 0; r < 2; ++r) {
    auto shard = testing::build_components(
        "data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n", run);
    auto dataset = testing::built<Dataset>(shard, "data");
    dataset->set_shard(r, 2);
    double rank_sum = 0, rank_tokens = 0;
    for (int i = 0; i < 2; ++i) {
      Batch b = dataset->next_batch(2);
      rank_sum += loss->compute(model->forward(b.input_ids), b.labels).sum.item<double>();
      rank_tokens += static_cast<double>(b.num_target_tokens);
    }
    sum += rank_sum;
    tokens += rank_tokens;
    mean_of_means += rank_sum / rank_tokens / 2;
  }
  const double expected = sum / tokens;
  ASSERT_GT(std::abs(mean_of_means - expected), 1e-4 * expected) << "the data should tell the two apart";
  for (double value : announced) EXPECT_NEAR(value, expected, 1e-6 * expected);
}

}  // namespace evaluation_test
}  // namespace tessera
