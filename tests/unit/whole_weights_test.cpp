// Trainer::whole_weights on four Gloo ranks as dp_shard 2 x tp 2 under fsdp: every rank gets the
// whole model (the strategy's shards gathered, then the placements' tensor-parallel parts), equal
// to the one-rank model built from the same seed; what generation and rollouts read.
#include <gtest/gtest.h>

#include <ATen/ops/equal.h>

#include <mutex>

#include "gloo_ranks.hpp"
#include "small_trainer.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {
namespace whole_weights_test {

std::string yaml(const std::string& data, bool fsdp) {
  return testing::components_yaml(data) +
         (fsdp ? "parallel: {component_key: parallel, variant_key: fsdp, config: {}}\n" : std::string());
}

std::mutex build_mutex;  // the ranks build in turn, from the same global seed

StateDict whole_weights_of(const std::string& spec, RunContext context) {
  core::BuiltComponents built;
  {
    std::lock_guard<std::mutex> lock(build_mutex);
    core::seed_everything(context.seed, "cpu");
    built = testing::build_components(spec, context);
  }
  core::TrainerSettings settings;
  settings.micro_batch_size = 2;
  settings.max_steps = 1;
  core::Trainer trainer(testing::trainer_parts(built), settings, context);
  return trainer.whole_weights();
}

TEST(WholeWeights, EveryRankHoldsTheWholeModelUnderFsdpAndTensorParallelism) {
  testing::TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  const StateDict one = whole_weights_of(yaml(data, false), testing::rank_context(core::make_local_communicator(), 42));
  std::mutex mutex;
  std::vector<std::string> mismatches;
  std::vector<std::size_t> counts(4);
  const auto errors = testing::run_on_gloo_ranks(4, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    RunContext context = testing::rank_context(world, 42);
    ParallelDims dims;
    dims.dp_shard = 2;
    dims.tp = 2;
    context.mesh = core::make_device_mesh(world, dims);
    context.parallel = dims;
    const StateDict whole = whole_weights_of(yaml(data, true), context);
    std::lock_guard<std::mutex> lock(mutex);
    counts[static_cast<std::size_t>(rank)] = whole.size();
    for (const auto& [name, w] : one) {
      const auto it = whole.find(name);
      if (it == whole.end() || it->second.sizes() != w.sizes() || !at::equal(it->second, w)) {
        mismatches.push_back("rank " + std::to_string(rank) + ": " + name);
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (const std::size_t n : counts) EXPECT_EQ(n, one.size());
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " differ, first " << mismatches.front();
  EXPECT_GT(one.size(), 10u);
}

// A pipeline's stages hold different blocks: no rank holds them all, and asking says so.
TEST(WholeWeights, APipelineIsRefusedWithWhatToDoInstead) {
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t, std::shared_ptr<Communicator> world) {
    RunContext run = testing::rank_context(world, 1);
    ParallelDims dims;
    dims.pp = 2;
    run.mesh = core::make_device_mesh(world, dims);
    const Placements placements(run, {});
    placements.whole_everywhere({{"w", at::zeros({2})}});
  });
  for (const auto& e : errors) EXPECT_NE(e.find("gather it onto rank 0 (gather_whole) or use parallelism.pp: 1"), std::string::npos) << e;
}

}  // namespace whole_weights_test
}  // namespace tessera
