// The fixture of the mesh tests (tensor_parallel_test.cpp, pipeline_parallel_test.cpp): a tiny
// model's training through `tessera train` (one rank) or `tessera launch` (Gloo ranks), and the
// cases that train as one rank with as much accumulation does.
#pragma once

#include <filesystem>
#include <fstream>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace tessera {

struct MeshCase {
  std::string name;
  std::string model;  // tiny_tp (gpt) or tiny_llama_tp (llama, grouped-query)
  int ranks;
  int data_parallel;  // the one-rank run accumulates this many times more
  std::string sets;   // the mesh and strategy
  std::string model_sets = "";  // for both runs (the model must be the same)
};
inline void PrintTo(const MeshCase& c, std::ostream* os) { *os << c.name; }

const std::string kFsdp = " --set components.parallel.component_key=parallel --set components.parallel.variant_key=fsdp";
const std::string kDdp = " --set components.parallel.component_key=parallel --set components.parallel.variant_key=ddp";
// Packed documents: every newline of the text ends one, attention stays within each.
const std::string kDocuments =
    "--set components.train_data.config.document_mask=true --set components.train_data.config.eos_id=10";

// A vocabulary no tensor-parallel size divides (the data's byte ids are below it).
const std::string kVocab257 = " --set components.model.config.vocab_size=257";

// Mixtral (llama with experts), without the balance loss: a micro-batch statistic, and one rank's
// two micro-batches are not two ranks' batches.
const std::string kMixtral = "--set components.model.config.num_experts=4 --set components.model.config.aux_loss_coef=0";

// The tiny llama as a Qwen2 (q/k/v biases, an 8-position window from block 1 on) and a Qwen3
// (per-head q/k norms, head_dim 12 apart from n_embd / n_head, q/k/v and o_proj biases).
const std::string kQwen2 =
    "--set components.model.variant_key=qwen2 --set components.model.config.sliding_window=8 "
    "--set components.model.config.max_window_layers=1";
const std::string kQwen3 =
    "--set components.model.variant_key=qwen3 --set components.model.config.head_dim=12 "
    "--set components.model.config.attention_bias=true";

// A Qwen3-MoE of the tiny llama: block 0 dense, block 1 routed to 8 experts of 48 units (enough
// that each expert-parallel rank gets about half the rows, as `tessera plan` assumes), normalised
// gates, no balance loss (see kMixtral).
const std::string kQwen3Moe =
    "--set components.model.variant_key=qwen3_moe --set components.model.config.num_experts=8 "
    "--set components.model.config.dense_blocks=[0] --set components.model.config.expert_intermediate_size=48 "
    "--set components.model.config.renormalize_topk=true --set components.model.config.aux_loss_coef=0";

// A run saved under one mesh at step 5 of 10 and resumed under another.
struct Reshard {
  std::string name;
  int save_ranks;
  std::string save;
  int load_ranks;
  std::string load;
  std::string model = "tiny_tp";
};

// A spec the mesh cannot take: its model, the --set arguments, what the error says.
struct Bad {
  std::string model, args, expected;
};

