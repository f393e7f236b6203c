// The data-parallel strategies' shared machinery: setup, gradient buckets and their hooks, the
// gradient norm and the optimizer step on shards. The reductions the hooks start, and parameters
// without a gradient, are data_parallel_gradients.cpp; the state for checkpoints is
// data_parallel_state.cpp; what only fsdp does (units from the model, gathering and freeing
// around forward) is fsdp_units.cpp.
#include "data_parallel.hpp"

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <set>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/components/optimizer.hpp"

namespace tessera_plugins {
namespace {

// Tells the strategy that autograd finished accumulating a parameter's gradient. Holds the
// strategy weakly: parameters (which own the hook) must not keep it alive.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::weak_ptr<DataParallel> owner, std::size_t unit, std::size_t index)
      : owner_(std::move(owner)), unit_(unit), index_(index) {}
  void operator()(const torch::autograd::Variable&) override {
    if (auto owner = owner_.lock()) owner->on_grad_ready(unit_, index_);
  }

 private:
  std::weak_ptr<DataParallel> owner_;
  std::size_t unit_, index_;
};

}  // namespace

std::map<const c10::TensorImpl*, std::string> parameter_names(tessera::Model& model) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  return names;
}

void DataParallel::check_setup(const char* what) const {
  if (!comm_) throw tessera::Error("parallel/" + options_.name + ": " + what + " before setup()");
}

void DataParallel::setup(tessera::Model& model, tessera::Optimizer& optimizer, tessera::Communicator& comm) {
  if (comm_) throw tessera::Error("parallel/" + options_.name + ": setup() runs once per run");
  comm_ = &comm;
  unit_comm_ = options_.shard_group ? options_.shard_group.get() : comm_;
  if (options_.expert_group) {
    const tessera::TensorParallelPlan plan = model.tensor_parallel_plan();
    for (const auto& item : model.named_parameters()) {
      if (tessera::shard_in(plan, item.key()).experts) experts_.insert(item.value().unsafeGetTensorImpl());
    }
  }
  // A pipeline's tied embedding: a unit of its own on both ends, so their gradients' parts line up.
  const auto params_by_name = model.named_parameters();
  for (const std::string& name : model.pipeline_tied_parameters()) {
    if (const auto* p = params_by_name.find(name)) apart_.insert(p->unsafeGetTensorImpl());
  }
  broadcast_from_rank0(model);
  const std::vector<at::Tensor> params = optimizer.parameters();
  if (params.empty()) throw tessera::Error("parallel/" + options_.name + ": the optimizer has no parameters");
  if (options_.shard_parameters) {
    build_fsdp_units(model, params);
    if (options_.replicate_group && options_.replicate_group->world_size() > 1) {
      for (FlatUnit* u : all_units()) u->take_first_replicas_shard(*options_.replicate_group);
    }
  } else {
    // The model's registration order, not the optimizer's (which may group parameters, e.g. by
    // weight decay): backward produces gradients roughly in reverse of it.
    std::set<const c10::TensorImpl*> optimized;
    for (const auto& p : params) optimized.insert(p.unsafeGetTensorImpl());
    std::vector<at::Tensor> ordered;
    for (const auto& p : model.parameters()) {
      if (optimized.erase(p.unsafeGetTensorImpl())) ordered.push_back(p);
    }
    for (const auto& p : params) {
      if (optimized.count(p.unsafeGetTensorImpl())) ordered.push_back(p);  // not in the model
    }
    build_buckets(ordered);
  }
  // Deferred parameters outside the optimizer (frozen) under ddp and zero: whole, with rank 0's
  // values (fsdp's frozen units gave theirs storage).
  std::vector<at::Tensor> frozen;
  for (const auto& p : model.parameters()) {
    if (!p.is_meta()) continue;
    tessera::materialize_parameter(p, at::empty(p.sizes(), p.options().device(options_.device)));
    frozen.push_back(p);
  }
  if (!frozen.empty()) {
    model.initialize_parameters(frozen);
    c10::NoGradGuard no_grad;
    for (auto& p : frozen) {
      tessera::Communicator& group = holders_of(p);
      if (group.world_size() > 1) group.broadcast(p, 0);
    }
  }
  counted_.assign(units_.size(), {});
  ready_.assign(units_.size(), false);
  optimized_ = params;
  const std::map<const c10::TensorImpl*, std::string> names = parameter_names(model);
  names_.assign(units_.size(), {});
  used_.assign(units_.size(), {});
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (std::size_t i = 0; i < units_[u]->params().size(); ++i) {
      const c10::TensorImpl* impl = units_[u]->params()[i].unsafeGetTensorImpl();
      where_[impl] = {u, i};
      const auto name = names.find(impl);
      names_[u].push_back(name != names.end() ? name->second : "(not a parameter of the model)");
    }
    used_[u].assign(units_[u]->params().size(), false);
    counted_[u].assign(units_[u]->params().size(), true);
  }
  install_grad_hooks();
  if (!options_.shard_parameters) frozen_bytes_ = tessera::frozen_parameter_bytes(model, params);
  if (options_.shard_parameters) model.set_forward_hooks(shared_from_this());
  std::int64_t numel = 0, frozen_numel = 0;
  for (const auto& u : units_) numel += u->numel();
  for (const auto& u : frozen_units_) frozen_numel += u->numel();
  const std::string frozen_units =
      frozen_units_.empty() ? std::string()
                            : " (and " + std::to_string(frozen_numel) + " frozen elements in " +
                                  std::to_string(frozen_units_.size()) + " units)";
  tessera::log::info("parallel/", options_.name, ": ", params.size(), " parameters (", numel, " elements) in ",
                     units_.size(), options_.shard_parameters ? " units" : " buckets", frozen_units, " over ",
                     comm.world_size(), comm.world_size() == 1 ? " rank" : " ranks",
                     unit_comm_ != comm_ ? " (hybrid: sharded over " + std::to_string(unit_comm_->world_size()) +
                                               ", replicated over " +
                                               std::to_string(options_.replicate_group->world_size()) + ")"
                                         : std::string());
}

