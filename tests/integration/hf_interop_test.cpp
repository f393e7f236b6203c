// Hugging Face interop against transformers itself (tools/interop/hf_reference.py, in the
// project's .venv; tools/setup.sh installs it): tiny random GPT2LMHeadModel, LlamaForCausalLM and
// MixtralForCausalLM folders made in Python are imported by `init_from`, `tessera eval` gives
// transformers' loss on the same tokens; exports (of tensor- and expert-parallel runs too) load
// in transformers with nothing missing or unexpected and give the loss `tessera eval` gives; export -> import -> export keeps every tensor's bytes; a Llama trains
// step for step like a plain PyTorch loop, on 1 rank and on 2 Gloo ranks under fsdp; and broken
// folders are one positioned error each.
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/components/model.hpp"
#include "tessera/formats/safetensors.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace hf_interop_test {

TEST_F(HfInterop, Gpt2ImportGivesTransformersLossAndAWrongGeluWouldShow) {
  const std::string saved = dir_.file("gpt2"), published = dir_.file("gpt2-published");
  reference("make-gpt2 " + saved);
  reference("make-gpt2 " + published + " --published");  // no "transformer.", attn.bias buffers
  // Text on which the tanh GELU and the exact one cannot average out of the loss.
  const std::string tokens = dir_.file("probe.bin");
  reference("probe-tokens " + tokens + " --model " + saved + " --mutate gelu --seq-len 32 --windows 12");

  const double expected = reference_loss(saved, tokens);
  for (const std::string& folder : {saved, published}) {
    const double got = tessera_eval(spec("gpt2", model_yaml("gpt", folder), tokens));
    EXPECT_LT(relative(got, expected), kLossTolerance) << folder << ": tessera " << got << ", transformers " << expected;
  }
  // The exact GELU where config.json says gelu_new would fail the comparison above.
  const double wrong_gelu = reference_loss(saved, tokens, "--mutate gelu");
  EXPECT_GT(relative(wrong_gelu, expected), 3 * kLossTolerance) << wrong_gelu << " vs " << expected;
  // And Tessera computes the exact GELU when told to (a YAML that disagrees is refused).
  std::string out;
  EXPECT_EQ(run_command(testing::tessera_binary() + " eval " +
                            spec("gpt2-exact", model_yaml("gpt", saved, ", activation: gelu"), tokens) + " --split train",
                        out),
            2);
  EXPECT_NE(out.find("activation"), std::string::npos) << out;
  EXPECT_NE(out.find("gelu_new"), std::string::npos) << out;
}

TEST_F(HfInterop, LlamaImportGivesTransformersLossAndRopeMistakesWouldShow) {
  // Grouped-query attention (2 KV heads for 4), rope_theta 500000, saved in 12 shards.
  const std::string sharded = dir_.file("llama");
  reference("make-llama " + sharded + " --kv-heads 2 --rope-theta 500000 --max-shard-size 40KB");
  ASSERT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  // Llama 3 RoPE scaling and a tied head.
  const std::string scaled = dir_.file("llama3");
  reference("make-llama " + scaled + " --kv-heads 1 --llama3-scaling --tied");
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");

  for (const std::string& folder : {sharded, scaled}) {
    const double expected = reference_loss(folder, tokens);
    const double got = tessera_eval(spec("llama", model_yaml("llama", folder), tokens));
    EXPECT_LT(relative(got, expected), kLossTolerance) << folder << ": tessera " << got << ", transformers " << expected;
  }
  const double expected = reference_loss(sharded, tokens);
  const double default_theta = reference_loss(sharded, tokens, "--mutate theta");
  const double interleaved = reference_loss(sharded, tokens, "--mutate interleaved");
  EXPECT_GT(relative(default_theta, expected), 3 * kLossTolerance);
  EXPECT_GT(relative(interleaved, expected), 3 * kLossTolerance);
}

// The tensors of two Hugging Face folders, byte for byte.
void expect_same_tensors(const std::string& a, const std::string& b) {
  const HfCheckpoint first = read_hf_checkpoint(a), second = read_hf_checkpoint(b);
  ASSERT_EQ(first.tensors.size(), second.tensors.size());
  for (const auto& [name, tensor] : first.tensors) {
    auto it = second.tensors.find(name);
    ASSERT_NE(it, second.tensors.end()) << name;
    EXPECT_EQ(tensor.scalar_type(), it->second.scalar_type()) << name;
    EXPECT_TRUE(at::equal(tensor, it->second)) << name << " differs";
  }
}

