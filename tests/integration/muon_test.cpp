// optimizer/muon against torch.optim.Muon over the hidden matrices plus torch.optim.AdamW over the
// rest (tools/interop/hf_reference.py train --optimizer muon): a Llama made in Python trained 10
// steps on the same windows gives every step's loss within 1e-5 with Newton-Schulz in fp32 and
// 1e-3 in bf16 (torch's); fsdp, zero1 and zero2 on 2 ranks and tp 2 (each matrix made whole for
// its orthogonalisation) give one rank's losses, as `tessera plan` counts their state and bytes,
// and so does ep 2 over a mixture of experts (each expert orthogonalised alone); a checkpoint
// resumes bit-exact, and resumes under another mesh.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "test_support.hpp"

namespace tessera {
namespace muon_test {

class Muon : public HfInterop {
 protected:
  void SetUp() override {
    HfInterop::SetUp();
    if (IsSkipped()) return;
    tokens_ = dir_.file("tokens.bin");
    reference("tokens " + tokens_ + " --count 20000 --vocab 256");
    base_ = dir_.file("llama");
    reference("make-llama " + base_ + " --kv-heads 2 --std 0.1");
  }

  // 10 steps of 4 windows (over all ranks), Muon at lr 0.02 and AdamW at 3e-3 for the rest.
  std::string muon_spec(const std::string& name, const std::string& ns_dtype, int ranks = 1,
                        const std::string& extra = "") {
    return dir_.write(
        name + ".yaml",
        "name: " + name + "\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" + "settings: {seed: 1, run_dir: " +
            dir_.file("runs/" + name) + ", device: cpu}\n" + "components:\n  model: " + model_yaml("llama", base_) + "\n" +
            "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " + tokens_ +
            ", dtype: uint16, seq_len: " + std::to_string(kSeqLen) + ", shuffle: false}}\n" +
            "  loss: {component_key: loss, variant_key: cross_entropy}\n" +
            "  optimizer: {component_key: optimizer, variant_key: muon, config: {lr: 0.02, ns_dtype: " + ns_dtype +
            ", adamw_lr: 3.0e-3, adamw_beta2: 0.95, adamw_weight_decay: 0.1, model: {instance_key: model, pass_type: "
            "BY_REFERENCE}}}\n" +
            extra + "trainer: {max_steps: 10, micro_batch_size: " + std::to_string(4 / ranks) +
            ", clip_grad_norm: 0}\n");
  }

  std::vector<double> train(const std::string& spec_path, int ranks, const std::string& name, const std::string& args = "") {
    std::string out;
    const std::string command = ranks > 1 ? " launch --nproc-per-node " + std::to_string(ranks) + " -- train " : " train ";
    EXPECT_EQ(run_command(testing::tessera_binary() + command + spec_path + args, out), 0) << out;
    return step_losses(dir_.file("runs/" + name + "/metrics.jsonl"));
  }

  std::vector<double> torch_losses(const std::string& ns_dtype) {
    const std::string line =
        reference("train " + base_ + " --tokens " + tokens_ + " --seq-len " + std::to_string(kSeqLen) +
                  " --batch 4 --steps 10 --optimizer muon --lr 0.02 --weight-decay 0.1 --ns-dtype " + ns_dtype +
                  " --adamw-lr 3e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --adamw-weight-decay 0.1");
    return nlohmann::json::parse(line).get<std::vector<double>>();
  }

  // `tessera plan` of the spec for RANKS ranks agrees with run NAME's metrics.
  void plan_agrees(const std::string& spec_path, const std::string& name, int ranks = 2) {
    SCOPED_TRACE(name);
    std::string out;
    const std::string errors = dir_.file("plan_stderr.txt");
    ASSERT_EQ(run_command(testing::tessera_binary() + " plan " + spec_path + " --ranks " + std::to_string(ranks) + " --json 2>" + errors, out), 0)
        << out << std::ifstream(errors).rdbuf();
    expect_plan_agrees_with_metrics(out, read_metrics(dir_.file("runs/" + name + "/metrics.jsonl")));
  }

  static void expect_close(const std::vector<double>& ours, const std::vector<double>& theirs, double tolerance,
                           const std::string& what) {
    ASSERT_EQ(ours.size(), 10u) << what;
    ASSERT_EQ(theirs.size(), 10u) << what;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_LT(relative(ours[i], theirs[i]), tolerance)
          << what << " step " << i + 1 << ": " << ours[i] << " against " << theirs[i];
    }
  }