void DataParallel::broadcast_from_rank0(tessera::Model& model) {
  // Every rank starts from rank 0's weights, whatever each rank's initialisation did (stacked
  // experts: the first rank's that holds the same experts).
  c10::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    tessera::Communicator& group = holders_of(p);
    if (!p.is_meta() && group.world_size() > 1) group.broadcast(p, 0);  // deferred ones (fsdp): unit by unit
  }
  if (comm_->world_size() == 1) return;
  for (auto& b : model.buffers()) comm_->broadcast(b, 0);
}

tessera::Communicator& DataParallel::holders_of(const at::Tensor& p) const {
  return experts_.count(p.unsafeGetTensorImpl()) ? *options_.expert_group : *comm_;
}

tessera::Communicator& DataParallel::comm_for(const at::Tensor& p) const {
  return experts_.count(p.unsafeGetTensorImpl()) ? *options_.expert_group : *unit_comm_;
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> DataParallel::split_experts(
    const std::vector<at::Tensor>& params) const {
  std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> out;
  for (const auto& p : params) (experts_.count(p.unsafeGetTensorImpl()) ? out.second : out.first).push_back(p);
  return out;
}

void DataParallel::build_buckets(const std::vector<at::Tensor>& params) {
  // Backward produces gradients roughly in reverse order of the parameters, so buckets are cut
  // from the end: the first bucket fills first and its reduction overlaps the rest of backward.
  // Stacked experts (expert parallelism) go to buckets of their own, reduced over their group.
  std::vector<at::Tensor> bucket;
  std::int64_t bytes = 0;
  auto close = [&] {
    if (bucket.empty()) return;
    units_.push_back(
        std::make_unique<FlatUnit>(bucket, comm_for(bucket.front()), options_.reduction, false, options_.precision));
    bucket.clear();
    bytes = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const bool apart = apart_.count(it->unsafeGetTensorImpl()) > 0;
    const bool other_kind = !bucket.empty() && (it->scalar_type() != bucket.front().scalar_type() ||
                                                it->device() != bucket.front().device() ||
                                                experts_.count(it->unsafeGetTensorImpl()) !=
                                                    experts_.count(bucket.front().unsafeGetTensorImpl()));
    if (other_kind || apart) close();
    bucket.push_back(*it);
    bytes += static_cast<std::int64_t>(it->nbytes());
    if (bytes >= options_.bucket_bytes || apart) close();
  }
  close();
}

void DataParallel::install_grad_hooks() {
  std::weak_ptr<DataParallel> self = weak_from_this();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (std::size_t i = 0; i < units_[u]->params().size(); ++i) {
      torch::autograd::impl::set_post_acc_grad_hooks(units_[u]->params()[i], std::make_unique<GradReadyHook>(self, u, i));
    }
  }
}

