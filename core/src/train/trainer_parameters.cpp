// What the trainer's model holds, counted as the whole model (tessera/core/train/trainer.hpp):
// its parameters over every split (tensor, expert and pipeline parallelism; a padded vocabulary's
// padding left out), the FLOPs per token of the trainable ones, and how each parameter the
// optimizer holds is split, for resharding its state.
#include <ATen/ops/tensor.h>

#include <map>
#include <set>

#include "tessera/core/train/trainer.hpp"

namespace tessera::core {

void Trainer::count_parameters() {
  // Each split parameter counted whole; over a pipeline, every stage's summed, a tied
  // embedding's copy once, and the adapters' as the model's FLOPs count the whole model.
  const std::set<const c10::TensorImpl*> tied_copies = pipeline_tied_copies();
  auto own = [&](const at::Tensor& p) { return !tied_copies.count(p.unsafeGetTensorImpl()); };
  at::Tensor counts = at::tensor(
      {whole_parameter_count([&](const std::string&, const at::Tensor& p) { return own(p); }),
       whole_parameter_count([&](const std::string&, const at::Tensor& p) { return own(p) && p.requires_grad(); }),
       whole_parameter_count(
           [&](const std::string& name, const at::Tensor&) { return parts_.adapter_parameters.count(name) > 0; })},
      at::kLong);
  if (pp_) pp_->group()->all_reduce(counts);
  whole_parameters_ = counts[0].item<std::int64_t>();
  whole_trainable_ = counts[1].item<std::int64_t>();
  added_parameters_ = static_cast<double>(counts[2].item<std::int64_t>());
  // The share of the model's own elements (not the adapters' additions) that is frozen.
  const double base = static_cast<double>(whole_parameters_) - added_parameters_;
  frozen_share_ = whole_trainable_ == whole_parameters_ || base <= 0
                      ? 0
                      : static_cast<double>(whole_parameters_ - whole_trainable_) / base;
}

double Trainer::flops_per_token(std::int64_t seq_len) const {
  const double model = parts_.model->flops_per_token(seq_len);
  if (frozen_share_ == 0) return model;
  return adapted_flops_per_token(model, parts_.model->flops_per_token(0), frozen_share_, added_parameters_);
}

std::int64_t Trainer::whole_parameter_count(
    const std::function<bool(const std::string&, const at::Tensor&)>& counted) const {
  const TensorParallelPlan plan = parts_.model->tensor_parallel_plan();
  std::int64_t n = 0;
  for (const auto& item : parts_.model->named_parameters()) {
    if (!counted(item.key(), item.value())) continue;
    std::int64_t numel = 1;  // of the whole parameter: a padded vocabulary's padding is not counted
    const TensorShard shard = shard_in(plan, item.key());
    for (const std::int64_t d : whole_shape(item.value().sizes(), shard, ranks_of(shard, tp_, ep_))) numel *= d;
    n += numel;
  }
  return n;
}

std::vector<TensorShard> Trainer::optimizer_shards() const {
  const TensorParallelPlan plan = parts_.model->tensor_parallel_plan();
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : parts_.model->named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<TensorShard> shards;
  for (const auto& p : parts_.optimizer->parameters()) {
    const auto name = names.find(p.unsafeGetTensorImpl());
    shards.push_back(name == names.end() ? TensorShard{} : shard_in(plan, name->second));
  }
  return shards;
}

}  // namespace tessera::core
