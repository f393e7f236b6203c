// Pipeline parallelism end to end, through `tessera launch` on Gloo ranks: each schedule (gpipe,
// 1f1b, interleaved_1f1b) and its composition with fsdp, ddp and tp trains as one rank with as much
// accumulation does (per-step loss and grad norm, with clipping), for gpt (tied embeddings on the
// first and last stage) and llama; with dropout a run repeats and resumes bit-exactly; checkpoints
// reshard between pipelined and unpipelined meshes; what a pipeline cannot take is one positioned
// error at validation.
#include <regex>
#include <string>

#include "mesh_fixture.hpp"

namespace tessera {
namespace pipeline_parallel_test {

const std::string kFourBlocks = "--set components.model.config.n_layer=4";

INSTANTIATE_TEST_SUITE_P(
    Pipeline, Meshes,
    ::testing::Values(MeshCase{"gpt_pp2_gpipe", "tiny_tp", 2, 1, "--set parallelism.pp=2 --set parallelism.pp_schedule=gpipe"},
                      MeshCase{"gpt_pp2_1f1b", "tiny_tp", 2, 1, "--set parallelism.pp=2"},
                      MeshCase{"gpt_pp2_interleaved", "tiny_tp", 2, 1,
                               "--set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b", kFourBlocks},
                      MeshCase{"llama_pp2_gpipe", "tiny_llama_tp", 2, 1,
                               "--set parallelism.pp=2 --set parallelism.pp_schedule=gpipe"},
                      MeshCase{"llama_pp2_1f1b", "tiny_llama_tp", 2, 1, "--set parallelism.pp=2"},
                      MeshCase{"llama_pp2_interleaved", "tiny_llama_tp", 2, 1,
                               "--set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b", kFourBlocks},
                      // Uneven stages by split points, with activation checkpointing.
                      MeshCase{"gpt_pp2_split_checkpointed", "tiny_tp", 2, 1,
                               "--set parallelism.pp=2 --set parallelism.pp_split_points=[3] "
                               "--set components.model.config.activation_checkpointing=true",
                               kFourBlocks},
                      // Four stages (the tied embedding's ends, ranks 0 and 3, a group of their own)
                      // need 4 micro-batches: one rank accumulates as many (2 x 2).
                      MeshCase{"gpt_pp4", "tiny_tp", 4, 2, "--set parallelism.pp=4 --set trainer.grad_accum=4",
                               kFourBlocks},
                      MeshCase{"gpt_fsdp2_pp2", "tiny_tp", 4, 2, "--set parallelism.pp=2" + kFsdp},
                      MeshCase{"llama_fsdp2_pp2", "tiny_llama_tp", 4, 2, "--set parallelism.pp=2" + kFsdp},
                      MeshCase{"gpt_ddp2_pp2", "tiny_tp", 4, 2, "--set parallelism.pp=2" + kDdp},
                      // A rank's two stages' parameters share gradient buckets: reduced at the step's end.
                      MeshCase{"gpt_ddp2_pp2_interleaved", "tiny_tp", 4, 2,
                               "--set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b" + kDdp, kFourBlocks},
                      MeshCase{"llama_tp2_pp2", "tiny_llama_tp", 4, 1, "--set parallelism.tp=2 --set parallelism.pp=2"},
                      // Context and expert parallelism inside the stages.
                      MeshCase{"gpt_cp2_pp2", "tiny_tp", 4, 1, "--set parallelism.cp=2 --set parallelism.pp=2"},
                      MeshCase{"moe_ep2_pp2", "tiny_moe_ep", 4, 2, "--set parallelism.ep=2 --set parallelism.pp=2"}),
    [](const ::testing::TestParamInfo<MeshCase>& info) { return info.param.name; });

class Pipeline : public TensorParallel {};

// With dropout (each stage draws its masks from its rank's generator, saved in the checkpoint): two
// runs give the same losses, and a run resumed from step 5 gives the uninterrupted run's losses to
// the last bit; dropout changed the losses.
TEST_F(Pipeline, WithDropoutRunsRepeatAndResumeBitExactly) {
  const std::string args = "--set components.model.config.dropout=0.1 --set parallelism.pp=2";
  std::vector<nlohmann::json> a;
  repeats_and_resumes_bit_exactly(args, "", a);
  ASSERT_EQ(a.size(), 10u);
  std::string out;
  ASSERT_EQ(train(2, "tiny_tp", "--set parallelism.pp=2", "plain", out), 0) << out;
  const auto plain = read_metrics(dir_.file("plain") + "/metrics.jsonl");
  EXPECT_NE(double(plain.back()["loss"]), double(a.back()["loss"]));
  // Every pipeline rank reports its waiting against the analytic bubble (1 / 3 for pp 2 and 2
  // micro-batches), and the metrics carry rank 0's share per step.
  for (const std::string r : {"0", "1"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex("pipeline rank " + r + " \\(stages " + r +
                                                  "\\): idle share [0-9.e-]+ \\(analytic bubble 0.333333\\), "
                                                  "activation peak [0-9]+ B")))
        << out;
  }
  EXPECT_TRUE(plain.back().contains("pipeline_idle_share"));
}

// Saved under a pipeline (each stage its blocks), resumed without one and back: the steps after the
// checkpoint are the uninterrupted run's (whole parameters and optimizer state, cut again).
TEST_F(Pipeline, CheckpointsReshardBetweenPipelinedAndWholeModels) {
  const Reshard cases[] = {
      {"pp2_gpipe_to_1", 2, "--set parallelism.pp=2 --set parallelism.pp_schedule=gpipe", 1, ""},
      {"1_to_pp2_1f1b", 1, "", 2, "--set parallelism.pp=2"},
      {"pp2_interleaved_to_pp2_1f1b", 2, kFourBlocks + " --set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b",
       2, kFourBlocks + " --set parallelism.pp=2"},
      {"llama_fsdp2_pp2_to_fsdp2", 4, "--set parallelism.pp=2" + kFsdp, 2, kFsdp, "tiny_llama_tp"},
      {"llama_1_to_pp2", 1, "", 2, "--set parallelism.pp=2", "tiny_llama_tp"},
  };
  for (const Reshard& r : cases) resumes_as_saved(r);
}

// What a pipeline cannot take is refused before anything is built: one line with the spec's
// position, exit 2.
TEST_F(Pipeline, PipelinesTheRunCannotTakeArePositionedErrors) {
  const Bad cases[] = {
      {"tiny_tp", "--set parallelism.pp=4", "4 pipeline stages (pp 4 x 1 per rank) for 2 blocks: every stage needs a block"},
      {"tiny_llama_tp", "--set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b",
       "4 pipeline stages (pp 2 x 2 per rank) for 2 blocks"},
      {"tiny_tp", "--set parallelism.pp=2 --set trainer.grad_accum=1",
       "trainer.grad_accum 1 is below parallelism.pp 2: the step's micro-batches are the pipeline's"},
      {"tiny_tp", kFourBlocks + " --set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b --set trainer.grad_accum=3",
       "trainer.grad_accum 3 is not a multiple of parallelism.pp 2: interleaved_1f1b runs micro-batches in groups of pp"},
      {"tiny_tp", "--set components.model.config.n_layer=6 --set parallelism.pp=2 --set parallelism.pp_schedule=interleaved_1f1b",
       "6 blocks do not divide into the 4 stages of interleaved_1f1b"},
      {"tiny_tp", "--set parallelism.pp=2 --set parallelism.pp_schedule=zigzag", "parallelism.pp_schedule"},
      {"tiny_tp", "--set parallelism.pp=2 --set parallelism.pp_stages_per_rank=2", "interleaved_1f1b"},
      {"tiny_tp", "--set parallelism.pp=2 --set parallelism.pp_split_points=[1,2]", "2 split points for 2"},
  };
  for (const Bad& c : cases) is_a_positioned_validate_error(c);
  // Which buckets a stage reduces may not depend on what each rank used.
  std::string out;
  EXPECT_EQ(train(2, "tiny_tp", "--set parallelism.pp=2" + kDdp + " --set components.parallel.config.find_unused_parameters=true",
                  "unused", out),
            2)
      << out;
  EXPECT_NE(out.find("find_unused_parameters is not available under pipeline parallelism"), std::string::npos) << out;
}

}  // namespace pipeline_parallel_test
}  // namespace tessera