TEST_F(HfInterop, TrainedModelsExportToFoldersTransformersLoadsWithTheSameLoss) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  reference("make-llama " + dir_.file("llama") + " --kv-heads 2 --tokenizer");
  reference("make-gpt2 " + dir_.file("gpt2"));
  for (const std::string variant : {"llama", "gpt"}) {
    const std::string start = dir_.file(variant == "gpt" ? "gpt2" : "llama");
    const std::string path = spec(variant + "-export", model_yaml(variant, start), tokens);
    std::string out;
    // Sharded: a few tens of kilobytes per file.
    // The GPT-2 was imported without a tokenizer: the run names one for its exports.
    const std::string tokenizer = variant == "gpt" ? " --set checkpoint.export_tokenizer=" + dir_.file("llama") : "";
    ASSERT_EQ(run_command(testing::tessera_binary() + " train " + path +
                              " --set checkpoint.export_format=hf --set checkpoint.export_max_shard_size=60KB" + tokenizer,
                          out),
              0)
        << out;
    const std::string exported = dir_.file("runs/" + variant + "-export/exports/step_00000003");
    ASSERT_TRUE(fs::exists(exported + "/model.safetensors.index.json")) << out;
    // Loaded by transformers with nothing missing or unexpected (--strict), the same loss as the
    // trained model's in Tessera (from its checkpoint).
    const double in_transformers = reference_loss(exported, tokens, "--strict");
    const double in_tessera = tessera_eval(path, "--resume auto");
    EXPECT_LT(relative(in_tessera, in_transformers), kLossTolerance) << variant;
    EXPECT_GT(relative(in_tessera, reference_loss(start, tokens)), 1e-3) << variant << ": training changed nothing";

    // export -> import -> export: the same bytes.
    auto components = testing::build_components("model: " + model_yaml(variant, exported) + "\n");
    auto model = testing::built<Model>(components, "model");
    StateDict state;
    for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach();
    const std::string again = dir_.file(variant + "-again");
    fs::create_directories(again);
    write_hf_checkpoint(again, model->hugging_face_export(state), parse_byte_size("60KB"));
    expect_same_tensors(exported, again);
  }
  // The imported Llama's tokenizer travels with its export.
  const std::string exported = dir_.file("runs/llama-export/exports/step_00000003");
  EXPECT_TRUE(fs::exists(exported + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(exported + "/tokenizer_config.json"));
  reference("same-tokenizer " + dir_.file("llama") + " " + exported);
  // And the tokenizer a run names (export_tokenizer) travels with the export of a model that had none.
  const std::string gpt_export = dir_.file("runs/gpt-export/exports/step_00000003");
  EXPECT_TRUE(fs::exists(gpt_export + "/tokenizer.json"));
  reference("same-tokenizer " + dir_.file("llama") + " " + gpt_export);
}

}  // namespace hf_interop_test

// A run on 2 ranks of a model-parallel mesh saves and exports whole models: the hf exports of a
// Llama (grouped-query, untied head) and a GPT-2 imported by init_from and trained on the mesh
// load in transformers with nothing missing or unexpected and give the loss of the same training
// on one rank's export; `tessera eval` of the run's checkpoint gives the export's loss, on one
// rank (the checkpoint cut again) and through the mesh (`eval_mesh`: the pipeline's stages).
void HfInterop::two_ranks_export_what_one_rank_does(const std::string& mesh, const std::string& eval_mesh,
                                                    const std::string& both) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  reference("make-llama " + dir_.file("llama") + " --kv-heads 2");
  reference("make-gpt2 " + dir_.file("gpt2"));
  for (const std::string variant : {"llama", "gpt"}) {
    SCOPED_TRACE(variant);
    const std::string start = dir_.file(variant == "gpt" ? "gpt2" : "llama");
    double exported_loss[2] = {NAN, NAN};
    for (const int ranks : {2, 1}) {
      const std::string name = variant + "-ranks" + std::to_string(ranks);
      const std::string path = spec(name, model_yaml(variant, start), tokens);
      const std::string train = " train " + path + " --set checkpoint.export_format=hf " + both;
      std::string out;
      ASSERT_EQ(run_command(testing::tessera_binary() +
                                (ranks == 1 ? train : " launch --nproc-per-node 2 --" + train + " " + mesh),
                            out),
                0)
          << out;
      const std::string exported = dir_.file("runs/" + name + "/exports/step_00000003");
      exported_loss[ranks - 1] = reference_loss(exported, tokens, "--strict");
      if (ranks == 1) continue;
      EXPECT_LT(relative(tessera_eval(path, "--resume auto"), exported_loss[1]), kLossTolerance);
      EXPECT_GT(relative(exported_loss[1], reference_loss(start, tokens)), 1e-3) << "training changed nothing";
      if (eval_mesh.empty()) continue;
      ASSERT_EQ(run_command("(" + testing::tessera_binary() + " launch --nproc-per-node 2 -- eval " + path +
                                " --split train --batches 3 --resume auto " + eval_mesh + " 2>/dev/null)",
                            out),
                0)
          << out;
      const auto brace = out.find('{');
      ASSERT_NE(brace, std::string::npos) << out;
      const auto through_mesh = nlohmann::json::parse(out.substr(brace, out.find('\n', brace) - brace));
      EXPECT_EQ(through_mesh.value("tokens", 0), 3 * 4 * kSeqLen);
      EXPECT_LT(relative(through_mesh.at("loss").get<double>(), exported_loss[1]), kLossTolerance);
    }
    EXPECT_LT(relative(exported_loss[1], exported_loss[0]), 1e-4) << mesh << " against one rank";
  }
}