class TensorParallel : public Cli {
 protected:
  std::string config(const std::string& model) const {
    return testing::source_dir() + "/tests/integration/configs/" + model + ".yaml";
  }
  // `tessera train` (ranks 1) or `tessera launch` of CONFIG with ARGS into run dir NAME; returns the exit code.
  int train(int ranks, const std::string& model, const std::string& args, const std::string& name, std::string& out) {
    const std::string command = "train " + config(model) + data_set() + " " + args + " --run-dir " + dir_.file(name);
    return run_command(tessera(ranks == 1 ? command : "launch --nproc-per-node " + std::to_string(ranks) + " -- " + command),
                       out);
  }
  // `tessera validate` refuses it before anything is built: exit 2, one line with FILE:LINE:COL
  // (the spec, or the --set that wrote the value): PATH: what is wrong.
  void is_a_positioned_validate_error(const Bad& c) {
    SCOPED_TRACE(c.args);
    std::string out;
    EXPECT_EQ(run_command(tessera("validate " + config(c.model) + data_set() + " " + c.args), out), 2) << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
    EXPECT_TRUE(std::regex_search(out, std::regex(R"(error: [^\n]+:[0-9]+:[0-9]+: [a-z_.]+: )"))) << "positioned: " << out;
  }
  // Two runs of tiny_tp with ARGS on 2 ranks (run dirs NAME "a", "b") give the same losses, and
  // one resumed from the first's step 5 ("c") gives its steps 6-10 to the last bit; `first` gets
  // the first run's metrics.
  void repeats_and_resumes_bit_exactly(const std::string& args, const std::string& name,
                                       std::vector<nlohmann::json>& first) {
    std::string out;
    ASSERT_EQ(train(2, "tiny_tp", args + " --set checkpoint.every_steps=5", "a" + name, out), 0) << out;
    ASSERT_EQ(train(2, "tiny_tp", args, "b" + name, out), 0) << out;
    ASSERT_EQ(train(2, "tiny_tp", args + " --resume " + dir_.file("a" + name) + "/checkpoints/step_00000005", "c" + name,
                    out),
              0)
        << out;
    first = read_metrics(dir_.file("a" + name) + "/metrics.jsonl");
    const auto b = read_metrics(dir_.file("b" + name) + "/metrics.jsonl");
    const auto c = read_metrics(dir_.file("c" + name) + "/metrics.jsonl");
    ASSERT_EQ(first.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    ASSERT_EQ(c.size(), 5u) << out;
    for (std::size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(double(b[i]["loss"]), double(first[i]["loss"])) << "step " << i + 1;
    }
    for (std::size_t i = 0; i < c.size(); ++i) {
      EXPECT_EQ(c[i]["step"], first[i + 5]["step"]);
      EXPECT_EQ(double(c[i]["loss"]), double(first[i + 5]["loss"])) << "step " << i + 6;
    }
  }
  // `tessera plan` of the same spec for RANKS ranks agrees with what the run measured (its
  // metrics): the largest rank's parameter, gradient and optimizer bytes at step 1 (gradients
  // where a strategy keeps them between steps: the local one frees them), and rank 0's bytes
  // moved at step 2, in all and by group, each within 10 %.
  void plan_agrees_with_run(int ranks, const std::string& model, const std::string& args,
                            const std::vector<nlohmann::json>& metrics) {
    std::string out;
    const std::string errors = dir_.file("plan_stderr.txt");
    ASSERT_EQ(run_command(tessera("plan " + config(model) + data_set() + " " + args + " --ranks " +
                                  std::to_string(ranks) + " --json 2>" + errors),
                          out),
              0)
        << out << std::ifstream(errors).rdbuf();
    expect_plan_agrees_with_metrics(out, metrics);
  }

  // The resumed run's steps 6-10 are the saved run's, within float32 rounding.
  void resumes_as_saved(const Reshard& r) {
    SCOPED_TRACE(r.name);
    std::string out;
    ASSERT_EQ(train(r.save_ranks, r.model, r.save + " --set checkpoint.every_steps=5", "save_" + r.name, out), 0) << out;
    ASSERT_EQ(train(r.load_ranks, r.model,
                    r.load + " --resume " + dir_.file("save_" + r.name) + "/checkpoints/step_00000005",
                    "load_" + r.name, out),
              0)
        << out;
    EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
    const auto saved = read_metrics(dir_.file("save_" + r.name) + "/metrics.jsonl");
    const auto loaded = read_metrics(dir_.file("load_" + r.name) + "/metrics.jsonl");
    ASSERT_EQ(saved.size(), 10u);
    ASSERT_EQ(loaded.size(), 5u) << out;
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      const double expected = saved[i + 5]["loss"], got = loaded[i]["loss"];
      EXPECT_NEAR(got, expected, 2e-5 * expected) << "step " << i + 6;
    }
  }
};

class Meshes : public TensorParallel, public ::testing::WithParamInterface<MeshCase> {};

}  // namespace tessera
