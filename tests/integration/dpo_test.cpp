// loss/dpo against plain PyTorch + PEFT (tools/interop/dpo_reference.py): a Llama made in Python,
// LoRA adapters, dataset/preference_jsonl's pairs; every step's loss (and TRL's reward metrics) of
// `tessera train` equals the reference's AdamW steps on the same pairs with TRL's formula for the
// sigmoid (with label smoothing), ipo and hinge losses, on one rank accumulating two micro-batches
// and on two Gloo ranks with ddp and with fsdp; the reference is the base with the adapters off.
// With full fine-tuning the reference is a frozen copy of the starting weights (TRL's ref_model).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "test_support.hpp"

namespace tessera {
namespace dpo_test {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;

class Dpo : public LlamaWithPeft {
 protected:
  void SetUp() override {
    LlamaWithPeft::SetUp();
    if (IsSkipped()) return;
    std::string lines;
    const char* const prompts[] = {"2+2=", "capital of France?", "say hi", "sky colour", "1,2,3,", "opposite of up",
                                   "cats say", "water is", "3*3=", "first letter", "sun rises in", "ice is"};
    const char* const chosen[] = {"4", "Paris", "hi!", "blue", "4", "down", "meow", "wet", "9", "a", "the east", "cold"};
    const char* const rejected[] = {"5", "Lyon", "no", "green", "7", "left", "woof", "dry", "6", "z", "the west", "hot"};
    for (int i = 0; i < 12; ++i) {
      lines += nlohmann::json{{"prompt", prompts[i]}, {"chosen", chosen[i]}, {"rejected", rejected[i]}}.dump() + "\n";
    }
    pairs_ = dir_.write("pairs.jsonl", lines);
  }

  std::string dpo_spec(const std::string& name, const std::string& loss, bool adapters = true,
                       const std::string& model = "", const std::string& extra = "") {
    return dir_.write(
        name + ".yaml",
        "name: " + name + "\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" + "settings: {seed: 1, run_dir: " +
            dir_.file("runs/" + name) + ", device: cpu}\n" + "components:\n  model: " + (model.empty() ? model_yaml("llama", base_) : model) +
            "\n" +
            (adapters ? "  adapters: [{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, "
                        "dropout: 0, target_modules: [q_proj, v_proj]}}]\n"
                      : "") +
            "  train_data: {component_key: dataset, variant_key: preference_jsonl, config: {path: " + pairs_ +
            ", tokenizer: {component_key: tokenizer, variant_key: bytes}, seq_len: 40, shuffle: false}}\n" +
            "  loss: {component_key: loss, variant_key: dpo, config: " + loss + "}\n" +
            "  optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: 1.0e-2, beta1: 0.9, beta2: "
            "0.999, eps: 1.0e-8, weight_decay: 0, implementation: loop, model: {instance_key: model, pass_type: "
            "BY_REFERENCE}}}\n" +
            "trainer: {max_steps: 3, micro_batch_size: 4, clip_grad_norm: 0}\n" +
            (adapters ? "checkpoint: {export_format: peft, export_every_steps: 1}\n" : "") + extra);
  }

  // The reference's losses and metrics for the adapter of `run`'s first export (its lora_A is
  // the starting one: with lora_B zero, the first step leaves A as it was); run "-": full
  // fine-tuning.
  nlohmann::json python(const std::string& run, const std::string& args, const std::string& base = "") {
    const std::string adapter = run == "-" ? "-" : dir_.file("runs/" + run + "/exports/step_00000001");
    if (!dpo_process_) {  // one process for the test's references (tools/interop/serve.py)
      dpo_process_ = std::make_unique<testing::ReferenceProcess>(
          python_, testing::source_dir() + "/tools/interop/serve.py",
          testing::source_dir() + "/tools/interop/dpo_reference.py", dir_.file("dpo_reference.err"));
    }
    std::string out, err;
    const int rc = dpo_process_->run((base.empty() ? base_ : base) + " " + adapter + " " + pairs_ +
                                         " --steps 3 --pairs-per-step 4 --lr 1e-2 " + args,
                                     out);
    run_command("cat " + dir_.file("dpo_reference.err"), err);
    EXPECT_EQ(rc, 0) << out << err;
    return nlohmann::json::parse(last_line(out), nullptr, false);
  }