namespace hf_interop_test {

TEST_F(HfInterop, TensorParallelRunsExportWholeModelsThatTransformersLoads) {
  two_ranks_export_what_one_rank_does("--set parallelism.tp=2");
}

// GPT-2's own vocabulary (50257: no tp divides it) under tensor parallelism: a GPT-2 made by
// transformers with it, trained on 2 tensor-parallel ranks (25129 rows each, the last one
// padding), exports a folder transformers loads strictly, with the loss Tessera gives from the
// run's checkpoint and that of the same training on one rank; its step-2 checkpoint resumes on
// one rank and under tp 4 (12565 rows each, three of padding) to the run's step-3 loss.
TEST_F(HfInterop, Gpt2sOddVocabularyTrainsExportsAndReshardsUnderTensorParallelism) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 50257");  // ids on every rank's rows, the last ones too
  const std::string start = dir_.file("gpt2");
  reference("make-gpt2 " + start + " --vocab 50257 --embd 32 --heads 4");
  const std::string model = model_yaml("gpt", start);
  double exported_loss[2] = {NAN, NAN};
  for (const int ranks : {2, 1}) {
    const std::string name = "vocab-ranks" + std::to_string(ranks);
    const std::string train = " train " + spec(name, model, tokens) + " --set checkpoint.export_format=hf "
                              "--set checkpoint.every_steps=2";
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() +
                              (ranks == 1 ? train : " launch --nproc-per-node 2 --" + train + " --set parallelism.tp=2"),
                          out),
              0)
        << out;
    const std::string exported = dir_.file("runs/" + name + "/exports/step_00000003");
    exported_loss[ranks - 1] = reference_loss(exported, tokens, "--strict");
    if (ranks == 2) {
      EXPECT_LT(relative(tessera_eval(dir_.file(name + ".yaml"), "--resume auto"), exported_loss[1]), kLossTolerance);
      EXPECT_GT(relative(exported_loss[1], reference_loss(start, tokens)), 1e-3) << "training changed nothing";
    }
  }
  EXPECT_LT(relative(exported_loss[1], exported_loss[0]), 1e-4) << "tp 2 against one rank";
  const std::vector<double> saved = step_losses(dir_.file("runs/vocab-ranks2/metrics.jsonl"));
  ASSERT_EQ(saved.size(), 3u);
  for (const int ranks : {1, 4}) {
    const std::string name = "vocab-resumed" + std::to_string(ranks);
    const std::string train = " train " + spec(name, model, tokens) + " --resume " +
                              dir_.file("runs/vocab-ranks2/checkpoints/step_00000002");
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() +
                              (ranks == 1 ? train : " launch --nproc-per-node 4 --" + train + " --set parallelism.tp=4"),
                          out),
              0)
        << out;
    const std::vector<double> resumed = step_losses(dir_.file("runs/" + name + "/metrics.jsonl"));
    ASSERT_EQ(resumed.size(), 1u) << out;
    EXPECT_LT(relative(resumed[0], saved[2]), 2e-5) << ranks << " rank(s) against tp 2's step 3";
  }
}

