// loss/grpo's training step through `tessera train`: a Llama made in Python samples completions of
// dataset/prompt_jsonl's sums, reward/math_answer and reward/regex score them, and
// tools/interop/grpo_replay.py replays the logged rollouts (rollouts.jsonl) in plain PyTorch with
// TRL's formulas over 3 plain-SGD steps: the advantages from the logged rewards, each step's loss
// within 1e-5 and the weights after the third step within 1e-4 of the update. For every loss_type
// (dapo with num_iterations 2 and the clip active, GSPO's sequence ratio), on one rank, ddp 2,
// fsdp 2 and tp 2, with and without LoRA; a checkpoint inside a rollout resumes bit-exact.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "reference_process.hpp"
#include "test_support.hpp"

namespace tessera {
namespace grpo_training_test {

namespace fs = std::filesystem;

// What the Tessera runs and the replay share: 3 steps of 8 completions (2 prompts of 4) each rank.
struct Case {
  std::string name;
  std::string loss;     // loss/grpo's config besides rewards and sampling
  std::string replay;   // the same for grpo_replay.py
  std::string extra;    // more of the spec: adapters, parallel, parallelism
  int ranks = 1;
  int tp = 1;  // of the ranks; the others are data-parallel
  int dp() const { return ranks / tp; }
};

class GrpoTraining : public LlamaWithPeft {
 protected:
  void SetUp() override {
    LlamaWithPeft::SetUp();
    if (IsSkipped()) return;
    std::string lines;
    for (int i = 0; i < 12; ++i) {
      const int a = (i * 7) % 10, b = (i * 3 + 1) % 10;
      lines += nlohmann::json{{"prompt", std::to_string(a) + "+" + std::to_string(b) + "="},
                              {"answer", std::to_string(a + b)}}
                   .dump() +
               "\n";
    }
    prompts_ = dir_.write("prompts.jsonl", lines);
  }

  std::string spec(const Case& c) {
    const bool adapters = c.extra.find("adapters") != std::string::npos;
    return dir_.write(
        c.name + ".yaml",
        "name: " + c.name + "\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" +
            "settings: {seed: 3, run_dir: " + run_dir(c) + ", device: cpu}\n" + "components:\n" +
            "  tokenizer: {component_key: tokenizer, variant_key: bytes}\n" + "  model: " + model_yaml("llama", base_) + "\n" +
            "  train_data: {component_key: dataset, variant_key: prompt_jsonl, config: {path: " + prompts_ +
            ", tokenizer: {instance_key: tokenizer, pass_type: BY_REFERENCE}, shuffle: false}}\n" +
            "  loss:\n    component_key: loss\n    variant_key: grpo\n    config:\n" +
            "      {num_generations: 4, max_completion_length: 8, temperature: 0.9, " + c.loss + ",\n" +
            "       rewards: [{component_key: reward, variant_key: math_answer, config: {format: last_number}},\n"
            "                 {component_key: reward, variant_key: regex, config: {pattern: '[0-9a-z]'}}]}\n" +
            "  optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 0.05, model: {instance_key: model, "
            "pass_type: BY_REFERENCE}}}\n" +
            c.extra + "trainer: {max_steps: 3, micro_batch_size: 4, grad_accum: " + std::to_string(2 / c.dp()) +
            ", clip_grad_norm: 0}\n" + (c.tp > 1 ? "parallelism: {tp: " + std::to_string(c.tp) + "}\n" : "") +
            (adapters ? "checkpoint: {export_format: peft, export_every_steps: 1}\n" : "checkpoint: {export_format: hf}\n"));
  }

  std::string run_dir(const Case& c) const { return dir_.file("runs/" + c.name); }

  void train(const Case& c, const std::string& args = "") {
    std::string out;
    const std::string command = c.ranks > 1 ? " launch --nproc-per-node " + std::to_string(c.ranks) + " -- train "
                                            : " train ";
    ASSERT_EQ(run_command(testing::tessera_binary() + command + spec(c) + args, out), 0) << out;
  }

