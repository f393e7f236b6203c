#include "tessera/nn/parameters.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

#include "tessera/error.hpp"

namespace tessera::nn {

at::Tensor parameter(at::IntArrayRef sizes, double fill) {
  at::Tensor p = new_parameter(sizes);
  if (!p.is_meta()) p.fill_(fill);
  return p;
}

ParameterNames::ParameterNames(const torch::nn::Module& model) {
  for (const auto& item : model.named_parameters()) names_[item.value().unsafeGetTensorImpl()] = item.key();
}

const std::string& ParameterNames::of(const at::Tensor& p, const std::string& model_kind) const {
  auto it = names_.find(p.unsafeGetTensorImpl());
  if (it == names_.end()) throw Error(model_kind + ": initialize_parameters got a tensor that is not its parameter");
  return it->second;
}

void initialize_parameters(const torch::nn::Module& model, const std::string& model_kind,
                           const std::vector<at::Tensor>& params, std::uint64_t init_seed, const InitRule& rule,
                           const TensorParallelPlan& plan, const TensorParallel& tp, const ExpertParallel& ep) {
  c10::NoGradGuard no_grad;
  const ParameterNames names(model);
  for (const at::Tensor& p : params) {
    const std::string& name = names.of(p, model_kind);
    const InitialValue initial = rule(name);
    if (!initial.normal) {
      p.fill_(initial.value);
      continue;
    }
    const TensorShard shard = shard_in(plan, name);
    const ShardRanks ranks = ranks_of(shard, tp, ep);
    at::Tensor values = at::empty(whole_shape(p.sizes(), shard, ranks), at::kFloat);
    values.normal_(0.0, initial.value, init_generator(init_seed, name));
    p.copy_(part_of(values, shard, ranks));
  }
}

}  // namespace tessera::nn