// Pipelined (each rank one stage's blocks; GPT-2's tied embedding on both ends), with the step's 2
// micro-batches the pipeline's; evaluated through the pipeline too.
TEST_F(HfInterop, PipelinedRunsExportWholeModelsThatTransformersLoads) {
  two_ranks_export_what_one_rank_does("--set parallelism.pp=2", "--set parallelism.pp=2", "--set trainer.grad_accum=2");
}

// Mixtral (model/llama with num_experts): a MixtralForCausalLM made by transformers imports with
// transformers' loss (4 experts of top-2, grouped-query attention); trained on 2 expert-parallel
// ranks (each holding 2 of every block's experts) its hf export loads in transformers with nothing
// missing or unexpected and gives the loss of the same training on one rank, and the loss `tessera
// eval` gives on one rank from the run's checkpoint (its experts joined again).
TEST_F(HfInterop, MixtralImportsAndExpertParallelRunsExportWholeModels) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string start = dir_.file("mixtral");
  reference("make-mixtral " + start + " --experts 4 --top-k 2 --kv-heads 2");
  const double expected = reference_loss(start, tokens);
  const double imported = tessera_eval(spec("mixtral", model_yaml("llama", start), tokens));
  EXPECT_LT(relative(imported, expected), kLossTolerance) << "tessera " << imported << ", transformers " << expected;

  // Without the balance loss (it is each micro-batch's, and one rank's two micro-batches are not
  // the two ranks' batches) the runs compute the same steps.
  const std::string model = model_yaml("llama", start, ", aux_loss_coef: 0");
  double exported_loss[2] = {NAN, NAN};
  for (const int ranks : {2, 1}) {
    const std::string name = "mixtral-ranks" + std::to_string(ranks);
    const std::string path = spec(name, model, tokens);
    const std::string train = " train " + path + " --set checkpoint.export_format=hf";
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() +
                              (ranks == 1 ? train + " --set trainer.grad_accum=2"
                                          : " launch --nproc-per-node 2 --" + train + " --set parallelism.ep=2"),
                          out),
              0)
        << out;
    const std::string exported = dir_.file("runs/" + name + "/exports/step_00000003");
    ASSERT_TRUE(fs::exists(exported + "/model.safetensors")) << out;
    exported_loss[ranks - 1] = reference_loss(exported, tokens, "--strict");
    if (ranks == 2) {
      EXPECT_LT(relative(tessera_eval(path, "--resume auto"), exported_loss[1]), kLossTolerance);
      EXPECT_GT(relative(exported_loss[1], expected), 1e-3) << "training changed nothing";
    }
  }
  EXPECT_LT(relative(exported_loss[1], exported_loss[0]), 1e-4) << "ep 2 against one rank";
}

TEST_F(HfInterop, LlamaTrainsLikeAPlainPyTorchLoopOnOneAndTwoRanks) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string start = dir_.file("llama");
  reference("make-llama " + start + " --kv-heads 2 --std 0.1");
  const std::string optimizer = " --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1";

  struct Case {
    std::string name;
    int ranks;
    std::string parallel;
  };
  for (const Case& c : {Case{"one", 1, ""}, Case{"fsdp", 2, "  parallel: {component_key: parallel, variant_key: fsdp}\n"}}) {
    const std::string path = spec("train-" + c.name, model_yaml("llama", start), tokens, c.parallel);
    // Each rank reads 2 windows a step: 4 per step in all, as the reference reads them.
    const std::string args = "train " + path + " --set trainer.max_steps=5 --set trainer.micro_batch_size=" +
                             std::to_string(4 / c.ranks) + " --set checkpoint.export_format=hf";
    std::string out;
    ASSERT_EQ(run_command(testing::tessera_binary() +
                              (c.ranks > 1 ? " launch --nproc-per-node 2 -- " + args : " " + args),
                          out),
              0)
        << out;
    const std::vector<double> ours = step_losses(dir_.file("runs/train-" + c.name + "/metrics.jsonl"));
    const std::string line = reference("train " + start + " --tokens " + tokens + " --seq-len 32 --batch " +
                                       std::to_string(4 / c.ranks) + " --world " + std::to_string(c.ranks) +
                                       " --steps 5" + optimizer);
    const auto theirs = nlohmann::json::parse(line).get<std::vector<double>>();
    ASSERT_EQ(ours.size(), theirs.size()) << out;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_LT(relative(ours[i], theirs[i]), 1e-4) << c.name << " step " << i + 1 << ": tessera " << ours[i]
                                                    << ", pytorch " << theirs[i];
    }
  }
  // The fsdp run's export (gathered from both ranks' shards) loads in transformers with the loss
  // that `tessera eval` gives on 2 ranks from the fsdp checkpoint and on 1 rank from the export.
  const std::string exported = dir_.file("runs/train-fsdp/exports/step_00000005");
  const std::string line = reference("loss " + exported + " --strict --tokens " + tokens +
                                     " --seq-len 32 --batch 4 --batches 4");
  const double in_transformers = nlohmann::json::parse(line).at("loss").get<double>();
  const std::string fsdp_spec = dir_.file("train-fsdp.yaml");
  std::string out;
  ASSERT_EQ(run_command("(" + testing::tessera_binary() + " launch --nproc-per-node 2 -- eval " + fsdp_spec +
                            " --split train --batches 4 --resume auto 2>/dev/null)",
                        out),
            0)
      << out;
  const auto brace = out.find('{');
  ASSERT_NE(brace, std::string::npos) << out;
  const auto two = nlohmann::json::parse(out.substr(brace, out.find('\n', brace) - brace));
  EXPECT_LT(relative(two.at("loss").get<double>(), in_transformers), kLossTolerance);
  const std::string from_export = spec("eval-export", model_yaml("llama", exported), tokens);
  ASSERT_EQ(run_command("(" + testing::tessera_binary() + " eval " + from_export +
                            " --split train --batches 4 2>/dev/null)",
                        out),
            0)
      << out;
  const auto one = nlohmann::json::parse(last_line(out));
  EXPECT_EQ(two.at("tokens"), one.at("tokens"));
  EXPECT_LT(relative(one.at("loss").get<double>(), in_transformers), kLossTolerance);
}

