// callback/moe_monitor with the real model/gpt_moe: routing forced onto one expert, balanced
// routing, sums over a window of steps, two Gloo ranks reduced into one view, the error for a
// model without routers, and the metrics inside the real trainer.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "tessera/components/callback.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "gloo_ranks.hpp"
#include "test_support.hpp"

namespace tessera {
namespace moe_monitor_test {

constexpr std::int64_t kExperts = 4;

struct Monitored {
  core::BuiltComponents components;
  std::shared_ptr<Model> model;
  std::shared_ptr<Callback> monitor;
  RunContext run;
  TrainProgress progress;
  TrainerControl control;

  Monitored(const std::string& model_config, const std::string& monitor_config = "{}",
            std::shared_ptr<Communicator> comm = core::make_local_communicator()) {
    run.communicator = comm;
    run.rank = comm->rank();
    run.world_size = comm->world_size();
    static std::mutex building;  // ranks in threads build one at a time (the global generator)
    std::lock_guard<std::mutex> lock(building);
    core::seed_everything(7, "cpu");
    components = testing::build_components(
        "model: {component_key: model, variant_key: gpt_moe, config: {vocab_size: 16, n_layer: 1, n_head: 1, "
        "n_embd: 8, max_seq_len: 8, num_experts: 4, " + model_config + "}}\n"
        "monitor: {component_key: callback, variant_key: moe_monitor, config: " + monitor_config + "}\n",
        run);
    model = testing::built<Model>(components, "model");
    monitor = testing::built<Callback>(components, "monitor");
  }

  CallbackContext context() { return CallbackContext{run, progress, *model, control}; }

  // Block 0's pre-MoE LayerNorm outputs one constant vector c for every token, and the router
  // gives `expert` the largest logit for c: all tokens go there.
  void force_expert(std::int64_t expert) {
    c10::NoGradGuard no_grad;
    auto params = model->named_parameters();
    params["h.0.ln_2.weight"].zero_();
    params["h.0.ln_2.bias"].fill_(1.0);
    at::Tensor router = params["h.0.moe.router.weight"];
    router.zero_();
    router[expert].fill_(0.5);
  }

  std::map<std::string, double> collect(std::int64_t step) {
    StepMetrics m;
    m.step = step;
    CallbackContext ctx = context();
    monitor->on_collect_metrics(ctx, m);
    return m.extra;
  }
};

at::Tensor tokens(std::int64_t batch = 2) { return at::arange(batch * 8, at::kLong).remainder(16).view({batch, 8}); }

TEST(MoeMonitor, RoutingForcedOntoOneExpertShowsMaxViolationEMinusOne) {
  Monitored m("top_k: 1");
  CallbackContext ctx = m.context();
  m.monitor->on_train_begin(ctx);
  m.force_expert(2);
  m.model->forward(tokens());
  const auto extra = m.collect(1);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/maxvio"), kExperts - 1);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/dead_experts"), kExperts - 1);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/expert2_fraction"), 1.0);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/expert0_fraction"), 0.0);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/dropped_fraction"), 0.0);
  EXPECT_DOUBLE_EQ(extra.at("moe/maxvio"), kExperts - 1);
  EXPECT_DOUBLE_EQ(extra.at("moe/dead_experts"), kExperts - 1);
  // Router logits [0, 0, 4, 0] for every token (c = ones(8), row 2 = 0.5): entropy, z-loss and
  // the balance loss E * 1 * P_2 in closed form.
  const double p = std::exp(4.0) / (std::exp(4.0) + 3), q = 1 / (std::exp(4.0) + 3);
  EXPECT_NEAR(extra.at("moe/layer0/entropy"), -(p * std::log(p) + 3 * q * std::log(q)), 1e-5);
  EXPECT_NEAR(extra.at("moe/z_loss"), std::pow(std::log(std::exp(4.0) + 3), 2), 1e-4);
  EXPECT_NEAR(extra.at("moe/aux_loss"), kExperts * p, 1e-5);
}

TEST(MoeMonitor, CapacityDropsShowAsDroppedFraction) {
  Monitored m("top_k: 1, capacity_factor: 1.0");
  m.force_expert(0);
  m.model->forward(tokens());  // 16 tokens on expert 0, capacity ceil(16 / 4) = 4
  EXPECT_DOUBLE_EQ(m.collect(1).at("moe/layer0/dropped_fraction"), 12.0 / 16.0);
}