  static void expect_steps_equal(const std::vector<nlohmann::json>& metrics, const nlohmann::json& reference,
                                 const std::string& what) {
    ASSERT_EQ(metrics.size(), 3u) << what;
    ASSERT_TRUE(reference.is_object()) << what;
    for (std::size_t s = 0; s < 3; ++s) {
      SCOPED_TRACE(what + " step " + std::to_string(s + 1));
      EXPECT_NEAR(metrics[s]["loss"].get<double>(), reference["losses"][s].get<double>(), kTolerance);
      for (const char* name : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                               "logps/chosen", "logps/rejected"}) {
        ASSERT_TRUE(metrics[s].contains(name)) << name;
        // A completion's log-probability sums some twenty terms (about -25): 1e-4 of it.
        const double expected = reference["metrics"][s][name].get<double>();
        EXPECT_NEAR(metrics[s][name].get<double>(), expected, kTolerance * std::max(1.0, std::abs(expected))) << name;
      }
    }
  }

  std::string pairs_;
  std::unique_ptr<testing::ReferenceProcess> dpo_process_;  // ends before the fixture's files go
};

TEST_F(Dpo, EveryLossTypesStepsEqualPyTorchsWithTheBaseAsReference) {
  for (const auto& [name, loss, args] :
       {std::tuple<std::string, std::string, std::string>{"sigmoid", "{beta: 0.1, label_smoothing: 0.1}",
                                                          "--beta 0.1 --label-smoothing 0.1"},
        {"ipo", "{beta: 0.5, loss_type: ipo}", "--beta 0.5 --loss-type ipo"},
        {"hinge", "{beta: 0.1, loss_type: hinge}", "--beta 0.1 --loss-type hinge"}}) {
    SCOPED_TRACE(name);
    std::string out;
    // One rank accumulating two micro-batches of 2 pairs: the step's 4 pairs.
    ASSERT_EQ(run_command(testing::tessera_binary() + " train " + dpo_spec(name, loss) + " --set trainer.grad_accum=2", out),
              0)
        << out;
    const auto metrics = read_metrics(dir_.file("runs/" + name + "/metrics.jsonl"));
    expect_steps_equal(metrics, python(name, args), name);
    EXPECT_NE(metrics[0]["loss"].get<double>(), metrics[2]["loss"].get<double>()) << "training changed nothing";
  }
}

TEST_F(Dpo, TwoRanksWithDdpAndFsdpTakeTheMeanOverAllPairsOfTheStep) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    const std::string name = "ranks2-" + strategy;
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() + " launch --nproc-per-node 2 -- train " +
                              dpo_spec(name, "{beta: 0.1}") +
                              " --set components.parallel.component_key=parallel --set components.parallel.variant_key=" +
                              strategy,
                          out),
              0)
        << out;
    expect_steps_equal(read_metrics(dir_.file("runs/" + name + "/metrics.jsonl")), python(name, "--beta 0.1"), name);
  }
}