// Broken Hugging Face folders, made from a real export: each is one error naming what is wrong,
// positioned at the spec's init_from, exit 2.
class HfBadFolders : public Cli {
 protected:
  // A tiny Llama written as a Hugging Face folder in 3+ shards.
  std::string good_folder(const std::string& name) {
    auto components = testing::build_components(
        "model: {component_key: model, variant_key: llama, config: {vocab_size: 256, n_layer: 2, n_head: 4, "
        "n_kv_head: 2, n_embd: 32, intermediate_size: 64, max_seq_len: 64}}\n");
    auto model = testing::built<Model>(components, "model");
    StateDict state;
    for (const auto& item : model->named_parameters()) state[item.key()] = item.value().detach();
    const std::string folder = dir_.file(name);
    fs::create_directories(folder);
    write_hf_checkpoint(folder, model->hugging_face_export(state), 20000);
    return folder;
  }

  // `tessera eval` of a llama from `folder`: exit code and output.
  int eval(const std::string& folder, std::string& out, const std::string& extra = "") {
    const std::string path =
        dir_.write("bad.yaml", "name: bad\nplugins: {paths: [" + testing::plugin_dir() + "]}\n" +
                                   "settings: {run_dir: " + dir_.file("run") + "}\ncomponents:\n" +
                                   "  model:\n    component_key: model\n    variant_key: llama\n" +
                                   "    config: {init_from: " + folder + "}\n" +
                                   "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data_ +
                                   ", seq_len: 16}}\n" +
                                   "  loss: {component_key: loss, variant_key: cross_entropy}\n" +
                                   "  optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 0.1, "
                                   "model: {instance_key: model, pass_type: BY_REFERENCE}}}\n" +
                                   "trainer: {max_steps: 1, micro_batch_size: 2}\n");
    return run_command(tessera("eval " + path + " --split train --batches 1" + extra), out);
  }

  // The one error line: positioned at init_from (bad.yaml:8), naming `what`.
  void expect_error(const std::string& folder, const std::string& what) {
    std::string out;
    EXPECT_EQ(eval(folder, out), 2) << out;
    EXPECT_NE(out.find("bad.yaml:8:"), std::string::npos) << out;
    EXPECT_NE(out.find("init_from"), std::string::npos) << out;
    EXPECT_NE(out.find(what), std::string::npos) << "expected '" << what << "' in: " << out;
  }

  // The folder's weight files, in name order.
  static std::vector<std::string> shards(const std::string& folder) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("model-", 0) == 0) files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
};

TEST_F(HfBadFolders, TheGoodFolderLoads) {
  std::string out;
  EXPECT_EQ(eval(good_folder("good"), out), 0) << out;
  EXPECT_NE(out.find("\"loss\""), std::string::npos) << out;
}