  nlohmann::json replay(const Case& c) {
    if (!replay_process_) {  // one process for the test's replays (tools/interop/serve.py)
      replay_process_ = std::make_unique<testing::ReferenceProcess>(
          python_, testing::source_dir() + "/tools/interop/serve.py",
          testing::source_dir() + "/tools/interop/grpo_replay.py", dir_.file("grpo_replay.err"));
    }
    const bool adapters = c.extra.find("adapters") != std::string::npos;
    std::string out, err;
    const int rc = replay_process_->run(
        base_ + " " + run_dir(c) + " " + run_dir(c) + "/exports/step_00000003 --steps 3 --lr 0.05 --num-generations 4 "
            "--micro-batch-size 4 --grad-accum " + std::to_string(2 / c.dp()) + " --ranks " + std::to_string(c.dp()) +
            " --temperature 0.9 --max-completion-length 8 " + c.replay +
            (adapters ? " --adapter " + run_dir(c) + "/exports/step_00000001" : ""),
        out);
    run_command("cat " + dir_.file("grpo_replay.err"), err);
    EXPECT_EQ(rc, 0) << out << err;
    return nlohmann::json::parse(last_line(out), nullptr, false);
  }

  // The replay agrees with the run, and the run learned something (a step with rewards that differ).
  void expect_replayed(const Case& c) {
    SCOPED_TRACE(c.name);
    train(c);
    const nlohmann::json r = replay(c);
    ASSERT_TRUE(r.is_object()) << r;
    ASSERT_EQ(r["losses"].size(), 3u);
    ASSERT_EQ(r["tessera_losses"].size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_NEAR(r["tessera_losses"][s].get<double>(), r["losses"][s].get<double>(), 1e-5) << "step " << s + 1;
    }
    EXPECT_LE(r["advantage_error"].get<double>(), 1e-5);
    EXPECT_GT(r["update"].get<double>(), 1e-4) << "the weights did not move: no group had rewards that differ";
    EXPECT_LE(r["weight_error"].get<double>(), 1e-4 * r["update"].get<double>());
  }

  std::string prompts_;
  std::unique_ptr<testing::ReferenceProcess> replay_process_;  // ends before the fixture's files go
};

const char* const kDapo = "beta: 0.04, epsilon: 0.0005, num_iterations: 2";
const char* const kDapoReplay = "--beta 0.04 --epsilon 0.0005 --num-iterations 2";

TEST_F(GrpoTraining, EveryLossTypeReplaysInPyTorchOnOneRank) {
  expect_replayed({"dapo", kDapo, kDapoReplay, ""});
  // num_iterations 2 with a narrow clip range: the second step's weights leave it.
  const auto metrics = read_metrics(run_dir({"dapo", "", "", ""}) + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_GT(metrics[1]["clip_ratio/region_mean"].get<double>(), 0.0) << metrics[1];
  expect_replayed({"grpo", "loss_type: grpo, epsilon_high: 0.28", "--loss-type grpo --epsilon-high 0.28", ""});
  expect_replayed({"bnpo", "loss_type: bnpo, beta: 0.1", "--loss-type bnpo --beta 0.1", ""});
  expect_replayed({"gspo", "loss_type: dr_grpo, importance_sampling_level: sequence, num_iterations: 2, epsilon: 0.001",
                   "--loss-type dr_grpo --importance-sampling-level sequence --num-iterations 2 --epsilon 0.001", ""});
}

TEST_F(GrpoTraining, LoraDdpAndFsdpReplayInPyTorch) {
  const std::string lora =
      "  adapters: [{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, dropout: 0, "
      "target_modules: [q_proj, v_proj]}}]\n";
  expect_replayed({"lora", kDapo, kDapoReplay, lora});
  for (const std::string strategy : {"ddp", "fsdp"}) {
    const std::string parallel = "  parallel: {component_key: parallel, variant_key: " + strategy + "}\n";
    expect_replayed({strategy, kDapo, kDapoReplay, parallel, 2});
    expect_replayed({"lora-" + strategy, kDapo, kDapoReplay, lora + parallel, 2});
  }
}

// Tensor-parallel peers draw the same tokens from the same logits: the run is the one-rank run's.
TEST_F(GrpoTraining, TensorParallelRanksSampleAsOneRank) {
  const Case one{"one", kDapo, kDapoReplay, ""}, tp{"tp", kDapo, kDapoReplay, "", 2, 2};
  train(one);
  expect_replayed(tp);
  std::ifstream a(run_dir(one) + "/rollouts.jsonl"), b(run_dir(tp) + "/rollouts.jsonl");
  const std::string ours((std::istreambuf_iterator<char>(b)), {}), theirs((std::istreambuf_iterator<char>(a)), {});
  EXPECT_EQ(ours, theirs);
}

// A checkpoint after the first of a rollout's two steps holds the rollout: the resumed run's last
// steps, weights and rollouts.jsonl are the whole run's, byte for byte.
TEST_F(GrpoTraining, ResumesBitExactInsideARollout) {
  const Case c{"resume", kDapo, kDapoReplay, ""};
  const std::string spec_path = spec(c);
  std::string out;
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + spec_path + " --set checkpoint.every_steps=1", out), 0) << out;
  const std::string run = run_dir(c);
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string weights = read(run + "/exports/step_00000003/model.safetensors");
  const std::string rollouts = read(run + "/rollouts.jsonl");
  const auto metrics = read_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + spec_path + " --set checkpoint.every_steps=1 --resume " +
                            run + "/checkpoints/step_00000001",
                        out),
            0)
      << out;
  EXPECT_EQ(read(run + "/exports/step_00000003/model.safetensors"), weights);
  EXPECT_EQ(read(run + "/rollouts.jsonl"), rollouts);
  const auto resumed = read_metrics(run + "/metrics.jsonl");
  ASSERT_EQ(resumed.size(), 3u);
  for (std::size_t s = 1; s < 3; ++s) EXPECT_EQ(resumed[s]["loss"], metrics[s]["loss"]) << "step " << s + 1;
}

