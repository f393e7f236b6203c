// A model's Hugging Face names as data: one table that a kit model's import (init_from a Hugging
// Face folder), export (checkpoint.export_format: hf), PEFT module names (Model::hugging_face_
// module, which LoRA's PEFT export and import use) all read, so they cannot disagree.
//
// Tessera's parameter names are Hugging Face's without the model's prefix ("layers.0.self_attn.
// q_proj.weight" is "model.layers.0.self_attn.q_proj.weight"); the table says which prefix each
// top-level module takes, which weights the format stores transposed ([in, out], GPT-2's Conv1D),
// and where stacked experts ([E, out, in], one tensor per weight in Tessera) put the expert index
// in their one-tensor-per-expert Hugging Face names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera::nn {

struct HfPrefix {
  std::string module;  // a top-level module ("lm_head"); empty: every other one
  std::string prefix;  // what its Hugging Face names begin with ("model.", "transformer.", "")
};

struct HfWeightNames {
  std::vector<HfPrefix> prefixes;       // the first whose module matches applies
  std::vector<std::string> transposed;  // names ending so are stored [in, out] (".c_attn.weight")
  std::string expert_stacks;            // ".experts." : "...experts.w1.weight" is "...experts.E.w1.weight"

  // The Hugging Face name of a parameter or module path.
  TESSERA_API std::string hf_name(const std::string& name) const;
  TESSERA_API bool is_transposed(const std::string& name) const;
  TESSERA_API bool is_expert_stack(const std::string& name) const;
  // The Hugging Face name of expert `e`'s weight in stack `name`.
  TESSERA_API std::string hf_expert_name(const std::string& name, std::int64_t e) const;
  // Model::hugging_face_module: PEFT's name of a module, and whether its weight is transposed.
  TESSERA_API HfModuleName module(const std::string& module) const;
  // The tensors of a Hugging Face folder equal to `state` (a model's whole state dict): renamed,
  // transposed, experts one tensor each.
  TESSERA_API StateDict export_tensors(const StateDict& state) const;

  // A ...ForCausalLM of the Llama lineage: everything under `model.` but the output head.
  static HfWeightNames causal_lm() { return {{{"lm_head", ""}, {"", "model."}}, {}, ".experts."}; }
};

// Copies a Hugging Face checkpoint's tensors into `model`'s parameters and buffers by `names` (each rank's part
// under tensor or expert parallelism, `plan`); every missing, misshapen or (unless `partial`: one
// pipeline stage) unused tensor is one error at init_from. `ignored`: tensors that are not
// weights (causal-mask buffers, rotary tables some converters store). `num_experts`: a stack's
// experts.
TESSERA_API void import_hf_weights(const HfCheckpoint& hf, torch::nn::Module& model, const HfWeightNames& names,
                                   const TensorParallelPlan& plan, const TensorParallel& tp, const ExpertParallel& ep,
                                   std::int64_t num_experts, bool partial,
                                   const std::function<bool(const std::string&)>& ignored = {});

// A tied head: a checkpoint may still store it, and then it must equal the embedding.
TESSERA_API void check_tied_head(const HfCheckpoint& hf, const std::string& head, const std::string& embedding,
                                 const std::string& why);

}  // namespace tessera::nn
