// LoRA (adapter/lora) against PEFT and transformers themselves (tools/interop/hf_reference.py):
// a Llama and a GPT-2 made in Python, imported by init_from and LoRA-trained by `tessera train`;
// the PEFT export loads in peft over the untouched base with the loss `tessera eval` gives, the
// merged Hugging Face export loads in transformers with that loss too, the base weights stay
// bit-identical to the imported ones and only the adapters hold optimizer state. An adapter
// continues from its PEFT or Tessera export; LoRA on 2 Gloo ranks (fsdp, zero2, zero1, ddp) equals one
// rank, and so does LoRA on 2 pipeline stages, exports included; bf16 with activation checkpointing and a mixture of experts train only the adapters; a
// target naming no layer is one positioned error.
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/formats/safetensors.hpp"
#include "tessera/components/model.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/generation/generate.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace lora_test {

const std::string kFsdp =
    " --set components.parallel.component_key=parallel --set components.parallel.variant_key=fsdp";
const std::string kLora =
    "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
    "down_proj]}}";

// GPT-2's fused attention, its output projection and the MLP's first layer.
const std::string kGpt2Lora =
    "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [c_attn, attn.c_proj, "
    "c_fc]}}";

class Lora : public HfInterop {
 protected:
  void SetUp() override {
    HfInterop::SetUp();
    if (IsSkipped()) return;
    if (!python_has({"peft"})) GTEST_SKIP() << "peft is not installed in .venv (tools/setup.sh installs it)";
    tokens_ = dir_.file("tokens.bin");
    reference("tokens " + tokens_ + " --count 20000 --vocab 256");
  }

  // The model YAML followed by components.adapters (spec() writes it under components:).
  static std::string adapted(const std::string& model, const std::string& adapters) {
    return model + "\n  adapters: [" + adapters + "]";
  }

  int train(const std::string& spec_path, const std::string& extra, std::string& out) {
    return run_command(testing::tessera_binary() + " train " + spec_path + " " + extra, out);
  }
  // `tessera train` on `ranks` Gloo ranks (`tessera launch`).
  int launch(int ranks, const std::string& spec_path, const std::string& extra, std::string& out) {
    return run_command(testing::tessera_binary() + " launch --nproc-per-node " + std::to_string(ranks) + " -- train " +
                           spec_path + " " + extra,
                       out);
  }

  std::string run_dir(const std::string& name) const { return dir_.file("runs/" + name); }
  std::string exported(const std::string& name) const { return run_dir(name) + "/exports/step_00000003"; }

  std::string tokens_;
};

// The base's tensors by Tessera's names (a Llama's: model.X is X) in the run's last checkpoint
// are the imported ones, bit for bit; returns the checkpoint's adapter tensors' element count.
std::int64_t base_is_untouched(const std::string& checkpoint, const std::string& base_folder) {
  const StateDict saved = read_safetensors(checkpoint + "/model.safetensors").tensors;
  const HfCheckpoint base = read_hf_checkpoint(base_folder);
  std::int64_t adapter_elements = 0, compared = 0;
  for (const auto& [name, tensor] : saved) {
    if (name.find(".lora_") != std::string::npos) {
      adapter_elements += tensor.numel();
      continue;
    }
    const std::string hf = name.rfind("lm_head.", 0) == 0 ? name : "model." + name;
    const auto it = base.tensors.find(hf);
    if (it == base.tensors.end()) continue;  // buffers (rotary tables)
    EXPECT_TRUE(at::equal(tensor, it->second)) << name << " changed";
    ++compared;
  }
  EXPECT_GT(compared, 10) << "the checkpoint holds the base's tensors";
  return adapter_elements;
}

