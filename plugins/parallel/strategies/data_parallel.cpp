// The data-parallel strategies' shared machinery: setup, gradient buckets and their reductions
// from autograd hooks, the optimizer step on shards, and the state for checkpoints. What only
// fsdp does (units from the model, gathering and freeing around forward) is fsdp_units.cpp.
#include "data_parallel.hpp"

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <set>

#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/optimizer.hpp"

namespace tessera_plugins {
namespace {

// Tells the strategy that autograd finished accumulating a parameter's gradient. Holds the
// strategy weakly: parameters (which own the hook) must not keep it alive.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::weak_ptr<DataParallel> owner, std::size_t unit) : owner_(std::move(owner)), unit_(unit) {}
  void operator()(const torch::autograd::Variable&) override {
    if (auto owner = owner_.lock()) owner->on_grad_ready(unit_);
  }

 private:
  std::weak_ptr<DataParallel> owner_;
  std::size_t unit_;
};

}  // namespace

void DataParallel::check_setup(const char* what) const {
  if (!comm_) throw tessera::Error("parallel/" + options_.name + ": " + what + " before setup()");
}

void DataParallel::setup(tessera::Model& model, tessera::Optimizer& optimizer, tessera::Communicator& comm) {
  if (comm_) throw tessera::Error("parallel/" + options_.name + ": setup() runs once per run");
  comm_ = &comm;
  broadcast_from_rank0(model);
  const std::vector<at::Tensor> params = optimizer.parameters();
  if (params.empty()) throw tessera::Error("parallel/" + options_.name + ": the optimizer has no parameters");
  if (options_.shard_parameters) {
    build_fsdp_units(model, params);
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
  // Deferred parameters outside the optimizer (frozen): whole, with rank 0's values.
  std::vector<at::Tensor> frozen;
  for (const auto& p : model.parameters()) {
    if (!p.is_meta()) continue;
    tessera::materialize_parameter(p, at::empty(p.sizes(), p.options().device(options_.device)));
    frozen.push_back(p);
  }
  if (!frozen.empty()) {
    model.initialize_parameters(frozen);
    c10::NoGradGuard no_grad;
    for (auto& p : frozen) comm_->broadcast(p, 0);
  }
  ready_.assign(units_.size(), false);
  optimized_ = params;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (std::size_t i = 0; i < units_[u]->params().size(); ++i) {
      where_[units_[u]->params()[i].unsafeGetTensorImpl()] = {u, i};
    }
  }
  install_grad_hooks();
  if (options_.shard_parameters) model.set_forward_hooks(shared_from_this());
  std::int64_t numel = 0;
  for (const auto& u : units_) numel += u->numel();
  tessera::log::info("parallel/", options_.name, ": ", params.size(), " parameters (", numel, " elements) in ",
                     units_.size(), options_.shard_parameters ? " units" : " buckets", " over ",
                     comm.world_size(), comm.world_size() == 1 ? " rank" : " ranks");
}

void DataParallel::broadcast_from_rank0(tessera::Model& model) {
  // Every rank starts from rank 0's weights, whatever each rank's initialisation did.
  if (comm_->world_size() == 1) return;
  c10::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (!p.is_meta()) comm_->broadcast(p, 0);  // deferred ones (fsdp) are broadcast unit by unit
  }
  for (auto& b : model.buffers()) comm_->broadcast(b, 0);
}

void DataParallel::build_buckets(const std::vector<at::Tensor>& params) {
  // Backward produces gradients roughly in reverse order of the parameters, so buckets are cut
  // from the end: the first bucket fills first and its reduction overlaps the rest of backward.
  std::vector<at::Tensor> bucket;
  std::int64_t bytes = 0;
  auto close = [&] {
    if (bucket.empty()) return;
    units_.push_back(std::make_unique<FlatUnit>(bucket, *comm_, options_.reduction, false, options_.precision));
    bucket.clear();
    bytes = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const bool other_kind = !bucket.empty() && (it->scalar_type() != bucket.front().scalar_type() ||
                                                it->device() != bucket.front().device());
    if (other_kind) close();
    bucket.push_back(*it);
    bytes += static_cast<std::int64_t>(it->nbytes());
    if (bytes >= options_.bucket_bytes) close();
  }
  close();
}

void DataParallel::install_grad_hooks() {
  std::weak_ptr<DataParallel> self = weak_from_this();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (const auto& p : units_[u]->params()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<GradReadyHook>(self, u));
    }
  }
}

void DataParallel::begin_micro_batch(std::int64_t index, std::int64_t count) {
  check_setup("begin_micro_batch");
  if (in_backward_) complete_backward();
  last_micro_batch_ = index + 1 == count;
  for (auto& u : units_) u->reset_ready();
  ready_.assign(units_.size(), false);
  next_launch_ = 0;
  in_backward_ = true;
}

