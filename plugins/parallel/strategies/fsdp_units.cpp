// fsdp's part of DataParallel: the model's wrapping units made flat units (tied parameters in
// the root), and the forward hooks that gather each unit just before it runs (the next one
// prefetched) and free it after, gathering it again when its backward comes.
#include <c10/core/GradMode.h>

#include <map>
#include <set>

#include "data_parallel.hpp"
#include "tessera/error.hpp"

namespace tessera_plugins {

void DataParallel::build_fsdp_units(tessera::Model& model, const std::vector<at::Tensor>& params) {
  std::set<const c10::TensorImpl*> optimized;
  for (const auto& p : params) optimized.insert(p.unsafeGetTensorImpl());
  // A parameter used by two units (tied weights) would be freed by one while the other needs
  // it: such parameters join the root, which stays gathered for the whole pass.
  const auto modules = model.sharding_units();
  std::map<const c10::TensorImpl*, int> uses;
  for (const auto& module : modules) {
    std::set<const c10::TensorImpl*> once;
    for (const auto& p : module->parameters()) once.insert(p.unsafeGetTensorImpl());
    for (const auto* impl : once) ++uses[impl];
  }
  std::set<const c10::TensorImpl*> claimed;
  std::vector<std::vector<at::Tensor>> per_unit;
  for (const auto& module : modules) {
    std::vector<at::Tensor> mine;
    for (const auto& p : module->parameters()) {
      const auto* impl = p.unsafeGetTensorImpl();
      if (optimized.count(impl) && uses[impl] == 1 && claimed.insert(impl).second) mine.push_back(p);
    }
    per_unit.push_back(std::move(mine));
  }
  std::vector<at::Tensor> rest;
  for (const auto& p : params) {
    if (!claimed.count(p.unsafeGetTensorImpl())) rest.push_back(p);
  }
  // Backward runs the units last to first and finishes with the root (embeddings come first in
  // the forward pass), so reductions start in that order.
  // Deferred parameters get storage unit by unit: no rank ever holds the whole model.
  DeferredUnitInit deferred;
  deferred.device = options_.device;
  deferred.initialize = [&model](const std::vector<at::Tensor>& p) { model.initialize_parameters(p); };
  // Each model unit becomes flat units: its stacked experts' (expert parallelism: sharded over
  // the ranks holding the same experts) and the rest's.
  auto flat_units = [&](const std::vector<at::Tensor>& params_of_unit) {
    std::vector<FlatUnit*> made;
    auto [others, experts] = split_experts(params_of_unit);
    // A pipeline's tied embedding apart (its shards line up on both ends of the pipeline).
    std::vector<std::vector<at::Tensor>> parts{experts};
    std::vector<at::Tensor> rest_of_others;
    for (const auto& p : others) {
      if (apart_.count(p.unsafeGetTensorImpl())) {
        parts.push_back({p});
      } else {
        rest_of_others.push_back(p);
      }
    }
    parts.push_back(rest_of_others);
    for (const auto& part : parts) {
      if (part.empty()) continue;
      units_.push_back(std::make_unique<FlatUnit>(part, comm_for(part.front()), options_.reduction, true,
                                                  options_.precision, &deferred));
      made.push_back(units_.back().get());
    }
    return made;
  };
  forward_units_.assign(per_unit.size(), {});
  for (std::size_t i = per_unit.size(); i-- > 0;) forward_units_[i] = flat_units(per_unit[i]);
  root_ = flat_units(rest);
}

const std::vector<FlatUnit*>& DataParallel::forward_unit(std::size_t unit) {
  if (unit == kWholeModel) return root_;
  if (unit >= forward_units_.size()) {
    throw tessera::Error("parallel/" + options_.name + ": the model ran unit " + std::to_string(unit) +
                         " but named only " + std::to_string(forward_units_.size()) + " in sharding_units()");
  }
  return forward_units_[unit];
}

void DataParallel::ensure_gathered(FlatUnit& unit) {
  auto it = gathering_.find(&unit);
  if (it != gathering_.end()) {
    it->second->wait();
    gathering_.erase(it);
  } else if (!unit.gathered()) {
    unit.gather();
  }
}

void DataParallel::release(FlatUnit& unit) {
  // A gather still in flight would write into freed memory: let it land first.
  auto it = gathering_.find(&unit);
  if (it != gathering_.end()) {
    it->second->wait();
    gathering_.erase(it);
  }
  unit.free_full();
}

void DataParallel::prefetch(FlatUnit* unit) {
  if (!options_.prefetch || !unit || unit->gathered() || gathering_.count(unit)) return;
  gathering_[unit] = unit->start_gather();
}

void DataParallel::before_forward(std::size_t unit) {
  for (FlatUnit* u : forward_unit(unit)) ensure_gathered(*u);
  // The next unit's gather overlaps this one's computation.
  if (unit == kWholeModel) {
    if (!forward_units_.empty()) {
      for (FlatUnit* next : forward_unit(0)) prefetch(next);
    }
  } else if (unit + 1 < forward_units_.size()) {
    for (FlatUnit* next : forward_unit(unit + 1)) prefetch(next);
  }
}

at::Tensor DataParallel::after_forward(std::size_t unit, const at::Tensor& output) {
  const std::vector<FlatUnit*>& units = forward_unit(unit);
  // The root stays gathered after the whole forward, with or without a backward: it holds the
  // output head (tied embeddings), which a hidden-state loss applies after forward_hidden()
  // returns. Its backward releases it, or else the next optimizer_step().
  if (units.empty() || unit == kWholeModel) return output;
  for (FlatUnit* u : units) release(*u);
  const bool backward_follows = c10::GradMode::is_enabled() && output.requires_grad();
  if (!backward_follows) return output;
  // A unit is gathered again when the gradient of its output arrives, just before its own
  // backward runs.
  std::weak_ptr<DataParallel> self = weak_from_this();
  output.register_hook([self, unit](const at::Tensor&) {
    auto strategy = self.lock();
    if (!strategy) return;
    for (FlatUnit* mine : strategy->forward_unit(unit)) strategy->ensure_gathered(*mine);
    if (unit > 0) {
      for (FlatUnit* previous : strategy->forward_unit(unit - 1)) strategy->prefetch(previous);
    }
  });
  return output;
}

}  // namespace tessera_plugins