TEST_F(Lora, LlamaPeftAndMergedExportsGiveTesserasLossOverAnUntouchedBase) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  const double base_loss = reference_loss(base, tokens_);
  for (const std::string format : {"peft", "hf"}) {
    SCOPED_TRACE(format);
    const std::string name = "llama-" + format;
    const std::string path = spec(name, adapted(model_yaml("llama", base), kLora), tokens_,
                                  "checkpoint: {export_format: " + format + "}\n");
    std::string out;
    ASSERT_EQ(train(path, "", out), 0) << out;
    const double tessera = tessera_eval(path, "--resume auto");
    const std::string folder = exported(name);
    double reference_value = NAN;
    if (format == "peft") {
      EXPECT_TRUE(fs::exists(folder + "/adapter_config.json"));
      EXPECT_FALSE(fs::exists(folder + "/model.safetensors")) << "a PEFT folder holds the adapter alone";
      reference_value = reference_loss(base, tokens_, "--adapter " + folder);
    } else {
      reference_value = reference_loss(folder, tokens_, "--strict");  // merged: a plain Llama
    }
    EXPECT_LT(relative(tessera, reference_value), kLossTolerance) << "tessera " << tessera << ", python " << reference_value;
    EXPECT_GT(relative(reference_value, base_loss), 1e-4) << "training changed nothing";

    const std::int64_t adapters = base_is_untouched(run_dir(name) + "/checkpoints/step_00000003", base);
    // 2 layers x (q_proj 64->64, v_proj 64->32, down_proj 128->64) at rank 4: A [4, in] + B [out, 4].
    EXPECT_EQ(adapters, 2 * ((4 * 64 + 64 * 4) + (4 * 64 + 32 * 4) + (4 * 128 + 64 * 4)));
    const auto metrics = read_metrics(run_dir(name) + "/metrics.jsonl");
    ASSERT_EQ(metrics.size(), 3u);
    EXPECT_EQ(metrics[0]["trainable_parameters"].get<double>(), adapters);
    EXPECT_GT(metrics[0]["parameters"].get<double>(), 10 * adapters);
    // AdamW's two fp32 moments of the adapters, nothing of the base; the frozen base is held all the same.
    EXPECT_EQ(metrics[0]["optimizer_bytes"].get<double>(), 2 * 4 * adapters) << metrics[0].dump();
    EXPECT_EQ(metrics[0]["parameter_bytes"].get<double>(), 4 * metrics[0]["parameters"].get<double>());
  }
}