void DataParallel::on_grad_ready(std::size_t unit) {
  if (!in_backward_) return;  // a backward outside the trainer's steps: nothing to reduce
  if (units_[unit]->mark_ready()) {
    ready_[unit] = true;
    launch_ready_units();
  }
}

void DataParallel::launch_ready_units() {
  // Strictly in unit order, so every rank starts the same collectives in the same order.
  while (next_launch_ < units_.size() && ready_[next_launch_]) {
    FlatUnit& unit = *units_[next_launch_++];
    unit.launch_reduction(last_micro_batch_);
    // fsdp: every operation that reads these parameters has run its backward.
    release(unit);
  }
}

void DataParallel::complete_backward() {
  if (options_.shard_parameters && comm_->world_size() > 1) {
    // fsdp's backward gathers and its reductions share one stream of collectives: a unit whose
    // reduction would start here rather than during backward (some parameter got no gradient)
    // could put them in a different order on another rank.
    for (std::size_t u = next_launch_; u < units_.size(); ++u) {
      if (!ready_[u]) {
        throw tessera::Error("parallel/fsdp: some parameters of unit " + std::to_string(u) +
                             " got no gradient in this backward; fsdp needs every parameter used in every "
                             "step (use ddp or zero2 for models with unused parameters)");
      }
    }
  }
  for (std::size_t u = next_launch_; u < units_.size(); ++u) ready_[u] = true;
  launch_ready_units();
  for (auto& u : units_) u->wait_reduction();
  in_backward_ = false;
}

void DataParallel::finish_gradients() {
  check_setup("finish_gradients");
  if (in_backward_) complete_backward();
}

std::vector<at::Tensor> DataParallel::gradients() {
  std::vector<at::Tensor> grads;
  for (const auto& u : units_) grads.push_back(u->owned_gradient());
  return grads;
}

at::Tensor DataParallel::grad_norm_squared_share() {
  std::vector<at::Tensor> grads = gradients();
  // ddp: every rank holds the same whole gradient, so rank 0 alone counts it.
  if (grads.empty() || (options_.reduction == GradReduction::all_reduce && comm_->rank() != 0)) {
    return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  }
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& n : norms) n = n.to(at::kFloat);
  return at::stack(norms).pow(2).sum();
}

void DataParallel::optimizer_step(tessera::Optimizer& optimizer) {
  check_setup("optimizer_step");
  if (options_.reduction == GradReduction::all_reduce) {
    optimizer.step();
    return;
  }
  // The optimizer sees each parameter as its part of this rank's shard (with the matching part of
  // the gradient), so it creates and updates state for that part only.
  for (auto& u : units_) u->point_at_shard();
  try {
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
    for (auto& u : units_) release(*u);
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
  for (const auto& u : units_) {
    m.parameters += u->parameter_bytes();
    m.gradients += u->gradient_bytes();
  }
  return m;
}

tessera::StateDict DataParallel::full_parameters(tessera::Model& model, std::int64_t only_rank) {
  check_setup("full_parameters");
  c10::NoGradGuard no_grad;
  const bool keep = only_rank < 0 || only_rank == comm_->rank();
  // Whole parameters live on every rank except under fsdp: nothing to take part in.
  if (!keep && !options_.shard_parameters) return {};
  // One unit at a time, straight to host memory: never more than one extra unit on the device.
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  tessera::StateDict state;
  for (auto& u : units_) {
    if (u->casts_parameters()) {
      // The gathered copy is a cast: the master weights are gathered instead.
      const at::Tensor master = u->gather_master();
      for (std::size_t i = 0; i < u->params().size(); ++i) {
        auto name = names.find(u->params()[i].unsafeGetTensorImpl());
        if (keep && name != names.end()) state[name->second] = u->view_of(master, i).to(at::kCPU, false, true);
      }
      continue;
    }
    const bool was_gathered = u->gathered() && !gathering_.count(u.get());
    ensure_gathered(*u);
    for (std::size_t i = 0; i < u->params().size(); ++i) {
      auto name = names.find(u->params()[i].unsafeGetTensorImpl());
      if (keep && name != names.end()) state[name->second] = u->full_view(i).to(at::kCPU, false, /*copy=*/true);
    }
    if (!was_gathered) release(*u);
  }
  if (!keep) return {};
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
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  // Check everything before changing anything: a bad checkpoint leaves the model as it was.
  for (const auto& item : model.named_parameters()) value_for(item.key(), item.value());
  for (auto& u : units_) {
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
    if (!where_.count(item.value().unsafeGetTensorImpl())) item.value().copy_(value_for(item.key(), item.value()));
  }
}

std::vector<std::pair<std::int64_t, std::int64_t>> DataParallel::owned_ranges() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& p : optimized_) {
    const auto& [u, i] = where_.at(p.unsafeGetTensorImpl());
    ranges.push_back(units_[u]->owned_range(i));
  }
  return ranges;
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
