// Placements (tessera/parallel/placement.hpp): each tensor's place in its whole, and the whole
// gathered, cut, counted and written from it.
#include "tessera/parallel/placement.hpp"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/tensor.h>

#include "tessera/error.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {

std::int64_t Placement::whole_numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : whole_shape) n *= d;
  return n;
}

Placements::Placements() : mesh_(nullptr) {}

Placements::Placements(const RunContext& run, TensorParallelPlan plan, const std::vector<std::string>& tied)
    : tp_(TensorParallel::of(run)),
      ep_(ExpertParallel::of(run)),
      mesh_(run.mesh ? run.mesh : (run.communicator ? DeviceMesh::data_parallel_only(run.communicator) : nullptr)),
      plan_(std::move(plan)),
      tied_(tied.begin(), tied.end()) {
  if (run.mesh && run.mesh->dims().pp > 1) {
    stages_ = run.mesh->group_ptr({MeshAxis::pp});
    // Stage s lives on pipeline rank s % ranks: the first stage, and its copy of a tied tensor, on rank 0.
    first_stage_ = stages_->rank() == 0;
  }
}

Placement Placements::of(const std::string& name, const at::Tensor& local) const {
  Placement p;
  p.shard = shard_in(plan_, name);
  p.part = ranks_of(p.shard, tp_, ep_);
  p.whole_shape = whole_shape(local.sizes(), p.shard, p.part);
  // A tensor not split over the tensor-parallel ranks has a copy on each of them.
  if (p.shard.replicated() || p.shard.experts) p.replica = tp_.rank();
  p.tied_copy = !first_stage_ && tied_.count(name) > 0;
  p.state.end = local.numel();
  return p;
}

bool Placements::cuts_any() const {
  if (tp_.size() > 1 || ep_.size() > 1) return true;
  for (const auto& [name, shard] : plan_) {
    if (shard.padded() && shard.padded_part(1) != shard.whole) return true;
  }
  return false;
}

namespace {

// The parts of the tensors `along` picks travel to rank 0 of `group` alone, one tensor at a
// time: no rank ever holds more than the whole model once (rank 0) or its own part (the others).
// The other tensors stay with rank 0.
template <class Along>
StateDict join_over(const StateDict& local, const TensorParallelPlan& plan, Communicator& group, const Along& along) {
  const std::int64_t size = group.world_size();
  const bool keeper = group.rank() == 0;
  StateDict whole;
  for (const auto& [name, part] : local) {  // in name order, the same on every rank
    const TensorShard shard = shard_in(plan, name);
    if (!along(shard)) {
      if (keeper) whole[name] = part;
      continue;
    }
    at::Tensor mine = part.contiguous();
    if (!keeper) {
      group.send_async(mine, 0)->wait();
      continue;
    }
    std::vector<at::Tensor> parts{mine};
    for (std::int64_t r = 1; r < size; ++r) {
      parts.push_back(at::empty_like(mine));
      group.recv_async(parts.back(), r)->wait();
    }
    whole[name] = TensorParallel::join(parts, shard);
  }
  return whole;
}

bool split_over_tensor_ranks(const TensorShard& shard) { return !shard.replicated() && !shard.experts; }

}  // namespace

StateDict Placements::gather_whole(const StateDict& local) const {
  StateDict whole = local;
  if (tp_.size() > 1) {
    whole = join_over(whole, plan_, *tp_.group(), split_over_tensor_ranks);
  } else {
    // One rank's padded vocabulary (pad_vocab_to_multiple_of) is whole without its padding.
    for (auto& [name, t] : whole) {
      const TensorShard shard = shard_in(plan_, name);
      if (shard.padded()) t = TensorParallel::join({t}, shard);
    }
  }
  // A group's ranks all hold parts or none do, so every join is a collective of all its ranks or of none.
  if (ep_.size() > 1 && !whole.empty()) {
    whole = join_over(whole, plan_, *ep_.group(), [](const TensorShard& shard) { return shard.experts; });
  }
  if (stages_ && !whole.empty()) {
    for (auto& [name, t] : whole) t = t.to(at::kCPU);
    whole = gather_state_dicts(whole, *stages_);
  }
  return whole;
}

at::Tensor Placements::whole(const std::string& name, const at::Tensor& local) const {
  const Placement p = of(name, local);
  if (!p.cut()) return local;
  if (p.part.size == 1) return TensorParallel::join({local}, p.shard);
  Communicator& group = p.shard.experts ? *ep_.group() : *tp_.group();
  // The parts laid end to end, then joined as the split says (fused blocks, padding).
  const at::Tensor laid = collectives::all_gather_along(local.contiguous(), p.shard.dim, group);
  return TensorParallel::join(laid.chunk(p.part.size, p.shard.dim), p.shard);
}

StateDict Placements::whole_everywhere(const StateDict& local) const {
  if (stages_) {
    throw Error("placements: the pipeline's stages hold different blocks, so no rank can hold the whole model "
                "beside its own stages; gather it onto rank 0 (gather_whole) or use parallelism.pp: 1");
  }
  StateDict whole;
  for (const auto& [name, t] : local) whole[name] = this->whole(name, t);
  return whole;
}

StateDict Placements::cut(const StateDict& whole) const {
  StateDict local;  // part_of is the tensor itself where nothing is split or padded
  for (const auto& [name, t] : whole) {
    const TensorShard shard = shard_in(plan_, name);
    local[name] = part_of(t, shard, ranks_of(shard, tp_, ep_));
  }
  return local;
}

std::vector<std::int64_t> Placements::count_whole(
    const std::vector<std::pair<std::string, at::Tensor>>& named,
    const std::vector<std::function<bool(const std::string&, const at::Tensor&)>>& selected) const {
  std::vector<std::int64_t> counts(selected.size(), 0);
  for (const auto& [name, t] : named) {
    const Placement p = of(name, t);
    // Each split tensor counted whole (every tensor-parallel rank knows its whole shape), a
    // tied copy not at all: the first stage counts it.
    if (p.tied_copy) continue;
    for (std::size_t i = 0; i < selected.size(); ++i) {
      if (selected[i](name, t)) counts[i] += p.whole_numel();
    }
  }
  if (stages_) {
    at::Tensor summed = at::tensor(counts, at::kLong);
    stages_->all_reduce(summed);
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = summed[static_cast<std::int64_t>(i)].item<std::int64_t>();
  }
  return counts;
}

bool Placements::writes_state(const Placement& p) const {
  if (p.tied_copy) return false;
  // Stacked experts are whole on every tensor-parallel rank: its first writes theirs. A
  // replicated tensor's state is written by each tensor-parallel rank alike (the layouts
  // name it whole, and the merge keeps one).
  if (p.shard.experts && p.replica > 0) return false;
  if (p.state.sharded) return !p.state.replica;
  if (!mesh_) return true;
  return (p.shard.experts ? mesh_->expert_data_parallel() : mesh_->gradient_group()).rank() == 0;
}

}  // namespace tessera