// Qwen3 (per-head q/k norms, head_dim of its own, attention biases): the PEFT export of a LoRA
// run loads over the untouched base in peft with Tessera's loss.
TEST_F(Lora, Qwen3PeftExportLoadsOverTheBaseWithTesserasLoss) {
  const std::string base = dir_.file("qwen3");
  reference("make-qwen3 " + base + " --attention-bias");
  const std::string path =
      spec("qwen3-peft", adapted(model_yaml("qwen3", base), kLora), tokens_, "checkpoint: {export_format: peft}\n");
  std::string out;
  ASSERT_EQ(train(path, "", out), 0) << out;
  const std::string folder = exported("qwen3-peft");
  EXPECT_FALSE(fs::exists(folder + "/model.safetensors")) << "a PEFT folder holds the adapter alone";
  const double python = reference_loss(base, tokens_, "--adapter " + folder);
  EXPECT_LT(relative(tessera_eval(path, "--resume auto"), python), kLossTolerance);
  EXPECT_GT(relative(python, reference_loss(base, tokens_)), 1e-4) << "training changed nothing";
  const StateDict saved = read_safetensors(folder + "/adapter_model.safetensors").tensors;
  EXPECT_TRUE(saved.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  // q_proj of 4 heads of 24: B is [96, 4].
  EXPECT_EQ(saved.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").sizes(),
            (at::IntArrayRef{96, 4}));
  EXPECT_EQ(base_is_untouched(run_dir("qwen3-peft") + "/checkpoints/step_00000003", base),
            2 * ((4 * 64 + 96 * 4) + (4 * 64 + 48 * 4) + (4 * 128 + 64 * 4)));
}

TEST_F(Lora, Gpt2FusedAttentionAdapterLoadsInPeftWithTesserasLoss) {
  // c_attn is one fused q/k/v projection, stored transposed by GPT-2 (Conv1D: fan_in_fan_out).
  const std::string base = dir_.file("gpt2");
  reference("make-gpt2 " + base);
  const std::string adapter =
      "{component_key: adapter, variant_key: lora, config: {rank: 2, alpha: 4, target_modules: [c_attn, attn.c_proj, "
      "c_fc]}}";
  const std::string path =
      spec("gpt2", adapted(model_yaml("gpt", base), adapter), tokens_, "checkpoint: {export_format: peft}\n");
  std::string out;
  ASSERT_EQ(train(path, "", out), 0) << out;
  std::ifstream config_file(exported("gpt2") + "/adapter_config.json");
  const std::string config((std::istreambuf_iterator<char>(config_file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(nlohmann::json::parse(config)["fan_in_fan_out"], true) << config;
  const double python = reference_loss(base, tokens_, "--adapter " + exported("gpt2"));
  EXPECT_LT(relative(tessera_eval(path, "--resume auto"), python), kLossTolerance);
  EXPECT_GT(relative(python, reference_loss(base, tokens_)), 1e-4) << "training changed nothing";
  // attn.c_proj only: the MLP's c_proj keeps no adapter.
  const StateDict saved = read_safetensors(exported("gpt2") + "/adapter_model.safetensors").tensors;
  EXPECT_TRUE(saved.count("base_model.model.transformer.h.0.attn.c_proj.lora_A.weight"));
  EXPECT_FALSE(saved.count("base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight"));
  EXPECT_EQ(saved.at("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight").sizes(), (at::IntArrayRef{3 * 64, 2}));
}

TEST_F(Lora, AnAdapterContinuesFromItsPeftAndItsTesseraExport) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  std::string out;
  const std::string peft_run = spec("peft", adapted(model_yaml("llama", base), kLora), tokens_,
                                    "checkpoint: {export_format: peft}\n");
  ASSERT_EQ(train(peft_run, "", out), 0) << out;
  const std::string tessera_run = spec("tessera", adapted(model_yaml("llama", base), kLora), tokens_,
                                       "checkpoint: {export_format: tessera}\n");
  ASSERT_EQ(train(tessera_run, "", out), 0) << out;
  EXPECT_TRUE(fs::exists(exported("tessera") + "/adapters.safetensors")) << "the adapters apart from the base";
  const double trained = tessera_eval(peft_run, "--resume auto");
  EXPECT_DOUBLE_EQ(tessera_eval(tessera_run, "--resume auto"), trained) << "the same training";

  const std::string from_peft =
      "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
      "down_proj], init_from: " + exported("peft") + "}}";
  const std::string continued = spec("continued", adapted(model_yaml("llama", base), from_peft), tokens_);
  EXPECT_NEAR(tessera_eval(continued), trained, 1e-6 * trained) << "the PEFT folder's adapter, no training";
  // The Tessera export holds the base (init_from of the model) and the adapters (of the adapter).
  const std::string from_tessera =
      "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
      "down_proj], init_from: " + exported("tessera") + "}}";
  const std::string again = spec("again", adapted(model_yaml("llama", exported("tessera")), from_tessera), tokens_);
  EXPECT_NEAR(tessera_eval(again), trained, 1e-6 * trained);
  ASSERT_EQ(train(continued, "", out), 0) << "training goes on from the export: " << out;

  // An adapter of another rank is refused at its field.
  EXPECT_EQ(run_command(testing::tessera_binary() + " validate " + continued +
                            " --set components.adapters.0.config.rank=8",
                        out),
            2);
  EXPECT_NE(out.find("components.adapters[0].config.rank"), std::string::npos) << out;
  EXPECT_NE(out.find("set rank: 4"), std::string::npos) << out;
}

// Generation with an adapter: the PEFT export of a LoRA run, loaded over the base by Tessera
// (adapter init_from) and by peft, gives the same greedy completions of prompts of different
// lengths, batched through the KV cache on Tessera's side.
TEST_F(Lora, GreedyGenerationWithAnAdapterEqualsPeftGenerate) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  std::string out;
  const std::string run = spec("peft", adapted(model_yaml("llama", base), kLora), tokens_,
                               "checkpoint: {export_format: peft}\n");
  ASSERT_EQ(train(run, "--set components.optimizer.config.lr=0.05", out), 0) << out;
  const std::string from_peft =
      "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
      "down_proj], init_from: " + exported("peft") + "}}";
  core::seed_everything(1, "cpu");
  const auto built = testing::build_components("model: " + model_yaml("llama", base) + "\nadapters: [" + from_peft +
                                               "]\n");
  const auto model = testing::built<Model>(built, "model");
  const std::vector<std::vector<std::int64_t>> prompts = {{5, 17, 200, 31, 9}, {88, 1, 42, 42, 250, 7, 63}, {99}};
  std::vector<GenerationRequest> requests;
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt_ids = p;
    r.sampling.temperature = 0;
    r.max_new_tokens = 8;
    requests.push_back(r);
  }
  const std::vector<GenerationResult> ours = generate(*model, requests, {});
  const auto with_adapter = nlohmann::json::parse(
      reference("generate " + base + " --prompts " + nlohmann::json(prompts).dump() + " --max-new 8 --adapter " +
                exported("peft")));
  const auto without = nlohmann::json::parse(
      reference("generate " + base + " --prompts " + nlohmann::json(prompts).dump() + " --max-new 8"));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(ours[i].completion_ids, with_adapter[i].get<std::vector<std::int64_t>>()) << "prompt " << i;
  }
  EXPECT_NE(with_adapter, without) << "the trained adapter changes what the model says";
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The safetensors files of two export folders hold the same tensors, bit for bit, and their JSON
// files the same text.
void expect_same_exports(const std::string& folder, const std::string& expected) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(expected)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(folder + "/" + name));
    ++files;
    if (entry.path().extension() == ".json") {
      EXPECT_EQ(text_of(folder + "/" + name), text_of(entry.path().string()));
      continue;
    }
    const StateDict got = read_safetensors(folder + "/" + name).tensors;
    const StateDict want = read_safetensors(entry.path().string()).tensors;
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [tensor, value] : want) {
      ASSERT_TRUE(got.count(tensor)) << tensor;
      EXPECT_TRUE(at::equal(got.at(tensor), value)) << tensor;
    }
  }
  EXPECT_GE(files, 2);
}

