// The data-parallel strategies' state for checkpoints: whole parameters gathered unit by unit
// (full_parameters) and loaded back into units and shards (load_full_parameters), and which part
// of each parameter this rank's optimizer state covers (owned_ranges, with_owned_parameters).
#include <map>
#include <string>

#include <c10/core/GradMode.h>

#include "data_parallel.hpp"
#include "tessera/error.hpp"

namespace tessera_plugins {

tessera::StateDict DataParallel::full_parameters(tessera::Model& model, std::int64_t only_rank) {
  check_setup("full_parameters");
  c10::NoGradGuard no_grad;
  // Kept where asked: rank `only_rank` of the data-parallel ranks, and of the ranks holding the
  // same stacked experts for those (each expert-parallel rank's experts are its own).
  const bool keep_others = only_rank < 0 || only_rank == comm_->rank();
  const bool keep_experts = options_.expert_group && (only_rank < 0 || only_rank == options_.expert_group->rank());
  // Whole parameters live on every rank except under fsdp: nothing to take part in.
  if (!keep_others && !keep_experts && !options_.shard_parameters) return {};
  // One unit at a time, straight to host memory: never more than one extra unit on the device.
  const std::map<const c10::TensorImpl*, std::string> names = parameter_names(model);
  tessera::StateDict state;
  for (FlatUnit* u : all_units()) {
    const bool keep = experts_.count(u->params().front().unsafeGetTensorImpl()) ? keep_experts : keep_others;
    if (u->casts_parameters()) {
      // The gathered copy is a cast: the master weights are gathered instead.
      const at::Tensor master = u->gather_master();
      for (std::size_t i = 0; i < u->params().size(); ++i) {
        auto name = names.find(u->params()[i].unsafeGetTensorImpl());
        if (keep && name != names.end()) state[name->second] = u->view_of(master, i).to(at::kCPU, false, true);
      }
      continue;
    }
    const bool was_gathered = u->gathered() && !gathering_.count(u);
    ensure_gathered(*u);
    for (std::size_t i = 0; i < u->params().size(); ++i) {
      auto name = names.find(u->params()[i].unsafeGetTensorImpl());
      if (keep && name != names.end()) state[name->second] = u->full_view(i).to(at::kCPU, false, /*copy=*/true);
    }
    if (!was_gathered) release(*u);
  }
  if (!keep_others) return state;  // this rank's experts alone, or nothing
  for (const auto& item : model.named_parameters()) {
    if (!state.count(item.key())) state[item.key()] = item.value().detach().to(at::kCPU, false, /*copy=*/true);
  }
  return state;
}

void DataParallel::load_full_parameters(tessera::Model& model, const tessera::StateDict& state) {
  check_setup("load_full_parameters");
  c10::NoGradGuard no_grad;
  auto value_for = [&](const std::string& name, const at::Tensor& target) -> const at::Tensor& {
    auto it = state.find(name);
    if (it == state.end()) throw tessera::Error("parallel/" + options_.name + ": no saved value for parameter " + name);
    if (it->second.sizes() != target.sizes()) {
      throw tessera::Error("parallel/" + options_.name + ": saved " + name + " has shape " +
                           c10::str(it->second.sizes()) + ", the model's has " + c10::str(target.sizes()));
    }
    return it->second;
  };
  const std::map<const c10::TensorImpl*, std::string> names = parameter_names(model);
  // Check everything before changing anything: a bad checkpoint leaves the model as it was.
  for (const auto& item : model.named_parameters()) value_for(item.key(), item.value());
  for (FlatUnit* u : all_units()) {
    if (u->casts_parameters()) {
      at::Tensor master = u->new_master();
      master.zero_();  // the padding
      for (std::size_t i = 0; i < u->params().size(); ++i) {
        at::Tensor view = u->view_of(master, i);
        view.copy_(value_for(names.at(u->params()[i].unsafeGetTensorImpl()), view));
      }
      u->load_master(master);
      continue;
    }
    ensure_gathered(*u);
    for (std::size_t i = 0; i < u->params().size(); ++i) {
      at::Tensor view = u->full_view(i);
      view.copy_(value_for(names.at(u->params()[i].unsafeGetTensorImpl()), view));
    }
    u->shard_from_full();
    release(*u);
  }
  for (const auto& item : model.named_parameters()) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (!where_.count(impl) && !in_frozen_units_.count(impl)) item.value().copy_(value_for(item.key(), item.value()));
  }
}

std::vector<at::Tensor> DataParallel::held_parameter_storages(tessera::Model& model) {
  check_setup("keep_reference_weights");
  // ddp and zero keep whole parameters (views of their units' flat buffers): the default.
  if (!options_.shard_parameters) return ParallelStrategy::held_parameter_storages(model);
  std::vector<at::Tensor> shards;
  for (FlatUnit* u : all_units()) shards.push_back(u->shard());
  return shards;
}

void DataParallel::release_derived_parameters() {
  if (!options_.shard_parameters) return;
  for (FlatUnit* u : all_units()) release(*u);
}

std::vector<std::pair<std::int64_t, std::int64_t>> DataParallel::owned_ranges() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& p : optimized_) {
    const auto& [u, i] = where_.at(p.unsafeGetTensorImpl());
    ranges.push_back(units_[u]->owned_range(i));
  }
  return ranges;
}

std::vector<tessera::Communicator*> DataParallel::state_share_groups() const {
  std::vector<tessera::Communicator*> groups;
  for (const auto& p : optimized_) {
    const auto& [u, i] = where_.at(p.unsafeGetTensorImpl());
    groups.push_back(shards_optimizer_state() ? &units_[u]->comm() : nullptr);
  }
  return groups;
}

void DataParallel::with_owned_parameters(const std::function<void()>& fn) {
  check_setup("with_owned_parameters");
  if (!shards_optimizer_state()) {
    fn();
    return;
  }
  for (auto& u : units_) u->point_at_shard();
  try {
    fn();
  } catch (...) {
    for (auto& u : units_) u->point_at_full();
    for (auto& u : units_) u->zero_grad();
    throw;
  }
  for (auto& u : units_) u->point_at_full();
  for (auto& u : units_) u->zero_grad();
}

}  // namespace tessera_plugins
