// What the trainer's model holds, counted as the whole model (tessera/core/train/trainer.hpp):
// its parameters from their placements (each split one whole, a padded vocabulary's padding and a
// pipeline's tied copy left out), the FLOPs per token of the trainable ones, and the placement of
// each parameter the optimizer holds.

#include <map>
#include <string>
#include <vector>

#include "tessera/core/train/trainer.hpp"

namespace tessera::core {

void Trainer::count_parameters() {
  // Each split parameter counted whole; over a pipeline, every stage's summed, a tied
  // embedding's copy once, and the adapters' as the model's FLOPs count the whole model.
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : parts_.model->named_parameters()) named.emplace_back(item.key(), item.value());
  const std::vector<std::int64_t> counts = placements_.count_whole(
      named, {[](const std::string&, const at::Tensor&) { return true; },
              [](const std::string&, const at::Tensor& p) { return p.requires_grad(); },
              [&](const std::string& name, const at::Tensor&) { return parts_.adapter_parameters.count(name) > 0; }});
  whole_parameters_ = counts[0];
  whole_trainable_ = counts[1];
  added_parameters_ = static_cast<double>(counts[2]);
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

std::shared_ptr<const OptimizerPlacements> Trainer::place_optimizer_parameters() const {
  std::map<const c10::TensorImpl*, std::string> by_impl;
  for (const auto& item : parts_.model->named_parameters()) by_impl[item.value().unsafeGetTensorImpl()] = item.key();
  const auto params = parts_.optimizer->parameters();
  // The strategy's share of each parameter's optimizer state, one range and group per parameter
  // (tessera/components/strategy.hpp).
  const auto ranges = strategy_.owned_ranges();
  const auto groups = strategy_.state_share_groups();
  if (ranges.size() != params.size() || groups.size() != params.size()) {
    throw Error("the parallel strategy's owned_ranges() and state_share_groups() have " +
                std::to_string(ranges.size()) + " and " + std::to_string(groups.size()) +
                " entries for the optimizer's " + std::to_string(params.size()) + " parameters");
  }
  std::vector<OptimizerPlacements::Parameter> placed;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const auto name = by_impl.find(p.unsafeGetTensorImpl());
    OptimizerPlacements::Parameter one;
    // A parameter the model does not name is in no plan: replicated.
    one.name = name == by_impl.end() ? std::string() : name->second;
    one.local_shape = p.sizes().vec();
    one.placement = placements_.of(one.name, p);
    const auto& [begin, end] = ranges[i];
    one.placement.state = {begin, end, strategy_.shards_optimizer_state(), strategy_.is_optimizer_state_replica()};
    one.share_group = groups[i];
    placed.push_back(std::move(one));
  }
  return std::make_shared<const OptimizerPlacements>(placements_, std::move(placed));
}

}  // namespace tessera::core