TEST(MoeMonitor, BalancedRoutingShowsNoViolation) {
  // top_k = E: every token goes to every expert, a perfectly even load.
  Monitored m("top_k: 4");
  m.model->forward(tokens());
  const auto extra = m.collect(1);
  EXPECT_NEAR(extra.at("moe/layer0/maxvio"), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/dead_experts"), 0);
  for (int e = 0; e < kExperts; ++e) EXPECT_DOUBLE_EQ(extra.at("moe/layer0/expert" + std::to_string(e) + "_fraction"), 0.25);
  // Random init: the router is near uniform, so the entropy is near log(E).
  EXPECT_NEAR(extra.at("moe/layer0/entropy"), std::log(4.0), 0.05);
}

TEST(MoeMonitor, SumsTheWindowBetweenCollections) {
  Monitored m("top_k: 1", "{every: 2, per_expert: false}");
  m.force_expert(0);
  m.model->forward(tokens());
  EXPECT_TRUE(m.collect(1).empty());  // not a collection step: statistics stay in the model
  m.force_expert(1);
  m.model->forward(tokens());
  const auto extra = m.collect(2);
  // Two experts with half the load each: max / mean - 1 = 0.5 / 0.25 - 1.
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/maxvio"), 1.0);
  EXPECT_DOUBLE_EQ(extra.at("moe/layer0/dead_experts"), 2);
  EXPECT_EQ(extra.count("moe/layer0/expert0_fraction"), 0u);  // per_expert: false
}

TEST(MoeMonitor, AggregatesAcrossTwoGlooRanks) {
  std::vector<std::map<std::string, double>> seen(2);
  const std::vector<std::string> errors = testing::run_on_gloo_ranks(2, [&](std::int64_t r, std::shared_ptr<Communicator> comm) {
    Monitored m("top_k: 1", "{}", std::move(comm));
    m.force_expert(r);  // rank 0 routes everything to expert 0, rank 1 to expert 1
    m.model->forward(tokens());
    seen[static_cast<std::size_t>(r)] = m.collect(1);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(errors[r], "");
    EXPECT_DOUBLE_EQ(seen[r].at("moe/layer0/expert0_fraction"), 0.5);
    EXPECT_DOUBLE_EQ(seen[r].at("moe/layer0/expert1_fraction"), 0.5);
    EXPECT_DOUBLE_EQ(seen[r].at("moe/layer0/maxvio"), kExperts / 2.0 - 1);
    EXPECT_DOUBLE_EQ(seen[r].at("moe/dead_experts"), kExperts - 2);
  }
}

// A model without routers (gpt), or one that could have them but has none (a dense llama).
TEST(MoeMonitor, AModelWithoutRoutersIsAnErrorAtTrainBegin) {
  RunContext run;
  run.communicator = core::make_local_communicator();
  for (const auto& [variant, name] : std::vector<std::pair<std::string, std::string>>{{"gpt", "Gpt"}, {"llama", "Llama"}}) {
    SCOPED_TRACE(variant);
    auto components = testing::build_components(
        "model: {component_key: model, variant_key: " + variant +
            ", config: {vocab_size: 16, n_layer: 1, n_head: 1, n_embd: 8, max_seq_len: 8}}\n"
            "monitor: {component_key: callback, variant_key: moe_monitor}\n",
        run);
    auto model = testing::built<Model>(components, "model");
    auto monitor = testing::built<Callback>(components, "monitor");
    TrainProgress progress;
    TrainerControl control;
    CallbackContext ctx{run, progress, *model, control};
    try {
      monitor->on_train_begin(ctx);
      FAIL() << "expected tessera::Error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("callback/moe_monitor needs a model with mixture-of-experts layers (model/gpt_moe, "
                          "model/llama with num_experts)"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find(name), std::string::npos) << what;
    }
  }
}

// One training step of a small gpt_moe (extra model keys in `model_config`) with the monitor.
StepMetrics one_monitored_step(const std::string& model_config) {
  testing::TempDir dir;
  std::vector<std::uint16_t> data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<std::uint16_t>(i * 7 % 16));
  testing::write_token_file(dir.file("t.bin"), data);
  RunContext run;
  run.communicator = core::make_local_communicator();
  core::seed_everything(3, "cpu");
  auto built = testing::build_components(
      "model: {component_key: model, variant_key: gpt_moe, config: {vocab_size: 16, n_head: 1, "
      "n_embd: 8, max_seq_len: 8, num_experts: 4, top_k: 2, capacity_factor: 1.0, " + model_config + "}}\n"
      "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + dir.file("t.bin") +
          ", seq_len: 8}}\n"
          "loss: {component_key: loss, variant_key: cross_entropy}\n"
          "optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 0.1, model: {instance_key: model}}}\n"
          "monitor: {component_key: callback, variant_key: moe_monitor}\n",
      run);
  core::TrainerParts parts;
  parts.model = testing::built<Model>(built, "model");
  parts.train_data = testing::built<Dataset>(built, "train_data");
  parts.loss = testing::built<Loss>(built, "loss");
  parts.optimizer = testing::built<Optimizer>(built, "optimizer");
  parts.callbacks = {testing::built<Callback>(built, "monitor")};
  core::TrainerSettings settings;
  settings.grad_accum = 2;
  settings.micro_batch_size = 2;
  settings.max_steps = 2;
  core::Trainer trainer(std::move(parts), settings, run);
  return trainer.step();
}

TEST(MoeMonitor, WritesItsMetricsInsideTheTrainer) {
  const StepMetrics metrics = one_monitored_step("n_layer: 2");
  for (const char* key : {"moe/layer0/maxvio", "moe/layer1/entropy", "moe/layer1/dropped_fraction",
                          "moe/layer0/expert3_fraction", "moe/aux_loss", "moe/z_loss", "moe/maxvio",
                          "moe/dead_experts"}) {
    ASSERT_TRUE(metrics.extra.count(key)) << key;
    EXPECT_TRUE(std::isfinite(metrics.extra.at(key))) << key;
  }
  EXPECT_GT(metrics.extra.at("moe/aux_loss"), 0.9);  // 1 when balanced, more otherwise
  double fractions = 0;
  for (int e = 0; e < kExperts; ++e) fractions += metrics.extra.at("moe/layer1/expert" + std::to_string(e) + "_fraction");
  EXPECT_NEAR(fractions, 1.0, 1e-9);
}

TEST(MoeMonitor, NamesLayersByTheirBlock) {
  // Blocks 0 and 2 are dense, block 1 is MoE: its metrics are layer1's.
  const StepMetrics metrics = one_monitored_step("n_layer: 3, moe_every: 2");
  EXPECT_TRUE(metrics.extra.count("moe/layer1/maxvio"));
  EXPECT_FALSE(metrics.extra.count("moe/layer0/maxvio"));
  EXPECT_FALSE(metrics.extra.count("moe/layer2/maxvio"));
}

}  // namespace moe_monitor_test
}  // namespace tessera
