// The data-parallel strategies' gradients (data_parallel.hpp): each bucket reduced as soon as
// autograd has accumulated all of it (the micro-batch's last backward, or a pipeline stage's),
// parameters that got no gradient settled alike on every rank (finish_gradients), a parameter's
// gradient as the strategy holds it (gradient_of), and the replicas' reduction of a hybrid mesh.
#include <ATen/ops/tensor.h>

#include <algorithm>

#include "data_parallel.hpp"
#include "tessera/error.hpp"

namespace tessera_plugins {

void DataParallel::begin_micro_batch(std::int64_t index, std::int64_t count) {
  check_setup("begin_micro_batch");
  if (in_backward_) complete_backward();
  last_micro_batch_ = index + 1 == count;
  // Under a pipeline schedule each backward of a stage calls this, several per micro-batch when
  // a rank holds several stages: the step's first call starts the record of what was used.
  if (index == 0 && !step_begun_) {
    for (auto& flags : used_) flags.assign(flags.size(), false);
    final_launched_.assign(units_.size(), false);
  }
  step_begun_ = true;
  for (auto& u : units_) u->reset_ready();
  ready_.assign(units_.size(), false);
  launched_.assign(units_.size(), false);
  next_launch_ = 0;
  in_backward_ = true;
}

void DataParallel::on_grad_ready(std::size_t unit, std::size_t index) {
  if (!in_backward_) return;  // a backward outside the trainer's steps: nothing to reduce
  used_[unit][index] = true;
  if (units_[unit]->mark_ready()) {
    ready_[unit] = true;
    launch_ready_units();
  }
}

void DataParallel::launch_ready_units() {
  // Strictly in unit order, so every rank starts the same collectives in the same order. (Under a
  // pipeline schedule complete_backward launches them.)
  if (options_.pipeline) return;
  while (next_launch_ < units_.size() && ready_[next_launch_]) {
    FlatUnit& unit = *units_[next_launch_++];
    unit.launch_reduction(last_micro_batch_);
    // fsdp: every operation that reads these parameters has run its backward.
    release(unit);
  }
}

void DataParallel::complete_backward() {
  if (options_.pipeline) {
    // A pipeline stage's backward reaches the units of that stage only (a rank may hold several):
    // the units it reached reduce, in unit order; the others wait for their own stage's backward.
    // This runs when the next micro-batch's backward begins, after forwards of other micro-batches
    // whose graphs hold the root's parameters (embeddings, final norm, head): the root stays
    // gathered until the optimizer step.
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (ready_[u] && !launched_[u]) {
        launched_[u] = true;
        if (last_micro_batch_) final_launched_[u] = true;
        units_[u]->launch_reduction(last_micro_batch_);
        if (std::find(root_.begin(), root_.end(), units_[u].get()) == root_.end()) release(*units_[u]);
      }
    }
    for (auto& u : units_) u->wait_reduction();
    in_backward_ = false;
    return;
  }
  if (options_.shard_parameters && comm_->world_size() > 1) {
    // fsdp's backward gathers and its reductions share one stream of collectives: a unit whose
    // reduction would start here rather than during backward (some parameter got no gradient)
    // could put them in a different order on another rank.
    for (std::size_t u = next_launch_; u < units_.size(); ++u) {
      if (!ready_[u]) {
        throw tessera::Error("parallel/fsdp: some parameters of unit " + std::to_string(u) +
                             " got no gradient in this backward; fsdp needs every parameter used in every "
                             "step (use ddp, zero1 or zero2 with find_unused_parameters: true for models that "
                             "leave parameters unused)");
      }
    }
  }
  for (std::size_t u = next_launch_; u < units_.size(); ++u) ready_[u] = true;
  launch_ready_units();
  for (auto& u : units_) u->wait_reduction();
  // Frozen units whose input needed no gradient (the first block's, behind frozen embeddings)
  // and the root's: backward is over.
  for (auto& u : frozen_units_) release(*u);
  in_backward_ = false;
  if (last_micro_batch_) settle_unused_parameters();
}