// Full fine-tuning: every weight trained, the reference a frozen copy of the starting weights
// that the strategy holds as it holds the parameters (each rank its shard under fsdp); the Python
// reference is TRL's separate ref_model. One rank accumulating two micro-batches, then two ranks
// with fsdp saving every step; its step-1 checkpoint resumed on one rank goes on comparing with
// the same reference (not with the weights it resumed from). Resuming from a checkpoint that has
// no reference (an SFT run's) is one clear error.
TEST_F(Dpo, FullFineTuningComparesWithAFrozenCopyOfTheStartingWeights) {
  const nlohmann::json expected = python("-", "--beta 0.1");
  ASSERT_TRUE(expected.is_object());
  std::string out;
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + dpo_spec("full1", "{beta: 0.1}", false) +
                            " --set trainer.grad_accum=2",
                        out),
            0)
      << out;
  const auto one = read_metrics(dir_.file("runs/full1/metrics.jsonl"));
  expect_steps_equal(one, expected, "full fine-tuning, 1 rank");
  // The copy is held beside the parameters: twice the model's fp32 bytes on one rank.
  const double model_bytes = 4 * one[0]["parameters"].get<double>();
  EXPECT_EQ(one[0]["parameter_bytes"].get<double>(), 2 * model_bytes);

  // In bf16 the reference forward's weight casts must not be reused by the policy's forward
  // (autocast caches them per weight): the rewards then move away from zero as in fp32.
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + dpo_spec("full1-bf16", "{beta: 0.1}", false) +
                            " --set trainer.grad_accum=2 --set settings.precision=bf16",
                        out),
            0)
      << out;
  const auto bf16 = read_metrics(dir_.file("runs/full1-bf16/metrics.jsonl"));
  ASSERT_EQ(bf16.size(), 3u);
  // Step 1: the policy is the reference, computed alike.
  EXPECT_EQ(bf16[0]["rewards/chosen"].get<double>(), 0.0);
  EXPECT_EQ(bf16[0]["rewards/rejected"].get<double>(), 0.0);
  for (std::size_t s = 1; s < 3; ++s) {
    SCOPED_TRACE("bf16 step " + std::to_string(s + 1));
    // bf16's rounding of summed log-probabilities (about -25) moves a margin by a few hundredths.
    EXPECT_NEAR(bf16[s]["rewards/margins"].get<double>(), expected["metrics"][s]["rewards/margins"].get<double>(),
                0.05);
    EXPECT_GT(std::abs(bf16[s]["rewards/chosen"].get<double>()), 0.01);
  }

  for (const std::string strategy : {"ddp", "fsdp"}) {
    ASSERT_EQ(run_command(testing::tessera_binary() + " launch --nproc-per-node 2 -- train " +
                              dpo_spec("full2-" + strategy, "{beta: 0.1}", false) +
                              " --set components.parallel.component_key=parallel"
                              " --set components.parallel.variant_key=" + strategy +
                              " --set checkpoint.every_steps=1 --set checkpoint.export_at_end=false",
                          out),
              0)
        << out;
    const auto two = read_metrics(dir_.file("runs/full2-" + strategy + "/metrics.jsonl"));
    expect_steps_equal(two, expected, "full fine-tuning, 2 ranks, " + strategy);
    if (strategy == "fsdp") {
      // Sharded: each rank holds half of the parameters and half of the copy (and unit padding).
      EXPECT_LT(two[0]["parameter_bytes"].get<double>(), 1.05 * model_bytes);
    } else {
      EXPECT_EQ(two[0]["parameter_bytes"].get<double>(), 2 * model_bytes);
    }
  }
  const std::string checkpoint = dir_.file("runs/full2-fsdp/checkpoints/step_00000001");
  EXPECT_TRUE(fs::exists(checkpoint + "/reference.safetensors")) << out;

  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + dpo_spec("resumed", "{beta: 0.1}", false) +
                            " --set trainer.grad_accum=2 --resume " + checkpoint,
                        out),
            0)
      << out;
  const auto resumed = read_metrics(dir_.file("runs/resumed/metrics.jsonl"));
  ASSERT_EQ(resumed.size(), 2u) << out;
  for (std::size_t s = 0; s < 2; ++s) {
    SCOPED_TRACE("resumed on 1 rank, step " + std::to_string(s + 2));
    EXPECT_NEAR(resumed[s]["loss"].get<double>(), expected["losses"][s + 1].get<double>(), kTolerance);
    EXPECT_NEAR(resumed[s]["rewards/margins"].get<double>(), expected["metrics"][s + 1]["rewards/margins"].get<double>(),
                kTolerance);
  }

  // A cross-entropy run over the same pairs writes a checkpoint with no reference model in it.
  ASSERT_EQ(run_command(testing::tessera_binary() + " train " + dpo_spec("sft", "{beta: 0.1}", false) +
                            " --set components.loss.variant_key=cross_entropy --set components.loss.config={}"
                            " --set trainer.max_steps=1 --set checkpoint.export_at_end=false",
                        out),
            0)
      << out;
  const std::string sft = dir_.file("runs/sft/checkpoints/step_00000001");
  ASSERT_TRUE(fs::exists(sft + "/metadata.json")) << out;
  EXPECT_FALSE(fs::exists(sft + "/reference.safetensors"));
  EXPECT_NE(run_command(testing::tessera_binary() + " train " + dpo_spec("dpo-on-sft", "{beta: 0.1}", false) +
                            " --resume " + sft,
                        out),
            0);
  EXPECT_NE(out.find("holds no reference model"), std::string::npos) << out;
  EXPECT_NE(out.find("init_from"), std::string::npos) << out;
}