  std::string tokens_, base_;
};

TEST_F(Muon, StepsEqualTorchMuonWithAdamWOverTheRest) {
  for (const std::string dtype : {"fp32", "bf16"}) {
    const std::vector<double> ours = train(muon_spec("muon-" + dtype, dtype), 1, "muon-" + dtype);
    expect_close(ours, torch_losses(dtype), dtype == "fp32" ? 1e-5 : 1e-3, dtype);
    EXPECT_LT(ours.back(), ours.front() - 0.05) << "the loss falls";
  }
}

// ddp, fsdp, zero1 and zero2 on 2 ranks, tp 2 and fsdp on 4 ranks give one rank's losses; `tessera plan` counts each run's optimizer state
// and the bytes its matrices' gathers move (with the rest of the step's) within 10 % of what the
// run measured.
TEST_F(Muon, EveryStrategyAndTensorParallelRanksMakeEachMatrixWhole) {
  const std::vector<double> one = train(muon_spec("one", "fp32"), 1, "one");
  for (const std::string strategy : {"ddp", "fsdp", "zero1", "zero2"}) {
    const std::string spec_path =
        muon_spec(strategy, "fp32", 2, "  parallel: {component_key: parallel, variant_key: " + strategy + "}\n");
    expect_close(train(spec_path, 2, strategy), one, 1e-5, strategy + " 2");
    plan_agrees(spec_path, strategy);
  }
  const std::string tp = muon_spec("tp", "fp32", 1, "parallelism: {tp: 2}\n");
  expect_close(train(tp, 2, "tp"), one, 1e-5, "tp 2");
  plan_agrees(tp, "tp");
  // Four owners split the matrices: each receives and sends back about a quarter of them.
  const std::string fsdp4 =
      muon_spec("fsdp4", "fp32", 4, "  parallel: {component_key: parallel, variant_key: fsdp}\n");
  expect_close(train(fsdp4, 4, "fsdp4"), one, 1e-5, "fsdp 4");
  plan_agrees(fsdp4, "fsdp4", 4);
}

// The momentum buffers and AdamW's moments saved by fsdp 2 at step 5 reshard: resumed on one rank
// and on tp 2, steps 6-10 are the uninterrupted run's within float32 rounding.
TEST_F(Muon, CheckpointsReshardAcrossMeshes) {
  const std::vector<double> one = train(muon_spec("one", "fp32"), 1, "one");
  const std::string fsdp =
      muon_spec("save", "fp32", 2, "  parallel: {component_key: parallel, variant_key: fsdp}\n");
  ASSERT_EQ(train(fsdp, 2, "save", " --set checkpoint.every_steps=5").size(), 10u);
  const std::string resume = " --resume " + dir_.file("runs/save/checkpoints/step_00000005");
  const std::vector<double> alone = train(muon_spec("alone", "fp32"), 1, "alone", resume);
  const std::vector<double> tp = train(muon_spec("tp", "fp32", 1, "parallelism: {tp: 2}\n"), 2, "tp", resume);
  for (const auto& [what, resumed] : {std::pair{"one rank", alone}, std::pair{"tp 2", tp}}) {
    ASSERT_EQ(resumed.size(), 5u) << what;
    for (std::size_t i = 0; i < 5; ++i) {
      EXPECT_LT(relative(resumed[i], one[i + 5]), 1e-5) << what << " step " << i + 6;
    }
  }
}

// A mixture of experts (tests/integration/configs/tiny_moe_ep.yaml): with ep 2 each rank
// orthogonalises its own experts one by one, as one rank does all of them; the plan counts the
// run's state and bytes.
TEST_F(Muon, ExpertParallelRanksOrthogonaliseTheirExpertsAsOneRank) {
  const std::string moe = testing::source_dir() + "/tests/integration/configs/tiny_moe_ep.yaml";
  const std::string muon =
      " --set components.train_data.config.path=" + tokens_ +
      " --set components.optimizer.variant_key=muon --set 'components.optimizer.config={lr: 0.02, ns_dtype: fp32, "
      "adamw_lr: 3.0e-3, model: {instance_key: model, pass_type: BY_REFERENCE}}'";
  std::string out;
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + moe + muon + " --run-dir " + dir_.file("runs/moe-one"), out),
            0)
      << out;
  ASSERT_EQ(run_command(testing::tessera_binary() + " launch --nproc-per-node 2 -- train " + moe + muon +
                            " --set parallelism.ep=2 --set trainer.grad_accum=1 --run-dir " + dir_.file("runs/moe-ep2"),
                        out),
            0)
      << out;
  expect_close(step_losses(dir_.file("runs/moe-ep2/metrics.jsonl")), step_losses(dir_.file("runs/moe-one/metrics.jsonl")),
               1e-5, "ep 2");
  const std::string errors = dir_.file("plan_stderr.txt");
  ASSERT_EQ(run_command(testing::tessera_binary() + " plan " + moe + muon +
                            " --set parallelism.ep=2 --set trainer.grad_accum=1 --ranks 2 --json 2>" + errors,
                        out),
            0)
      << out << std::ifstream(errors).rdbuf();
  expect_plan_agrees_with_metrics(out, read_metrics(dir_.file("runs/moe-ep2/metrics.jsonl")));
}

// The momentum buffers and AdamW's moments and steps are in the checkpoint: resumed at step 6,
// steps 7-10 are the uninterrupted run's, bit for bit.
TEST_F(Muon, ResumesBitExact) {
  const std::string spec_path = muon_spec("resume", "bf16");
  const std::vector<double> whole = train(spec_path, 1, "resume", " --set checkpoint.every_steps=6");
  const std::vector<double> resumed = train(spec_path, 1, "resume",
                                            " --set checkpoint.every_steps=6 --resume " +
                                                dir_.file("runs/resume/checkpoints/step_00000006"));
  ASSERT_EQ(whole.size(), 10u);
  ASSERT_EQ(resumed.size(), 10u);
  for (std::size_t i = 6; i < 10; ++i) EXPECT_EQ(resumed[i], whole[i]) << "step " << i + 1;
}

}  // namespace muon_test
}  // namespace tessera
