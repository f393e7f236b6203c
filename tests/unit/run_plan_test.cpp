// The run plan: a spec resolved once, with the sections read into their declared structs, the
// defaults the host adds, and this process's place among the ranks.
#include "tessera/core/run/run_plan.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tessera::core {
namespace run_plan_test {

using testing::TempDir;

const char* kSpec = R"(name: planned
settings: {seed: 7, device: cuda, peak_flops: 1.0e12}
components:
  model: {component_key: model, variant_key: gpt}
  train_data: {component_key: dataset, variant_key: tokens, config: {path: x.bin, seq_len: 4}}
  loss: {component_key: loss, variant_key: cross_entropy}
  optimizer: {component_key: optimizer, variant_key: sgd, config: {model: {instance_key: model}}}
trainer: {max_steps: 3, micro_batch_size: 2, grad_accum: 4}
checkpoint: {every_steps: 5}
)";

std::string issue_of(const std::string& spec, const std::vector<std::string>& overrides = {}) {
  TempDir dir;
  RunOptions options;
  options.config_path = dir.write("spec.yaml", spec);
  options.overrides = overrides;
  try {
    plan_run(options, DistributedEnv{});
  } catch (const ConfigIssue& e) {
    return e.what();
  }
  return "";
}

TEST(RunPlan, ReadsEverySectionAndAddsTheHostsDefaults) {
  TempDir dir;
  RunOptions options;
  options.config_path = dir.write("spec.yaml", kSpec);
  options.overrides = {"trainer.max_steps=9"};
  DistributedEnv env;
  env.rank = 1;
  env.local_rank = 1;
  env.world_size = 2;
  const RunPlan plan = plan_run(options, env);
  EXPECT_EQ(plan.context.name, "planned");
  EXPECT_EQ(plan.context.seed, 7u);
  EXPECT_EQ(plan.context.run_dir, "runs/planned");
  EXPECT_EQ(plan.context.device, "cuda:1") << "one GPU per local rank";
  EXPECT_EQ(plan.context.rank, 1);
  EXPECT_EQ(plan.context.world_size, 2);
  EXPECT_EQ(plan.settings.peak_flops, 1.0e12);
  EXPECT_EQ(plan.trainer.max_steps, 9);
  EXPECT_EQ(plan.trainer.grad_accum, 4);
  EXPECT_EQ(plan.checkpoint.every_steps, 5);
  EXPECT_EQ(plan.checkpoints.dir(), "runs/planned/checkpoints");
  EXPECT_EQ(plan.checkpoints.exports_dir(), "runs/planned/exports");
  // Several ranks and no strategy: ddp; no metrics sink listed: jsonl_metrics.
  EXPECT_EQ(plan.strategy, "ddp");
  const ConfigNode* callbacks = plan.components().find("callbacks");
  ASSERT_TRUE(callbacks && callbacks->is_sequence() && callbacks->items().size() == 1u);
  EXPECT_EQ(callbacks->items()[0].find("variant_key")->scalar(), "jsonl_metrics");
  EXPECT_NE(plan.resolved_yaml.find("jsonl_metrics"), std::string::npos);
  EXPECT_NE(plan.resolved_yaml.find("max_steps: 9"), std::string::npos);
  EXPECT_NE(plan.model_config_json.find("\"variant_key\": \"gpt\""), std::string::npos);
}

TEST(RunPlan, OneRankNamesNoStrategyAndTheCommandLineRunDirWins) {
  TempDir dir;
  RunOptions options;
  options.config_path = dir.write("spec.yaml", kSpec);
  options.run_dir = dir.file("elsewhere");
  const RunPlan plan = plan_run(options, DistributedEnv{});
  EXPECT_EQ(plan.strategy, "none");
  EXPECT_EQ(plan.components().find("parallel"), nullptr);
  EXPECT_EQ(plan.context.run_dir, dir.file("elsewhere"));
  EXPECT_EQ(plan.checkpoints.dir(), dir.file("elsewhere") + "/checkpoints");
  EXPECT_EQ(plan.context.device, "cuda:0");
}