TEST_F(HfBadFolders, AYamlFieldThatDisagreesWithConfigJsonNamesBoth) {
  const std::string folder = good_folder("disagree");
  std::string out;
  EXPECT_EQ(eval(folder, out, " --set components.model.config.n_head=8"), 2) << out;
  EXPECT_NE(out.find("components.model.config.n_head: the YAML says n_head: 8 but " + folder +
                     "/config.json says num_attention_heads: 4"),
            std::string::npos)
      << out;
  // Agreeing is fine, and so is a Llama's own max_seq_len (no weight depends on it).
  EXPECT_EQ(eval(folder, out, " --set components.model.config.n_head=4 --set components.model.config.max_seq_len=16"), 0)
      << out;
}

TEST_F(HfBadFolders, AMissingShardIsNamed) {
  const std::string folder = good_folder("missing");
  const std::string shard = shards(folder).at(1);
  fs::remove(shard);
  expect_error(folder, "lists shard " + fs::path(shard).filename().string());
}

TEST_F(HfBadFolders, ATruncatedFileIsNamed) {
  const std::string folder = good_folder("truncated");
  const std::string file = shards(folder).at(0);
  const std::string bytes = read(file);
  write(file, bytes.substr(0, bytes.size() / 2));
  expect_error(folder, fs::path(file).filename().string() + ": not a valid safetensors file");
}

TEST_F(HfBadFolders, AHeaderOffsetPastTheEndIsNamed) {
  const std::string folder = good_folder("offset");
  const std::string file = shards(folder).back();
  std::string bytes = read(file);
  // The last data_offsets end moved far past the file (same header length: digits replaced).
  const std::size_t header = 8 + static_cast<unsigned char>(bytes[0]) + 256 * static_cast<unsigned char>(bytes[1]);
  std::string text = bytes.substr(8, header - 8);
  const std::size_t last = text.rfind(']');
  std::size_t digit = last;
  while (digit > 0 && std::isdigit(static_cast<unsigned char>(text[digit - 1]))) --digit;
  text.replace(digit, last - digit, std::string(last - digit, '9'));
  write(file, bytes.substr(0, 8) + text + bytes.substr(header));
  expect_error(folder, "lies outside the data");
}

TEST_F(HfBadFolders, AWrongShapeIsNamed) {
  const std::string folder = good_folder("shape");
  HfCheckpoint ck = read_hf_checkpoint(folder);
  const std::string file = ck.tensor_file.at("model.layers.1.self_attn.k_proj.weight");
  StateDict tensors = read_safetensors(file).tensors;
  tensors["model.layers.1.self_attn.k_proj.weight"] = at::zeros({8, 32});
  write_safetensors(file + ".new", tensors, {{"format", "pt"}});
  fs::rename(file + ".new", file);
  expect_error(folder, "model.layers.1.self_attn.k_proj.weight has shape [8, 32], the model needs [16, 32]");
}

TEST_F(HfBadFolders, AnUnknownModelTypeIsNamed) {
  const std::string folder = good_folder("type");
  std::string config = read(folder + "/config.json");
  config.replace(config.find("\"llama\""), 7, "\"bert\"");
  write(folder + "/config.json", config);
  expect_error(folder, "model_type 'bert'");
}

// A count of 0 in config.json (a head count, here) is an error at init_from, not a division by
// zero while the model is built.
TEST_F(HfBadFolders, AZeroHeadCountIsNamed) {
  const std::string folder = good_folder("zero_heads");
  nlohmann::json config = nlohmann::json::parse(read(folder + "/config.json"));
  config["num_attention_heads"] = 0;
  config.erase("head_dim");
  write(folder + "/config.json", config.dump());
  expect_error(folder, "config.json says num_attention_heads: 0; it must be at least 1");
}

TEST_F(HfBadFolders, AnExtraTensorIsNamed) {
  const std::string folder = good_folder("extra");
  const std::string file = shards(folder).back();
  StateDict tensors = read_safetensors(file).tensors;
  tensors["model.layers.2.mlp.up_proj.weight"] = at::zeros({64, 32});
  write_safetensors(file + ".new", tensors, {{"format", "pt"}});
  fs::rename(file + ".new", file);
  nlohmann::json index = nlohmann::json::parse(read(folder + "/model.safetensors.index.json"));
  index["weight_map"]["model.layers.2.mlp.up_proj.weight"] = fs::path(file).filename().string();
  write(folder + "/model.safetensors.index.json", index.dump());
  expect_error(folder, "1 tensor this model does not have: model.layers.2.mlp.up_proj.weight");
}

}  // namespace hf_interop_test
}  // namespace tessera
