// fsdp's part of DataParallel: the model's wrapping units made flat units (tied parameters in
// the root; frozen parameters in units of their own), and the forward hooks that gather each
// unit just before it runs (the next one prefetched) and free it after, gathering it again when
// its backward comes.
#include <c10/core/GradMode.h>

#include <map>
#include <set>

#include "data_parallel.hpp"
#include "tessera/error.hpp"

namespace tessera_plugins {

void DataParallel::build_fsdp_units(tessera::Model& model, const std::vector<at::Tensor>& params) {
  std::set<const c10::TensorImpl*> optimized;
  for (const auto& p : params) optimized.insert(p.unsafeGetTensorImpl());
  // The parameters no optimizer updates (a base that adapters froze) are sharded too, in units of
  // their own: a unit's parameters either all have gradients or none do.
  std::vector<at::Tensor> frozen;
  for (const auto& p : model.parameters()) {
    if (!optimized.count(p.unsafeGetTensorImpl())) frozen.push_back(p);
  }
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
  // Per model unit: its trained parameters and its frozen ones.
  std::vector<std::vector<at::Tensor>> per_unit, frozen_per_unit;
  for (const auto& module : modules) {
    std::vector<at::Tensor> mine, mine_frozen;
    for (const auto& p : module->parameters()) {
      const auto* impl = p.unsafeGetTensorImpl();
      if (uses[impl] != 1 || !claimed.insert(impl).second) continue;
      (optimized.count(impl) ? mine : mine_frozen).push_back(p);
    }
    per_unit.push_back(std::move(mine));
    frozen_per_unit.push_back(std::move(mine_frozen));
  }
  std::vector<at::Tensor> rest, frozen_rest;
  for (const auto& p : params) {
    if (!claimed.count(p.unsafeGetTensorImpl())) rest.push_back(p);
  }
  for (const auto& p : frozen) {
    if (!claimed.count(p.unsafeGetTensorImpl())) frozen_rest.push_back(p);
  }
  // Backward runs the units last to first and finishes with the root (embeddings come first in
  // the forward pass), so reductions start in that order.
  // Deferred parameters get storage unit by unit: no rank ever holds the whole model.
  DeferredUnitInit deferred;
  deferred.device = options_.device;
  deferred.initialize = [&model](const std::vector<at::Tensor>& p) { model.initialize_parameters(p); };
  // Each model unit becomes flat units: its stacked experts' (expert parallelism: sharded over
  // the ranks holding the same experts) and the rest's; its frozen parameters likewise, apart.
  auto flat_units = [&](const std::vector<at::Tensor>& params_of_unit, bool trains) {
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
      auto unit = std::make_unique<FlatUnit>(part, comm_for(part.front()),
                                             trains ? options_.reduction : GradReduction::none, true,
                                             options_.precision, &deferred);
      made.push_back(unit.get());
      if (!trains) {
        for (const auto& p : part) in_frozen_units_.insert(p.unsafeGetTensorImpl());
      }
      (trains ? units_ : frozen_units_).push_back(std::move(unit));
    }
    return made;
  };
  auto trained_and_frozen = [&](const std::vector<at::Tensor>& trained, const std::vector<at::Tensor>& frozen_part) {
    std::vector<FlatUnit*> made = flat_units(trained, true);
    for (FlatUnit* u : flat_units(frozen_part, false)) made.push_back(u);
    return made;
  };
  forward_units_.assign(per_unit.size(), {});
  for (std::size_t i = per_unit.size(); i-- > 0;) forward_units_[i] = trained_and_frozen(per_unit[i], frozen_per_unit[i]);
  root_ = trained_and_frozen(rest, frozen_rest);
}

std::vector<FlatUnit*> DataParallel::all_units() const {
  std::vector<FlatUnit*> all;
  for (const auto& u : units_) all.push_back(u.get());
  for (const auto& u : frozen_units_) all.push_back(u.get());
  return all;
}

void DataParallel::release_frozen(std::size_t unit) {
  for (FlatUnit* u : forward_unit(unit)) {
    if (!u->trains()) release(*u);
  }
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

void DataParallel::with_whole_parameters(tessera::Model& /*model*/, const std::function<void()>& fn) {
  if (!options_.shard_parameters) {
    fn();
    return;
  }
  check_setup("with_whole_parameters");
  if (holding_whole_) throw tessera::Error("parallel/fsdp: with_whole_parameters does not nest");
  // Every rank gathers the units in one order (their collectives match), then computes alone.
  for (FlatUnit* unit : all_units()) ensure_gathered(*unit);
  holding_whole_ = true;
  auto release_all = [this] {
    holding_whole_ = false;
    for (FlatUnit* unit : all_units()) release(*unit);
  };
  try {
    fn();
  } catch (...) {
    release_all();
    throw;
  }
  release_all();
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
  if (units.empty() || unit == kWholeModel || holding_whole_) return output;
  for (FlatUnit* u : units) release(*u);
  const bool backward_follows = c10::GradMode::is_enabled() && output.requires_grad();
  if (!backward_follows) return output;
  // A unit is gathered again when the gradient of its output arrives, just before its own
  // backward runs.
  std::weak_ptr<DataParallel> self = weak_from_this();
  output.register_hook([self, unit](const at::Tensor&) {
    auto strategy = self.lock();
    if (!strategy) return;
    // The gradient of this unit's output is whole, so the next unit's backward has computed the
    // gradient of its input: its frozen parameters are done with (as FSDP2 reshards a module once
    // its inputs' gradients are computed). Its trained ones are freed once they are reduced.
    if (unit + 1 < strategy->forward_units_.size()) strategy->release_frozen(unit + 1);
    for (FlatUnit* mine : strategy->forward_unit(unit)) strategy->ensure_gathered(*mine);
    if (unit > 0) {
      for (FlatUnit* previous : strategy->forward_unit(unit - 1)) strategy->prefetch(previous);
    }
  });
  return output;
}

}  // namespace tessera_plugins