// The new families through the same trainer path: a routed Qwen3-MoE (a dense first block) and a
// DeepSeek-V3 (latent attention, grouped routing), fully fine-tuned on one rank accumulating two
// micro-batches; the reference forward in evaluation mode leaves the routers' statistics alone.
TEST_F(Dpo, RoutedQwen3MoeAndDeepSeekV3StepsEqualPyTorchs) {
  const std::string qwen = dir_.file("qwen3_moe"), deepseek = dir_.file("deepseek_v3");
  reference("make-qwen3-moe " + qwen + " --norm-topk");
  reference("make-deepseek-v3 " + deepseek + " --groups 2 --groups-kept 1 --seed 3");
  for (const auto& [name, variant, folder] : {std::tuple<std::string, std::string, std::string>{"qwen3-moe", "qwen3_moe", qwen},
                                              {"deepseek-v3", "deepseek_v3", deepseek}}) {
    SCOPED_TRACE(name);
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() + " train " +
                              dpo_spec(name, "{beta: 0.1}", false, model_yaml(variant, folder, ", aux_loss_coef: 0")) +
                              " --set trainer.grad_accum=2",
                          out),
              0)
        << out;
    const auto metrics = read_metrics(dir_.file("runs/" + name + "/metrics.jsonl"));
    expect_steps_equal(metrics, python("-", "--beta 0.1", folder), name);
    EXPECT_NE(metrics[1]["rewards/margins"].get<double>(), 0.0) << "the policy moved from the reference";
  }
}

