#include "tessera/nn/weight_names.hpp"

#include <ATen/ops/equal.h>
#include <ATen/ops/stack.h>

#include "tessera/error.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {

std::string HfWeightNames::hf_name(const std::string& name) const {
  const std::string top = name.substr(0, name.find('.'));
  for (const HfPrefix& p : prefixes) {
    if (p.module.empty() || p.module == top) return p.prefix + name;
  }
  return name;
}

bool HfWeightNames::is_transposed(const std::string& name) const {
  for (const std::string& tail : transposed) {
    if (ends_with(name, tail)) return true;
  }
  return false;
}

bool HfWeightNames::is_expert_stack(const std::string& name) const {
  return !expert_stacks.empty() && name.find(expert_stacks) != std::string::npos;
}

std::string HfWeightNames::hf_expert_name(const std::string& name, std::int64_t e) const {
  const std::size_t at = name.find(expert_stacks) + expert_stacks.size();
  return hf_name(name.substr(0, at) + std::to_string(e) + "." + name.substr(at));
}

HfModuleName HfWeightNames::module(const std::string& module) const {
  return {hf_name(module), is_transposed(module + ".weight")};
}

StateDict HfWeightNames::export_tensors(const StateDict& state) const {
  StateDict out;
  for (const auto& [name, tensor] : state) {
    if (is_expert_stack(name)) {
      for (std::int64_t e = 0; e < tensor.size(0); ++e) out[hf_expert_name(name, e)] = tensor[e].contiguous();
    } else {
      out[hf_name(name)] = is_transposed(name) && tensor.dim() == 2 ? tensor.t().contiguous() : tensor;
    }
  }
  return out;
}

void import_hf_weights(const HfCheckpoint& hf, torch::nn::Module& model, const HfWeightNames& names,
                       const TensorParallelPlan& plan, const TensorParallel& tp, const ExpertParallel& ep,
                       std::int64_t num_experts, bool partial, const std::function<bool(const std::string&)>& ignored) {
  hf_import::WeightImport weights(hf);
  for (const auto& item : model.named_parameters()) {
    const TensorShard shard = shard_in(plan, item.key());
    const ShardRanks ranks = ranks_of(shard, tp, ep);
    if (!names.is_expert_stack(item.key())) {
      weights.copy(names.hf_name(item.key()), item.value(), names.is_transposed(item.key()), shard, ranks);
      continue;
    }
    // One tensor per expert there, stacked here.
    std::vector<at::Tensor> experts;
    for (std::int64_t e = 0; e < num_experts; ++e) experts.push_back(weights.tensor(names.hf_expert_name(item.key(), e)));
    weights.copy_from(names.hf_expert_name(item.key(), 0), at::stack(experts), item.value(), false, shard, ranks);
  }
  // Buffers the format holds as weights (a router's e_score_correction_bias): whole on every rank.
  for (const auto& item : model.named_buffers()) {
    const TensorShard shard = shard_in(plan, item.key());
    weights.copy(names.hf_name(item.key()), item.value(), false, shard, ranks_of(shard, tp, ep));
  }
  if (ignored) weights.ignore(ignored);
  weights.finish(partial);
}

void check_tied_head(const HfCheckpoint& hf, const std::string& head, const std::string& embedding,
                     const std::string& why) {
  const auto stored = hf.tensors.find(head);
  if (stored == hf.tensors.end()) return;
  const auto table = hf.tensors.find(embedding);
  // Without the embedding the import names what is missing.
  if (table == hf.tensors.end() || at::equal(stored->second, table->second)) return;
  throw ConfigError(hf.folder + ": " + head + " differs from " + embedding + why, "init_from");
}

}  // namespace tessera::nn