void DataParallel::settle_unused_parameters() {
  if (!options_.shard_parameters) {
    // A parameter one rank reached has its right gradient in the reduced bucket (the others add
    // zeros): only those no rank reached are wrong. Every rank takes part in this every step, so
    // all ranks agree, and refuse or drop, alike.
    std::vector<std::int32_t> flags;
    for (const auto& unit : used_) flags.insert(flags.end(), unit.begin(), unit.end());
    at::Tensor reached = at::tensor(flags, at::kInt);
    comm_->all_reduce(reached, tessera::ReduceOp::max);
    const std::int32_t* any_rank = reached.data_ptr<std::int32_t>();
    std::size_t k = 0;
    for (auto& unit : used_) {
      for (std::size_t i = 0; i < unit.size(); ++i) unit[i] = any_rank[k++] != 0;
    }
  }
  std::size_t unused = 0;
  std::string first;
  for (std::size_t u = 0; u < used_.size(); ++u) {
    for (std::size_t i = 0; i < used_[u].size(); ++i) {
      if (used_[u][i]) continue;
      if (unused++ == 0) first = names_[u][i];
    }
  }
  all_used_ = unused == 0;
  if (all_used_ || (options_.find_unused_parameters && !options_.shard_parameters)) return;
  const std::string which = first + (unused > 1 ? " (and " + std::to_string(unused - 1) + " more)" : "");
  if (options_.shard_parameters) {
    throw tessera::Error("parallel/fsdp: parameter " + which + " got no gradient in this step on rank " +
                         std::to_string(comm_->rank()) +
                         "; fsdp needs every parameter used in every step (use ddp, zero1 or zero2 with "
                         "find_unused_parameters: true for models that leave parameters unused)");
  }
  throw tessera::Error("parallel/" + options_.name + ": parameter " + which + " got no gradient in this step on any rank; " +
                       options_.name + " would update it with a zero gradient (weight decay, moments) where one process "
                       "leaves it as it is. For a model that leaves parameters unused, set "
                       "components.parallel.config.find_unused_parameters: true");
}

void DataParallel::drop_unused_gradients() {
  if (all_used_) return;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (std::size_t i = 0; i < used_[u].size(); ++i) {
      if (!used_[u][i]) units_[u]->params()[i].mutable_grad() = at::Tensor();
    }
  }
}

void DataParallel::finish_gradients() {
  check_setup("finish_gradients");
  if (in_backward_) complete_backward();
  if (options_.pipeline) {
    // Units no single stage's backward completed (parameters of two stages in one bucket): their
    // gradients have accumulated over the whole step; every rank of the stage reduces them here,
    // in unit order.
    if (final_launched_.size() != units_.size()) final_launched_.assign(units_.size(), false);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (final_launched_[u]) continue;
      final_launched_[u] = true;
      units_[u]->launch_reduction(true);
      if (std::find(root_.begin(), root_.end(), units_[u].get()) == root_.end()) release(*units_[u]);
    }
    for (auto& u : units_) u->wait_reduction();
    settle_unused_parameters();
  }
  step_begun_ = false;
  reduce_over_replicas();
}

at::Tensor DataParallel::gradient_of(const at::Tensor& param) {
  check_setup("gradient_of");
  const auto found = where_.find(param.unsafeGetTensorImpl());
  if (found == where_.end()) throw tessera::Error("parallel/" + options_.name + ": gradient_of a parameter it does not hold");
  const auto [u, i] = found->second;
  std::vector<bool> only(units_[u]->params().size(), false);
  only[i] = true;
  const auto pieces = units_[u]->owned_gradient_pieces(only);
  return pieces.empty() ? at::Tensor() : pieces.front();
}

void DataParallel::reduce_over_replicas() {
  if (!options_.replicate_group || options_.replicate_group->world_size() == 1) return;
  std::vector<std::shared_ptr<tessera::PendingCollective>> pending;
  std::vector<at::Tensor> grads = gradients();
  for (auto& g : grads) pending.push_back(options_.replicate_group->all_reduce_async(g));
  for (auto& p : pending) p->wait();
}

}  // namespace tessera_plugins
