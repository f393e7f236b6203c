// Parameters that get no gradient in a step, under the data-parallel strategies on real Gloo ranks
// with model/partly_used (tests/plugins/partly_used), whose detour layer only some forwards use.
// One process leaves such a parameter as it is (its .grad stays undefined); with
// find_unused_parameters ddp, zero1 and zero2 must do the same and equal the one-process run;
// without it, or under fsdp, the step is refused with the parameter's name.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/components/strategy.hpp"
#include "gloo_ranks.hpp"
#include "trainer_parts.hpp"
#include "test_support.hpp"

namespace tessera {
namespace unused_parameters_test {

using testing::TempDir;

constexpr std::int64_t kSteps = 4;

// The bundled plugins and model/partly_used; loaded once, alive until the process ends.
core::PluginHost& plugins_with_partly_used() {
  static core::PluginHost* host = [] {
    auto* h = new core::PluginHost;
    h->load_directories({testing::plugin_dir(), testing::test_plugin_dir("partly_used")});
    return h;
  }();
  return *host;
}

// Tokens 1..31 in a fixed pseudo-random order: batches start with odd and even tokens alike.
std::string token_file(const TempDir& dir) {
  std::vector<std::uint16_t> tokens;
  std::uint32_t state = 5;
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<std::uint16_t>(1 + (state = state * 1103515245u + 12345u) / 65536 % 31));
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  return path;
}

std::string components_yaml(const std::string& data, const std::string& detour, const std::string& strategy,
                            const std::string& strategy_config = "") {
  std::string yaml =
      "model: {component_key: model, variant_key: partly_used, config: {detour: " + detour + "}}\n"
      "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 8}}\n"
      "loss: {component_key: loss, variant_key: cross_entropy}\n"
      "optimizer: {component_key: optimizer, variant_key: adamw,\n"
      "            config: {lr: 0.05, weight_decay: 0.1, decay_norm_and_bias: true, model: {instance_key: model}}}\n";
  if (!strategy.empty()) {
    yaml += "parallel: {component_key: parallel, variant_key: " + strategy + ", config: {" + strategy_config + "}}\n";
  }
  return yaml;
}

struct RankRun {
  std::vector<double> losses;
  StateDict initial, weights;  // whole parameters before the first step and after the last
  std::string error;
};

void train_rank(const std::string& yaml, const std::shared_ptr<Communicator>& comm, std::int64_t accum, RankRun& out) {
  try {
    RunContext context = testing::rank_context(comm, 3);
    core::BuiltComponents built;
    {
      // The global generator seeds each rank's build in turn; ranks other than 0 start from other
      // weights, which the strategy replaces with rank 0's.
      static std::mutex build_mutex;
      std::lock_guard<std::mutex> lock(build_mutex);
      core::seed_everything(context.seed + 1000 * static_cast<std::uint64_t>(context.rank), "cpu");
      built = core::ComponentFactory(plugins_with_partly_used().registry(), context)
                  .build(core::parse_config_string(yaml, "test.yaml"));
    }
    core::TrainerParts parts = testing::trainer_parts(built);
    for (const auto& item : parts.model->named_parameters()) out.initial[item.key()] = item.value().detach().clone();
    core::TrainerSettings settings;
    settings.grad_accum = accum;
    settings.micro_batch_size = 1;
    settings.max_steps = kSteps;
    auto strategy = parts.parallel;
    core::Trainer trainer(std::move(parts), settings, context);
    for (std::int64_t s = 0; s < kSteps; ++s) out.losses.push_back(trainer.step().loss);
    if (strategy) {
      out.weights = strategy->full_parameters(trainer.model());
    } else {
      for (const auto& item : trainer.model().named_parameters()) out.weights[item.key()] = item.value().detach().clone();
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

// One rank per YAML text, with one micro-batch each.
std::vector<RankRun> run(const std::vector<std::string>& yaml_of_rank) {
  at::set_num_threads(1);
  std::vector<RankRun> runs(yaml_of_rank.size());
  const std::vector<std::string> errors = testing::run_on_gloo_ranks(
      static_cast<std::int64_t>(yaml_of_rank.size()), [&](std::int64_t rank, std::shared_ptr<Communicator> comm) {
        const auto r = static_cast<std::size_t>(rank);
        train_rank(yaml_of_rank[r], comm, 1, runs[r]);
      });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) runs[r].error = errors[r];
  }
  return runs;
}

// `world` ranks of one YAML text.
std::vector<RankRun> run(const std::string& yaml, std::int64_t world) {
  return run(std::vector<std::string>(static_cast<std::size_t>(world), yaml));
}

// One process with `micro_batches` micro-batches a step: the batches of as many ranks.
RankRun one_process(const std::string& yaml, std::int64_t micro_batches) {
  RankRun out;
  train_rank(yaml, core::make_local_communicator(), micro_batches, out);
  return out;
}

void expect_close(const StateDict& a, const StateDict& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_TRUE(t.allclose(b.at(name), 1e-4, 1e-6))
        << what << ": " << name << " differs by " << (t - b.at(name)).abs().max().item<double>();
  }
}

// A detour no forward takes keeps its initial values bit for bit, as with one process; the rest
// of the model trains the same as with one process.
TEST(UnusedParameters, NeverUsedOnesKeepTheirValuesUnderEveryBucketedStrategy) {
  TempDir dir;
  const std::string data = token_file(dir);
  const RankRun reference = one_process(components_yaml(data, "never", ""), 2);
  ASSERT_EQ(reference.error, "");
  EXPECT_TRUE(reference.weights.at("detour_weight").equal(reference.initial.at("detour_weight")));
  EXPECT_FALSE(reference.weights.at("head_weight").equal(reference.initial.at("head_weight")));
  for (const std::string strategy : {"ddp", "zero1", "zero2"}) {
    SCOPED_TRACE(strategy);
    const std::vector<RankRun> ranks = run(components_yaml(data, "never", strategy, "find_unused_parameters: true"), 2);
    for (const RankRun& r : ranks) {
      ASSERT_EQ(r.error, "");
      EXPECT_TRUE(r.weights.at("detour_weight").equal(ranks[0].initial.at("detour_weight")))
          << "an unused parameter was updated (weight decay, moments)";
      EXPECT_TRUE(r.weights.at("detour_bias").equal(ranks[0].initial.at("detour_bias")));
    }
    expect_close(ranks[0].weights, reference.weights, strategy);
  }
}

// A detour taken by some batches only: in a step where one rank took it and the other did not,
// the parameter has a gradient (the ranks agree on it) and is updated on both; where no rank took
// it, it is not. The weights equal the one-process run's, which sees both batches.
TEST(UnusedParameters, RanksAgreeOnWhichParametersWereUsed) {
  TempDir dir;
  const std::string data = token_file(dir);
  const RankRun reference = one_process(components_yaml(data, "even", ""), 2);
  ASSERT_EQ(reference.error, "");
  EXPECT_FALSE(reference.weights.at("detour_weight").equal(reference.initial.at("detour_weight")))
      << "the data must take the detour in some step";
  for (const std::string strategy : {"ddp", "zero2"}) {
    SCOPED_TRACE(strategy);
    const std::vector<RankRun> ranks = run(components_yaml(data, "even", strategy, "find_unused_parameters: true"), 2);
    for (const RankRun& r : ranks) ASSERT_EQ(r.error, "");
    expect_close(ranks[0].weights, reference.weights, strategy);
    expect_close(ranks[1].weights, ranks[0].weights, strategy + " rank 1 against rank 0");
    ASSERT_EQ(ranks[0].losses.size(), reference.losses.size());
    for (std::size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(ranks[0].losses[s], reference.losses[s], 1e-5) << "step " << s + 1;
    }
  }
}

// Without find_unused_parameters an unused parameter is one clear error on every rank that has
// one, naming it and the setting; fsdp refuses it on one rank as on two.
TEST(UnusedParameters, AreRefusedWithoutFindUnusedParametersAndUnderFsdp) {
  TempDir dir;
  const std::string data = token_file(dir);
  for (const RankRun& r : run(components_yaml(data, "never", "ddp"), 2)) {
    EXPECT_NE(r.error.find("parallel/ddp: parameter detour_"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(" (and 1 more) got no gradient in this step on any rank"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("components.parallel.config.find_unused_parameters: true"), std::string::npos) << r.error;
  }
  for (const std::int64_t world : {1, 2}) {
    SCOPED_TRACE(world);
    const std::string yaml = components_yaml(data, "never", "fsdp");
    const std::vector<RankRun> ranks = world == 1 ? std::vector<RankRun>{one_process(yaml, 1)} : run(yaml, world);
    for (const RankRun& r : ranks) {
      EXPECT_NE(r.error.find("fsdp needs every parameter used in every step"), std::string::npos) << r.error;
    }
  }
  // Every parameter used: no error and no setting needed.
  for (const RankRun& r : run(components_yaml(data, "always", "ddp"), 2)) EXPECT_EQ(r.error, "");
}

// Without the setting, a parameter that only some ranks used in a step has its right gradient
// (the other ranks add zeros) and trains on: rank 0 takes the detour every step and rank 1 never,
// which is no error, and the replicas stay equal. Where no rank used it, both ranks stop with the
// same error at the same step: one rank never stops alone while the other waits in a collective.
TEST(UnusedParameters, RanksDecideAlikeWhetherAParameterWentUnused) {
  TempDir dir;
  const std::string data = token_file(dir);
  const std::vector<RankRun> mixed = run({components_yaml(data, "always", "ddp"), components_yaml(data, "never", "ddp")});
  for (const RankRun& r : mixed) ASSERT_EQ(r.error, "");
  ASSERT_EQ(mixed[0].losses.size(), static_cast<std::size_t>(kSteps));
  expect_close(mixed[1].weights, mixed[0].weights, "rank 1 against rank 0");
  EXPECT_FALSE(mixed[0].weights.at("detour_weight").equal(mixed[0].initial.at("detour_weight")));
  // The same two ranks with find_unused_parameters: nothing to drop, the same run.
  const std::vector<RankRun> found = run({components_yaml(data, "always", "ddp", "find_unused_parameters: true"),
                                          components_yaml(data, "never", "ddp", "find_unused_parameters: true")});
  ASSERT_EQ(found[0].error, "");
  expect_close(found[0].weights, mixed[0].weights, "with find_unused_parameters");

  const std::vector<RankRun> none = run(components_yaml(data, "never", "zero2"), 2);
  EXPECT_NE(none[0].error.find("parallel/zero2: parameter detour_"), std::string::npos) << none[0].error;
  EXPECT_EQ(none[1].error, none[0].error);
}

}  // namespace unused_parameters_test
}  // namespace tessera