// LoRA on 2 pipeline stages (the Llama's two blocks, one each): the losses of one rank, and the
// same PEFT folder and merged Hugging Face export, though each stage adapted only its own block;
// an adapter continues from a PEFT folder under the pipeline as on one rank, and `tessera
// validate` checks such a folder against the whole model, not the first stage's block.
TEST_F(Lora, PipelineStagesTrainAsOneRankAndExportTheWholeAdapter) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  std::string out;
  for (const std::string format : {"peft", "hf"}) {
    SCOPED_TRACE(format);
    const std::string path = spec(format, adapted(model_yaml("llama", base), kLora), tokens_,
                                  "checkpoint: {export_format: " + format + "}\n");
    const std::string sets = " --set trainer.grad_accum=2 --set settings.peak_flops=1e12";
    ASSERT_EQ(train(path, sets, out), 0) << out;
    ASSERT_EQ(launch(2, path, sets + " --set parallelism.pp=2 --run-dir " + run_dir(format + "_pp"), out), 0) << out;
    const auto one = read_metrics(run_dir(format) + "/metrics.jsonl");
    const auto pp = read_metrics(run_dir(format + "_pp") + "/metrics.jsonl");
    ASSERT_EQ(one.size(), 3u);
    ASSERT_EQ(pp.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_LT(relative(pp[i]["loss"].get<double>(), one[i]["loss"].get<double>()), 1e-5) << "step " << i + 1;
    }
    // The whole model's parameter counts, and MFU's FLOPs per token: every stage's, not the first's.
    EXPECT_EQ(pp[0]["parameters"], one[0]["parameters"]);
    EXPECT_EQ(pp[0]["trainable_parameters"], one[0]["trainable_parameters"]);
    auto flops_per_token = [](const nlohmann::json& row) {
      return row["mfu"].get<double>() * 1e12 / row["tokens_per_s_per_device"].get<double>();
    };
    EXPECT_LT(relative(flops_per_token(pp[0]), flops_per_token(one[0])), 1e-9);
    expect_same_exports(exported(format + "_pp"), exported(format));
  }

  const std::string from_peft =
      "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
      "down_proj], init_from: " + exported("peft") + "}}";
  const std::string continued = spec("continued", adapted(model_yaml("llama", base), from_peft), tokens_);
  ASSERT_EQ(train(continued, "--set trainer.grad_accum=2", out), 0) << out;
  ASSERT_EQ(launch(2, continued, "--set trainer.grad_accum=2 --set parallelism.pp=2 --run-dir " + run_dir("continued_pp"),
                   out),
            0)
      << out;
  const auto one = read_metrics(run_dir("continued") + "/metrics.jsonl");
  const auto pp = read_metrics(run_dir("continued_pp") + "/metrics.jsonl");
  ASSERT_EQ(pp.size(), 3u);
  EXPECT_LT(relative(pp[0]["loss"].get<double>(), one[0]["loss"].get<double>()), 1e-6) << "the folder's adapter";

  // GPT-2 ties its embedding to its head across the pipeline's ends; frozen, it has no gradient
  // to sum there. fsdp 2 x pp 2 (each stage's base sharded) against one rank.
  const std::string gpt2 = dir_.file("gpt2");
  reference("make-gpt2 " + gpt2);
  const std::string tied = spec("tied", adapted(model_yaml("gpt", gpt2), kGpt2Lora), tokens_);
  ASSERT_EQ(train(tied, "--set trainer.grad_accum=4", out), 0) << out;
  ASSERT_EQ(launch(4, tied, kFsdp + " --set trainer.grad_accum=2 --set parallelism.pp=2 --run-dir " + run_dir("tied_pp"),
                   out),
            0)
      << out;
  const auto tied_one = read_metrics(run_dir("tied") + "/metrics.jsonl");
  const auto tied_pp = read_metrics(run_dir("tied_pp") + "/metrics.jsonl");
  ASSERT_EQ(tied_pp.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_LT(relative(tied_pp[i]["loss"].get<double>(), tied_one[i]["loss"].get<double>()), 1e-5) << "step " << i + 1;
  }
  EXPECT_EQ(tied_pp[0]["parameters"], tied_one[0]["parameters"]) << "the tied embedding counted once";

  // `tessera validate` checks the folder against the whole model: every block's tensors are
  // taken (the first stage alone would leave the second block's over), and a config adapting
  // fewer layers than the folder holds is refused.
  const std::string pipelined = " --set parallelism.pp=2 --set trainer.grad_accum=2";
  EXPECT_EQ(run_command(testing::tessera_binary() + " validate " + continued + pipelined, out), 0) << out;
  EXPECT_EQ(run_command(testing::tessera_binary() + " validate " + continued + pipelined +
                            " --set components.adapters[0].config.target_modules=[q_proj,v_proj]",
                        out),
            2);
  EXPECT_NE(out.find("down_proj.lora_A.weight, which no layer this config adapts takes"), std::string::npos) << out;
}

