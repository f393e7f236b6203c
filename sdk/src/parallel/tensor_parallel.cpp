// Tensor-parallel layers over the autograd collectives (tessera/parallel/tensor_parallel.hpp).
#include "tessera/parallel/tensor_parallel.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {

TensorShard shard_in(const TensorParallelPlan& plan, const std::string& name) {
  const auto it = plan.find(name);
  return it == plan.end() ? TensorShard{} : it->second;
}

TensorParallel::TensorParallel() : group_(make_single_rank_communicator()) {}

TensorParallel::TensorParallel(std::shared_ptr<Communicator> group, bool sequence_parallel)
    : group_(std::move(group)), sequence_parallel_(sequence_parallel) {
  if (!group_) throw Error("TensorParallel: no group");
  size_ = group_->world_size();
  rank_ = group_->rank();
}

TensorParallel TensorParallel::of(const RunContext& run) {
  if (!run.mesh || run.mesh->dims().tp == 1) return TensorParallel();
  return TensorParallel(run.mesh->group_ptr({MeshAxis::tp}), run.mesh->dims().sequence_parallel);
}

at::Tensor part_of(const at::Tensor& whole, const TensorShard& shard, ShardRanks ranks) {
  if (shard.padded()) {
    if (shard.blocks != 1 || whole.size(shard.dim) != shard.whole) {
      throw Error("a tensor of shape " + c10::str(whole.sizes()) + " is not the whole of a padded split of " +
                  std::to_string(shard.whole) + " along dimension " + std::to_string(shard.dim));
    }
    const std::int64_t part = shard.padded_part(ranks.size), start = ranks.rank * part;
    if (ranks.size == 1 && part == shard.whole) return whole;  // alone and nothing to pad
    const std::int64_t real = std::max<std::int64_t>(0, std::min(part, shard.whole - start));
    std::vector<std::int64_t> shape(whole.sizes().begin(), whole.sizes().end());
    shape[static_cast<std::size_t>(shard.dim)] = part;
    at::Tensor mine = at::zeros(shape, whole.options());
    if (real > 0) mine.narrow(shard.dim, 0, real).copy_(whole.narrow(shard.dim, start, real));
    return mine;
  }
  if (shard.replicated() || ranks.size == 1) return whole;
  const std::int64_t blocks = shard.blocks;
  if (whole.size(shard.dim) % (blocks * ranks.size) != 0) {
    throw Error("a tensor of shape " + c10::str(whole.sizes()) + " cannot be split in " + std::to_string(ranks.size) +
                " along dimension " + std::to_string(shard.dim) + " (in " + std::to_string(blocks) + " blocks)");
  }
  std::vector<at::Tensor> mine;
  for (const at::Tensor& block : whole.chunk(blocks, shard.dim)) {
    mine.push_back(block.chunk(ranks.size, shard.dim)[ranks.rank]);
  }
  return at::cat(mine, shard.dim).contiguous();
}

std::vector<std::int64_t> whole_shape(at::IntArrayRef local, const TensorShard& shard, ShardRanks ranks) {
  std::vector<std::int64_t> shape(local.begin(), local.end());
  if (shard.padded()) {
    shape.at(static_cast<std::size_t>(shard.dim)) = shard.whole;
  } else if (!shard.replicated()) {
    shape.at(static_cast<std::size_t>(shard.dim)) *= ranks.size;
  }
  return shape;
}

namespace {
// Stacked experts split over the expert-parallel ranks, not these.
void refuse_experts(const TensorShard& shard, const char* what) {
  if (shard.experts) {
    throw Error(std::string("TensorParallel::") + what + ": stacked experts are split over the expert-parallel ranks; "
                "use tessera::" + what + "(tensor, shard, ranks_of(shard, tp, ep))");
  }
}
}  // namespace

at::Tensor TensorParallel::part_of(const at::Tensor& whole, const TensorShard& shard) const {
  refuse_experts(shard, "part_of");
  return tessera::part_of(whole, shard, ranks());
}

std::vector<std::int64_t> TensorParallel::whole_shape(at::IntArrayRef local, const TensorShard& shard) const {
  refuse_experts(shard, "whole_shape");
  return tessera::whole_shape(local, shard, ranks());
}

at::Tensor TensorParallel::join(const std::vector<at::Tensor>& parts, const TensorShard& shard) {
  if (shard.padded()) return (parts.size() == 1 ? parts[0] : at::cat(parts, shard.dim)).narrow(shard.dim, 0, shard.whole);
  if (shard.replicated() || parts.size() == 1) return parts.at(0);
  // Block b of the whole is block b of every part, in rank order.
  std::vector<at::Tensor> pieces;
  for (std::int64_t b = 0; b < shard.blocks; ++b) {
    for (const at::Tensor& part : parts) pieces.push_back(part.chunk(shard.blocks, shard.dim)[b]);
  }
  return at::cat(pieces, shard.dim);
}

at::Tensor TensorParallel::column_input(const at::Tensor& x) const {
  if (size_ == 1) return x;
  return sequence_parallel() ? collectives::all_gather_from(x, 1, group_) : collectives::copy_to(x, group_);
}

at::Tensor TensorParallel::row_output(const at::Tensor& partial) const {
  if (size_ == 1) return partial;
  return sequence_parallel() ? collectives::reduce_scatter_to(partial, 1, group_) : collectives::reduce_from(partial, group_);
}

at::Tensor TensorParallel::vocab_embedding(const at::Tensor& ids, const at::Tensor& weight) const {
  if (size_ == 1) return at::embedding(weight, ids);
  const std::int64_t rows = weight.size(0), start = rank_ * rows;
  const at::Tensor outside = ids.lt(start).logical_or(ids.ge(start + rows));
  const at::Tensor local_ids = at::where(outside, 0, ids - start);
  const at::Tensor looked_up = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
  return row_output(looked_up);
}

at::Tensor TensorParallel::replicated(const at::Tensor& parameter) const {
  return sequence_parallel() ? collectives::copy_to(parameter, group_) : parameter;
}

at::Tensor TensorParallel::shared_by_heads(const at::Tensor& parameter) const {
  return size_ > 1 ? collectives::copy_to(parameter, group_) : parameter;
}

at::Tensor TensorParallel::sequence_slice(const at::Tensor& t) const {
  if (!sequence_parallel()) return t;
  if (t.size(1) % size_ != 0) {
    throw Error("sequence parallelism: a sequence of " + std::to_string(t.size(1)) + " positions does not split over " +
                std::to_string(size_) + " ranks");
  }
  return t.chunk(size_, 1)[rank_];
}

at::Tensor TensorParallel::gather_vocabulary(const at::Tensor& logits, std::int64_t vocab_size) const {
  const at::Tensor whole = size_ == 1 ? logits : collectives::gather_from(logits, -1, group_);
  return vocab_size > 0 && whole.size(-1) > vocab_size ? whole.narrow(-1, 0, vocab_size) : whole;
}

at::Tensor TensorParallel::dropout(const at::Tensor& x, double p, bool train, bool sharded) const {
  if (!train || p == 0.0) return x;
  if (!sharded || size_ == 1) return at::dropout(x, p, train);
  ShardedRandomness own(*this, x.device());
  return at::dropout(x, p, train);
}

ShardedRandomness::ShardedRandomness(const TensorParallel& tp, const c10::Device& device) {
  if (tp.size() > 1) scope_ = std::make_unique<ShardedRng::Scope>(device);
}
ShardedRandomness::~ShardedRandomness() = default;

}  // namespace tessera