// Evaluating loss/dpo on held-out pairs: the evaluation callback (at the end of training) and
// `tessera eval` of the run's last checkpoint run the reference pass and report TRL's evaluation
// metrics, equal to plain PyTorch's on the same weights: the PEFT export over the base (the
// reference, adapters off), and for full fine-tuning the hf export against the starting
// weights, which `tessera eval` reads back from the checkpoint's frozen copy.
TEST_F(Dpo, EvaluationReportsTrlsMetricsOnHeldOutPairsAsPyTorch) {
  std::string lines;
  const char* const prompts[] = {"5+5=", "capital of Spain?", "say bye", "grass colour", "a,b,c,", "opposite of in"};
  const char* const chosen[] = {"10", "Madrid", "bye!", "green", "d", "out"};
  const char* const rejected[] = {"11", "Rome", "hello", "red", "z", "on"};
  for (int i = 0; i < 6; ++i) {
    lines += nlohmann::json{{"prompt", prompts[i]}, {"chosen", chosen[i]}, {"rejected", rejected[i]}}.dump() + "\n";
  }
  const std::string held_out = dir_.write("held_out.jsonl", lines);
  const std::string evaluation =
      "  callbacks:\n    - component_key: callback\n      variant_key: evaluation\n      config:\n"
      "        name: eval\n        every: 0\n        batches: 3\n        micro_batch_size: 4\n"
      "        loss: {instance_key: loss, pass_type: BY_REFERENCE}\n"
      "        data: {component_key: dataset, variant_key: preference_jsonl, config: {path: " + held_out +
      ", tokenizer: {component_key: tokenizer, variant_key: bytes}, seq_len: 40, shuffle: false}}\n";
  for (const bool adapters : {true, false}) {
    const std::string name = adapters ? "eval-lora" : "eval-full";
    SCOPED_TRACE(name);
    // The callbacks go under components (the spec's last section before trainer: is components').
    std::string spec_text;
    {
      const std::string plain = dpo_spec(name + "-plain", "{beta: 0.1}", adapters);
      std::ifstream in(plain);
      spec_text.assign(std::istreambuf_iterator<char>(in), {});
      const std::size_t trainer = spec_text.find("trainer:");
      spec_text.insert(trainer, evaluation);
      spec_text += adapters ? "" : "checkpoint: {export_format: hf, export_every_steps: 3}\n";
      spec_text = std::regex_replace(spec_text, std::regex(name + "-plain"), name);
    }
    const std::string spec = dir_.write(name + ".yaml", spec_text);
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() + " train " + spec + " --set checkpoint.every_steps=3 2>&1", out), 0)
        << out;
    const std::string run = dir_.file("runs/" + name);
    const std::string export_dir = run + "/exports/step_00000003";
    nlohmann::json expected;
    {
      std::string err;
      if (!dpo_process_) {
        dpo_process_ = std::make_unique<testing::ReferenceProcess>(
            python_, testing::source_dir() + "/tools/interop/serve.py",
            testing::source_dir() + "/tools/interop/dpo_reference.py", dir_.file("dpo_reference.err"));
      }
      const std::string args = adapters ? "eval - " + base_ + " " + held_out + " --adapter " + export_dir
                                        : "eval " + export_dir + " " + base_ + " " + held_out;
      ASSERT_EQ(dpo_process_->run(args + " --beta 0.1", out), 0) << out;
      expected = nlohmann::json::parse(last_line(out));
    }
    const auto close = [](double got, double want) { return std::abs(got - want) <= 1e-5 * std::max(1.0, std::abs(want)); };
    // `tessera eval` of the last checkpoint.
    ASSERT_EQ(run_command("(" + testing::tessera_binary() + " eval " + spec + " --resume " + run +
                              "/checkpoints/step_00000003 --batches 3 2>/dev/null)",
                          out),
              0)
        << out;
    const auto tessera = nlohmann::json::parse(out.substr(out.rfind('{')));
    EXPECT_TRUE(close(tessera.at("loss").get<double>(), expected["loss"].get<double>())) << out << "\n" << expected;
    // The evaluation callback's at the end of training, in metrics.jsonl.
    nlohmann::json at_end;
    std::ifstream metrics(run + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const auto row = nlohmann::json::parse(line);
      if (row.contains("eval")) at_end = row;
    }
    ASSERT_TRUE(at_end.is_object()) << "no evaluation in " << run << "/metrics.jsonl";
    EXPECT_TRUE(close(at_end.at("eval/loss").get<double>(), expected["loss"].get<double>())) << at_end;
    for (const char* metric : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                               "logps/chosen", "logps/rejected"}) {
      const double want = expected[metric].get<double>();
      EXPECT_TRUE(close(tessera.at(std::string("eval_") + metric).get<double>(), want)) << metric << ": " << out;
      EXPECT_TRUE(close(at_end.at(std::string("eval/") + metric).get<double>(), want)) << metric << ": " << at_end;
    }
    EXPECT_GT(std::abs(expected["rewards/margins"].get<double>()), 1e-3) << "training moved the policy";

    // `tessera plan` counts the frozen copy: as many bytes as the parameters, which the run held
    // beside them.
    ASSERT_EQ(run_command("(" + testing::tessera_binary() + " plan " + spec + " --ranks 1 --json 2>/dev/null)", out), 0)
        << out;
    const auto plan = nlohmann::json::parse(out);
    ASSERT_FALSE(plan["meshes"].empty()) << out;
    const auto& largest = plan["meshes"][0]["largest"];
    const auto measured = read_metrics(run + "/metrics.jsonl");
    ASSERT_FALSE(measured.empty());
    if (adapters) {
      EXPECT_EQ(largest["reference_bytes"].get<double>(), 0.0) << "the base with adapters off is the reference";
    } else {
      EXPECT_EQ(largest["reference_bytes"].get<double>(), largest["parameter_bytes"].get<double>()) << out;
      EXPECT_EQ(largest["parameter_bytes"].get<double>() + largest["reference_bytes"].get<double>(),
                measured[0]["parameter_bytes"].get<double>());
    }
  }
}

}  // namespace dpo_test
}  // namespace tessera
