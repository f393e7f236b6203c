// The Hugging Face interop tests' fixture: transformers (and peft) in the project's .venv as the
// reference (tools/interop/hf_reference.py; tools/setup.sh installs them), run specs over token
// files read in order, and `tessera eval` of them. hf_interop_test.cpp and lora_test.cpp use it.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "reference_process.hpp"
#include "test_support.hpp"

namespace tessera {

constexpr double kLossTolerance = 1e-5;  // relative, fp32 (the contract)
constexpr std::int64_t kSeqLen = 32;

class HfInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!python_has({"transformers", "safetensors"})) {
      GTEST_SKIP() << "transformers is not installed in .venv (tools/setup.sh installs it)";
    }
  }

  bool python_has(const std::vector<std::string>& modules) const { return testing::python_has(python_, modules); }

  // Runs hf_reference.py; fails the test (with its output) unless it exits 0. Returns stdout's
  // last line. The commands go to one hf_reference.py process per test (tools/interop/serve.py),
  // started on the first: torch and transformers are imported once, not once per command.
  std::string reference(const std::string& args) {
    if (!reference_process_) {
      reference_process_ = std::make_unique<testing::ReferenceProcess>(
          python_, testing::source_dir() + "/tools/interop/serve.py",
          testing::source_dir() + "/tools/interop/hf_reference.py", dir_.file("python.err"));
    }
    std::string out;
    const int rc = reference_process_->run(args, out);
    std::string err;
    run_command("cat " + dir_.file("python.err"), err);
    EXPECT_EQ(rc, 0) << args << "\n" << out << err;
    return last_line(out);
  }

  double reference_loss(const std::string& folder, const std::string& tokens, const std::string& extra = "") {
    const std::string line = reference("loss " + folder + " --tokens " + tokens + " --seq-len " +
                                       std::to_string(kSeqLen) + " --batch 4 --batches 3 " + extra);
    return line.empty() ? NAN : nlohmann::json::parse(line).at("loss").get<double>();
  }

  // A run spec: `model` is the model's YAML, the data `tokens` read in order.
  std::string spec(const std::string& name, const std::string& model, const std::string& tokens,
                   const std::string& parallel = "") {
    return dir_.write(name + ".yaml",
                      "name: " + name + "\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" +
                          "settings: {seed: 1, run_dir: " + dir_.file("runs/" + name) + ", device: cpu}\n" +
                          "components:\n  model: " + model + "\n" +
                          "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " + tokens +
                          ", dtype: uint16, seq_len: " + std::to_string(kSeqLen) + ", shuffle: false}}\n" +
                          "  loss: {component_key: loss, variant_key: cross_entropy}\n" +
                          "  optimizer: {component_key: optimizer, variant_key: adamw, config: {lr: 1.0e-3, "
                          "beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1, implementation: loop, "
                          "model: {instance_key: model, pass_type: BY_REFERENCE}}}\n" +
                          parallel + "trainer: {max_steps: 3, micro_batch_size: 4, clip_grad_norm: 0}\n");
  }

  // `tessera eval` over the first 3 batches of 4 windows: the printed loss.
  double tessera_eval(const std::string& spec_path, const std::string& extra = "") {
    std::string out;
    const int rc = run_command("(" + testing::tessera_binary() + " eval " + spec_path + " --split train --batches 3 " +
                                   extra + " 2>/dev/null)",
                               out);
    EXPECT_EQ(rc, 0) << out;
    const nlohmann::json result = nlohmann::json::parse(last_line(out), nullptr, false);
    EXPECT_TRUE(result.is_object()) << out;
    if (!result.is_object()) return NAN;
    EXPECT_EQ(result.value("tokens", 0), 3 * 4 * kSeqLen);
    EXPECT_EQ(result.value("batches", 0), 3);
    return result.value("loss", NAN);
  }

  static std::string last_line(const std::string& text) {
    std::string trimmed = text;
    while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
    const auto pos = trimmed.rfind('\n');
    return pos == std::string::npos ? trimmed : trimmed.substr(pos + 1);
  }

  static double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

  // The same 3 steps of `model` trained with an hf export on one rank accumulating two
  // micro-batches and on 2 ranks with parallelism.ep 2 (the same steps, where the model has no
  // balance loss: a micro-batch statistic): for each, its output, export folder, the export's
  // loss in transformers (loaded --strict), and `tessera eval` of its checkpoint against it.
  struct ExpertParallelRun {
    std::string output, exported;
    double exported_loss = NAN;
  };
  std::array<ExpertParallelRun, 2> one_rank_and_ep2(const std::string& name, const std::string& model,
                                                    const std::string& tokens) {
    std::array<ExpertParallelRun, 2> runs;
    for (const int ranks : {1, 2}) {
      ExpertParallelRun& run = runs[static_cast<std::size_t>(ranks - 1)];
      const std::string run_name = name + "-ranks" + std::to_string(ranks);
      const std::string path = spec(run_name, model, tokens);
      const std::string train = " train " + path + " --set checkpoint.export_format=hf";
      const int rc = run_command(testing::tessera_binary() +
                                     (ranks == 1 ? train + " --set trainer.grad_accum=2"
                                                 : " launch --nproc-per-node 2 --" + train + " --set parallelism.ep=2"),
                                 run.output);
      EXPECT_EQ(rc, 0) << run.output;
      if (rc != 0) continue;
      run.exported = dir_.file("runs/" + run_name + "/exports/step_00000003");
      run.exported_loss = reference_loss(run.exported, tokens, "--strict");
      EXPECT_LT(relative(tessera_eval(path, "--resume auto"), run.exported_loss), kLossTolerance) << run_name;
    }
    return runs;
  }

  // Defined below with the tests that use it.
  void two_ranks_export_what_one_rank_does(const std::string& mesh, const std::string& eval_mesh = "",
                                           const std::string& both = "");

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
  TempDir dir_;
  std::unique_ptr<testing::ReferenceProcess> reference_process_;  // before dir_ goes: declared after it
};

// HfInterop with peft, and a Llama made in Python (2 key/value heads) in base_: where DPO and GRPO
// train and their PyTorch + PEFT references start.
class LlamaWithPeft : public HfInterop {
 protected:
  void SetUp() override {
    HfInterop::SetUp();
    if (IsSkipped()) return;
    if (!python_has({"peft"})) GTEST_SKIP() << "peft is not installed in .venv (tools/setup.sh installs it)";
    base_ = dir_.file("llama");
    reference("make-llama " + base_ + " --kv-heads 2");
  }

  std::string base_;
};

inline std::string model_yaml(const std::string& variant, const std::string& folder, const std::string& extra = "") {
  return "{component_key: model, variant_key: " + variant + ", config: {init_from: " + folder + extra + "}}";
}

}  // namespace tessera