// LoRA under the data-parallel strategies on 2 Gloo ranks: the per-step losses of one rank that
// accumulates the same 8 samples a step.
TEST_F(Lora, TwoRanksOfEachDataParallelStrategyEqualOneRank) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  const std::string path = spec("one", adapted(model_yaml("llama", base), kLora), tokens_);
  std::string out;
  ASSERT_EQ(train(path, "--set trainer.grad_accum=2 --run-dir " + run_dir("one"), out), 0) << out;
  const auto one = read_metrics(run_dir("one") + "/metrics.jsonl");
  ASSERT_EQ(one.size(), 3u);
  for (const std::string strategy : {"fsdp", "zero2", "zero1", "ddp"}) {
    SCOPED_TRACE(strategy);
    const std::string sets =
        " --set components.parallel.component_key=parallel --set components.parallel.variant_key=" + strategy;
    ASSERT_EQ(launch(2, path, sets + " --run-dir " + run_dir(strategy), out), 0) << out;
    const auto two = read_metrics(run_dir(strategy) + "/metrics.jsonl");
    // `tessera plan` counts the frozen base as held (sharded by fsdp) but neither reduced nor
    // updated: its bytes are the run's.
    ASSERT_EQ(run_command(testing::tessera_binary() + " plan " + path + sets + " --ranks 2 --json 2>/dev/null", out), 0)
        << out;
    expect_plan_agrees_with_metrics(out, two);
    ASSERT_EQ(two.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_LT(relative(two[i]["loss"].get<double>(), one[i]["loss"].get<double>()), 1e-5) << "step " << i + 1;
    }
    EXPECT_EQ(two[0]["trainable_parameters"], one[0]["trainable_parameters"]);
    // ddp and zero hold the frozen base whole on every rank; fsdp shards it, half on each.
    const double frozen_bytes = 4 * (two[0]["parameters"].get<double>() - two[0]["trainable_parameters"].get<double>());
    if (strategy == "fsdp") {
      EXPECT_LT(two[0]["parameter_bytes"].get<double>(), 0.6 * frozen_bytes);
    } else {
      EXPECT_GT(two[0]["parameter_bytes"].get<double>(), frozen_bytes);
    }
  }
  // fsdp gathering the adapters in bf16 while the frozen base and the compute stay fp32.
  ASSERT_EQ(launch(2, path, kFsdp + " --set components.parallel.config.param_dtype=bf16 --run-dir " + run_dir("bf16"), out),
            0)
      << out;
  const auto bf16 = read_metrics(run_dir("bf16") + "/metrics.jsonl");
  ASSERT_EQ(bf16.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_LT(relative(bf16[i]["loss"].get<double>(), one[i]["loss"].get<double>()), 1e-2) << "step " << i + 1;
  }
  EXPECT_GT(relative(one[2]["loss"].get<double>(), one[0]["loss"].get<double>()), 1e-4) << "the adapters learn";
}