void DataParallel::count_in_grad_norm(const std::vector<bool>& counted) {
  check_setup("count_in_grad_norm");
  if (counted.size() != optimized_.size()) {
    throw tessera::Error("parallel/" + options_.name + ": count_in_grad_norm got " + std::to_string(counted.size()) +
                         " flags for " + std::to_string(optimized_.size()) + " parameters");
  }
  for (std::size_t k = 0; k < counted.size(); ++k) {
    const auto [u, i] = where_.at(optimized_[k].unsafeGetTensorImpl());
    counted_[u][i] = counted[k];
    counts_all_ = counts_all_ && counted[k];
  }
}

bool DataParallel::is_optimizer_state_replica() const {
  return options_.replicate_group && options_.replicate_group->rank() != 0;
}

std::vector<at::Tensor> DataParallel::gradients() {
  std::vector<at::Tensor> grads;
  for (const auto& u : units_) grads.push_back(u->owned_gradient());
  return grads;
}

at::Tensor DataParallel::grad_norm_squared_share() {
  std::vector<at::Tensor> grads = gradients();
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  // ddp: every rank of a unit's group holds the same whole gradient, so its rank 0 alone counts
  // it; hybrid sharding: the first replica of each shard. The others' zero is made where the
  // gradients are (ddp's options_.device is the host's default): a host zero would be copied to
  // the GPU, a wait for it, every step.
  const at::Tensor zero = at::zeros({}, grads.front().options().dtype(at::kFloat));
  if (is_optimizer_state_replica()) return zero;
  grads.clear();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (options_.reduction == GradReduction::all_reduce && units_[u]->comm().rank() != 0) continue;
    if (counts_all_) {
      grads.push_back(units_[u]->owned_gradient());
      continue;
    }
    // The parameters this rank counts, as their pieces of the gradients it keeps.
    for (at::Tensor& piece : units_[u]->owned_gradient_pieces(counted_[u])) grads.push_back(piece);
  }
  if (grads.empty()) return zero;
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& n : norms) n = n.to(at::kFloat);
  return at::stack(norms).pow(2).sum();
}

void DataParallel::optimizer_step(tessera::Optimizer& optimizer) {
  check_setup("optimizer_step");
  if (options_.reduction == GradReduction::all_reduce) {
    drop_unused_gradients();  // zero_grad() points them at their buckets again
    optimizer.step();
    return;
  }
  // The optimizer sees each parameter as its part of this rank's shard (with the matching part of
  // the gradient), so it creates and updates state for that part only.
  for (auto& u : units_) u->point_at_shard();
  try {
    drop_unused_gradients();
    optimizer.step();
  } catch (...) {
    for (auto& u : units_) {
      u->point_at_full();
      u->zero_grad();
    }
    throw;
  }
  for (auto& u : units_) u->point_at_full();
  if (options_.shard_parameters) {
    // A unit still gathered (a forward without backward) holds the old values: drop them, so
    // the next use gathers the updated shards.
    for (FlatUnit* u : all_units()) release(*u);
    return;
  }
  std::vector<std::shared_ptr<tessera::PendingCollective>> gathers;
  for (auto& u : units_) gathers.push_back(u->start_gather());
  for (auto& g : gathers) g->wait();
}

void DataParallel::zero_grad(tessera::Optimizer&) {
  for (auto& u : units_) u->zero_grad();
}

tessera::ParallelMemory DataParallel::memory() const {
  tessera::ParallelMemory m;
  m.parameters = frozen_bytes_;  // ddp, zero: whole on every rank, outside the units
  for (const FlatUnit* u : all_units()) {
    m.parameters += u->parameter_bytes();
    m.gradients += u->gradient_bytes();
  }
  return m;
}

}  // namespace tessera_plugins