// rollouts.jsonl's lines and TRL's metric names.
TEST_F(GrpoTraining, LogsRolloutsAndTrlsMetrics) {
  const Case c{"logs", "beta: 0.04", "", ""};
  train(c);
  std::ifstream in(run_dir(c) + "/rollouts.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 24u) << "8 completions a step, 3 steps";
  for (const auto& line : lines) {
    for (const char* key : {"step", "prompt_index", "prompt_ids", "completion_ids", "completion", "rewards", "reward", "advantage"}) {
      EXPECT_TRUE(line.contains(key)) << key << " in " << line;
    }
    EXPECT_EQ(line["completion_ids"].size(), 8u) << "no EOS: every completion runs to max_completion_length";
    EXPECT_TRUE(line["rewards"].contains("math_answer") && line["rewards"].contains("regex")) << line;
  }
  EXPECT_EQ(lines[0]["prompt_index"], 0);
  EXPECT_EQ(lines[4]["prompt_index"], 1) << "4 completions of each prompt in a row";
  const auto metrics = read_metrics(run_dir(c) + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  for (const char* name : {"reward", "reward_std", "rewards/math_answer/mean", "rewards/regex/mean", "frac_reward_zero_std",
                           "completions/mean_length", "completions/clipped_ratio", "kl", "clip_ratio/low_mean",
                           "clip_ratio/high_mean", "entropy"}) {
    EXPECT_TRUE(metrics[0].contains(name)) << name << " in " << metrics[0];
  }
  EXPECT_EQ(metrics[0]["completions/clipped_ratio"], 1.0);
  EXPECT_EQ(metrics[0]["completions/mean_length"], 8.0);
  double regex_mean = 0;
  for (std::size_t i = 0; i < 8; ++i) regex_mean += lines[i]["rewards"]["regex"].get<double>() / 8;
  EXPECT_NEAR(metrics[0]["rewards/regex/mean"].get<double>(), regex_mean, 1e-6);
}

// A spec that cannot run says why, naming what to change, and exits non-zero.
TEST_F(GrpoTraining, RefusesWhatCannotRun) {
  const Case c{"bad", "beta: 0.0", "", ""};
  const std::string spec_path = spec(c);
  std::string out;
  EXPECT_NE(run_command(testing::tessera_binary() + " train " + spec_path + " --set trainer.micro_batch_size=3", out), 0);
  EXPECT_NE(out.find("must be whole groups"), std::string::npos) << out;
  EXPECT_NE(run_command(testing::tessera_binary() + " train " + spec_path +
                            " --set components.loss.config.reward_weights=[1.0]",
                        out),
            0);
  EXPECT_NE(out.find("one weight per reward"), std::string::npos) << out;
}

}  // namespace grpo_training_test
}  // namespace tessera