// bf16 compute with activation checkpointing (GPT-2, all-linear, dropout) and a mixture of
// experts (its routers and experts are no linear layers LoRA wraps): only the adapters change.
TEST_F(Lora, Bf16CheckpointedAndMixtureOfExpertsRunsTrainOnlyTheAdapters) {
  const std::string gpt_base = dir_.file("gpt2");
  reference("make-gpt2 " + gpt_base);
  const std::string all_linear =
      "{component_key: adapter, variant_key: lora, config: {rank: 4, alpha: 16, dropout: 0.1, target_modules: "
      "[all-linear]}}";
  const std::string moe =
      "{component_key: model, variant_key: gpt_moe, config: {vocab_size: 256, n_layer: 2, n_head: 4, n_embd: 32, "
      "max_seq_len: 32, num_experts: 4, top_k: 2, expert_hidden: 64}}";
  struct Case {
    std::string name, model, sets;
  } cases[] = {
      {"bf16", model_yaml("gpt", gpt_base, ", activation_checkpointing: true"),
       "--set settings.precision=bf16 --set checkpoint.export_format=tessera"},
      {"moe", moe, "--set checkpoint.export_format=tessera"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = spec(c.name, adapted(c.model, all_linear), tokens_);
    std::string out;
    ASSERT_EQ(train(path, c.sets + " --set checkpoint.every_steps=1", out), 0) << out;
    const StateDict first = read_safetensors(run_dir(c.name) + "/checkpoints/step_00000001/model.safetensors").tensors;
    const StateDict last = read_safetensors(run_dir(c.name) + "/checkpoints/step_00000003/model.safetensors").tensors;
    int adapters = 0, base = 0;
    for (const auto& [name, tensor] : last) {
      const bool adapter = name.find(".lora_") != std::string::npos;
      (adapter ? adapters : base) += 1;
      if (adapter && name.find("lora_B") != std::string::npos) {
        EXPECT_FALSE(at::equal(tensor, first.at(name))) << name << " did not train";
      } else if (!adapter) {
        EXPECT_TRUE(at::equal(tensor, first.at(name))) << name << " changed";
      }
      EXPECT_EQ(name.find("router.lora"), std::string::npos) << "the router is not adapted: " << name;
      EXPECT_EQ(name.find("experts.c_fc.lora"), std::string::npos) << name;
    }
    EXPECT_GT(adapters, 0);
    EXPECT_GT(base, adapters / 2);
    EXPECT_TRUE(fs::exists(run_dir(c.name) + "/exports/step_00000003/adapters.safetensors"));
  }
}

TEST_F(Lora, MistakesAreOnePositionedError) {
  const std::string base = dir_.file("llama");
  reference("make-llama " + base + " --kv-heads 2");
  auto refused = [&](const std::string& adapters, const std::string& extra, const std::string& expected) {
    SCOPED_TRACE(expected);
    std::string out;
    const std::string path = spec("bad", adapted(model_yaml("llama", base), adapters), tokens_);
    EXPECT_EQ(run_command(testing::tessera_binary() + " validate " + path + " " + extra, out), 2) << out;
    EXPECT_NE(out.find(expected), std::string::npos) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex(R"(error: [^\n]+:[0-9]+:[0-9]+: [a-z_.\[\]0-9]+: )"))) << out;
  };
  refused("{component_key: adapter, variant_key: lora, config: {target_modules: [q_proj, qproj]}}", "",
          "components.adapters[0].config.target_modules: target_modules[1] 'qproj' matches no linear layer");
  refused("{component_key: adapter, variant_key: lora, config: {target_modules: [all-linear, q_proj]}}", "",
          "all-linear stands alone");
  refused(kLora, "--set parallelism.tp=2", "not yet with parallelism.tp 2");
  refused(kLora + ", " + kLora, "--set checkpoint.export_format=peft", "components.adapters has 2");
}

}  // namespace lora_test
}  // namespace tessera