TEST(RunPlan, MistakesInTheFixedSectionsArePositioned) {
  EXPECT_NE(issue_of(kSpec, {"trainer.max_steps=0"}).find("trainer: no stop condition"), std::string::npos);
  EXPECT_NE(issue_of(kSpec, {"settings.device=gpu"}).find("--set settings.device=gpu:1:1: settings.device: expected cpu, cuda or cuda:N, got \"gpu\""),
            std::string::npos)
      << issue_of(kSpec, {"settings.device=gpu"});
  const std::string unknown = issue_of(std::string(kSpec) + "trainr: {}\n");
  EXPECT_NE(unknown.find("spec.yaml:10:1: trainr: unknown top-level key (did you mean 'trainer'?)"), std::string::npos)
      << unknown;
  const std::string missing = issue_of(kSpec, {"trainer.micro_batch_size=null"});
  EXPECT_NE(missing.find("trainer.micro_batch_size: required int is missing"), std::string::npos) << missing;
  const std::string bad = issue_of(kSpec, {"checkpoint.keep_last=-1"});
  EXPECT_NE(bad.find("checkpoint.keep_last"), std::string::npos) << bad;
}

// trainer.cuda_graph replays one process's GPU work: refused on a CPU and beside a strategy, at
// the key's position, before anything is built.
TEST(RunPlan, CudaGraphIsRefusedOffTheGpuAndForSeveralRanks) {
  const std::string on_cpu = issue_of(kSpec, {"settings.device=cpu", "trainer.cuda_graph=true"});
  EXPECT_NE(on_cpu.find("--set trainer.cuda_graph=true:1:1: trainer.cuda_graph: needs settings.device: cuda"),
            std::string::npos)
      << on_cpu;
  EXPECT_NE(on_cpu.find("the device is cpu"), std::string::npos) << on_cpu;

  TempDir dir;
  RunOptions options;
  options.config_path = dir.write("spec.yaml", kSpec);
  options.overrides = {"trainer.cuda_graph=true"};
  EXPECT_TRUE(plan_run(options, DistributedEnv{}).trainer.cuda_graph) << "one process on cuda:0 may capture";
  DistributedEnv two;
  two.world_size = 2;
  try {
    plan_run(options, two);
    ADD_FAILURE() << "two ranks with trainer.cuda_graph were accepted";
  } catch (const ConfigIssue& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.cuda_graph: captures the step of a single process without "
                                         "components.parallel (this run: strategy ddp, 2 ranks)"),
              std::string::npos)
        << e.what();
  }
}

// The trainer reads train_data alone: an evaluation (or any component) given it by reference is
// refused where the reference is written; a dataset of its own is fine.
TEST(RunPlan, AReferenceToTrainDataIsRefused) {
  std::string spec = kSpec;
  spec.insert(spec.find("trainer:"),
              "  callbacks:\n"
              "    - {component_key: callback, variant_key: evaluation,\n"
              "       config: {every: 2, data: {instance_key: train_data}}}\n");
  const std::string issue = issue_of(spec);
  EXPECT_NE(issue.find("spec.yaml:10:"), std::string::npos) << issue;
  EXPECT_NE(issue.find("components.callbacks[0].config.data.instance_key: components.train_data is read by the "
                       "trainer alone"),
            std::string::npos)
      << issue;
  std::string own = kSpec;
  own.insert(own.find("trainer:"),
             "  callbacks:\n"
             "    - {component_key: callback, variant_key: evaluation,\n"
             "       config: {every: 2, data: {component_key: dataset, variant_key: tokens, config: {path: x.bin, seq_len: 4}}}}\n");
  EXPECT_EQ(issue_of(own), "");
}

}  // namespace run_plan_test
}  // namespace tessera::core
