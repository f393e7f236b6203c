// The fixture of the mesh tests (tensor_parallel_test.cpp, pipeline_parallel_test.cpp): a tiny
// model's training through `tessera train` (one rank) or `tessera launch` (Gloo ranks), and the
// cases that train as one rank with as much accumulation does.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>

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

// Mixtral (llama with experts), without the balance loss: a micro-batch statistic, and one rank's
// two micro-batches are not two ranks' batches.
const std::string kMixtral = "--set components.model.config.num_experts=4 --set components.model.config.aux_loss_coef=0";

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
};

class Meshes : public TensorParallel, public ::testing::WithParamInterface<MeshCase> {};

}  // namespace tessera
