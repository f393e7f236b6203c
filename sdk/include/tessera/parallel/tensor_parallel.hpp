// Tensor (and sequence) parallelism for a model's layers, as Megatron-LM builds it: a linear
// split by output units (column-parallel: attention heads, MLP hidden units) feeds one split by
// input units (row-parallel: the projections back to the residual stream), so a block needs one
// reduction forward and one backward; the token embedding and the output head split the
// vocabulary. With sequence parallelism the residual stream, norms and dropout run on this rank's
// slice of the sequence, and all-gather / reduce-scatter replace the all-reduces.
//
// A model says how its parameters split in one place, Model::tensor_parallel_plan() (name ->
// TensorShard), builds its layers at their local sizes, and writes its forward pass with the
// calls below, which read like the plain layers; with one rank (the default TensorParallel) each
// call is the plain computation. Its config declares the axis (ConfigFields::splits_over(tp)) and
// the divisibility rules, so `tessera validate` refuses a mesh the model cannot take.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"
#include "tessera/parallel/sharded_rng.hpp"

namespace tessera {

// How one parameter is split over the tensor-parallel ranks (or, for an MoE layer's stacked
// experts, over the expert-parallel ranks: tessera/parallel/expert_parallel.hpp).
struct TensorShard {
  std::int64_t dim = -1;    // the dimension split in equal parts; -1: replicated (whole on every rank)
  std::int64_t blocks = 1;  // that dimension holds `blocks` equal blocks split each (a fused q|k|v: 3)
  bool experts = false;     // split over the expert-parallel ranks rather than the tensor-parallel ones
  // Replicated, but used on each rank's heads only (per-head norms, latent attention's down
  // projections): its gradient is summed over the tensor-parallel ranks in every backward
  // (TensorParallel::shared_by_heads), as `tessera plan` counts.
  bool shared_by_heads = false;
  // A padded split (the vocabulary's, as Megatron-LM pads it): the dimension's true size `whole`
  // need not divide by the ranks. Each part is padded_part() long, a multiple of `multiple`; the
  // rows at or past `whole` are padding that exists only in the parts (zeros), never in a whole
  // tensor: part_of pads, join and whole_shape drop it. 0: the parts divide the dimension exactly.
  std::int64_t whole = 0;
  std::int64_t multiple = 1;

  bool replicated() const { return dim < 0; }
  bool padded() const { return whole > 0; }
  // A padded split's part on each of `ranks` ranks: ceil(whole / (multiple × ranks)) × multiple.
  std::int64_t padded_part(std::int64_t ranks) const {
    const std::int64_t step = multiple * ranks;
    return (whole + step - 1) / step * multiple;
  }
  bool operator==(const TensorShard& o) const {
    return dim == o.dim && blocks == o.blocks && experts == o.experts && shared_by_heads == o.shared_by_heads &&
           whole == o.whole && multiple == o.multiple;
  }
  static TensorShard columns(std::int64_t blocks = 1) { return {0, blocks}; }  // output units of [out, in]
  static TensorShard rows() { return {1, 1}; }                                  // input units of [out, in]
  // Rows of [vocab, hidden]: `vocab_size` rows padded so every rank holds the same number, a
  // multiple of `multiple` (pad_vocab_to_multiple_of); 0: vocab_size divides by the ranks.
  static TensorShard vocabulary(std::int64_t vocab_size = 0, std::int64_t multiple = 1) {
    return {0, 1, false, false, vocab_size, vocab_size > 0 ? multiple : 1};
  }
  static TensorShard expert_stack() { return {0, 1, true}; }                    // [experts, ...] over ep
  static TensorShard whole_for_heads() { return {-1, 1, false, true}; }         // see shared_by_heads
};

// Parameter name -> its split; a parameter absent is replicated.
using TensorParallelPlan = std::map<std::string, TensorShard>;

TESSERA_API TensorShard shard_in(const TensorParallelPlan& plan, const std::string& name);

// The ranks a shard's parts are spread over: this rank's place among them and their number.
struct ShardRanks {
  std::int64_t rank = 0;
  std::int64_t size = 1;
};
// The part of `whole` rank `ranks.rank` of `ranks.size` holds (a new contiguous tensor; `whole`
// itself when replicated or alone and unpadded), the whole shape of a part, and the whole from
// every part. A padded split's parts end in zero rows past its true size.
TESSERA_API at::Tensor part_of(const at::Tensor& whole, const TensorShard& shard, ShardRanks ranks);
TESSERA_API std::vector<std::int64_t> whole_shape(at::IntArrayRef local, const TensorShard& shard, ShardRanks ranks);

class TESSERA_API TensorParallel {
 public:
  // One rank: every call is the plain computation.
  TensorParallel();
  TensorParallel(std::shared_ptr<Communicator> group, bool sequence_parallel);
  // This run's tensor-parallel group from its mesh (one rank when it has none).
  static TensorParallel of(const RunContext& run);

  std::int64_t size() const { return size_; }
  std::int64_t rank() const { return rank_; }
  bool sequence_parallel() const { return sequence_parallel_ && size_ > 1; }
  const std::shared_ptr<Communicator>& group() const { return group_; }
  ShardRanks ranks() const { return {rank_, size_}; }

  // --- Sizes and values between a whole parameter and this rank's part --------------------------
  // This rank's share of `count` (heads, hidden units).
  std::int64_t local(std::int64_t count) const { return count / size_; }
  // The vocabulary rows each rank holds of `vocab_size`: padded to the same number on every rank,
  // a multiple of `multiple` (TensorShard::vocabulary(vocab_size, multiple)); the last ranks'
  // rows past vocab_size are padding that no id looks up and no logit of takes probability.
  std::int64_t vocab_rows(std::int64_t vocab_size, std::int64_t multiple = 1) const {
    return TensorShard::vocabulary(vocab_size, multiple).padded_part(size_);
  }
  // This rank's part of `whole` (a new contiguous tensor; `whole` itself when replicated).
  at::Tensor part_of(const at::Tensor& whole, const TensorShard& shard) const;
  // The whole shape of a parameter whose part on this rank has `local` shape.
  std::vector<std::int64_t> whole_shape(at::IntArrayRef local, const TensorShard& shard) const;
  // The whole tensor from every rank's part, in rank order.
  static at::Tensor join(const std::vector<at::Tensor>& parts, const TensorShard& shard);

  // --- Activations (batch, sequence, features); the sequence is dimension 1 --------------------
  // The input of column-parallel linears: the replicated stream, whose gradient is summed over
  // the ranks; with sequence parallelism the whole sequence gathered from the ranks' slices.
  at::Tensor column_input(const at::Tensor& x) const;
  // The output of a row-parallel linear (before its bias): the ranks' partial sums added up; with
  // sequence parallelism, added up and scattered onto the ranks' sequence slices.
  at::Tensor row_output(const at::Tensor& partial) const;
  // Token embeddings from this rank's rows of a vocabulary-split table (rows vocab_start() on):
  // ids outside them look up zeros, and the ranks' lookups are added up (scattered onto sequence
  // slices with sequence parallelism).
  at::Tensor vocab_embedding(const at::Tensor& ids, const at::Tensor& weight) const;
  // The first vocabulary row this rank holds of a table of `vocab_size` rows.
  std::int64_t vocab_start(std::int64_t vocab_size, std::int64_t multiple = 1) const {
    return rank_ * vocab_rows(vocab_size, multiple);
  }
  // A replicated parameter used on sequence slices (norms, row-parallel biases, positions): its
  // gradient is summed over the ranks. Without sequence parallelism the parameter itself.
  at::Tensor replicated(const at::Tensor& parameter) const;
  // A replicated parameter used on this rank's heads (Qwen3's per-head q/k norms): each rank's
  // gradient covers its heads only, so it is summed over the ranks whenever there are several.
  at::Tensor shared_by_heads(const at::Tensor& parameter) const;
  // Plain values per position (positions, document ids): this rank's slice of dimension 1 with
  // sequence parallelism, else `t`.
  at::Tensor sequence_slice(const at::Tensor& t) const;
  // Logits whose last dimension is this rank's vocabulary rows, whole (an all-gather; for
  // callers that want every logit: the loss never does), the padding past `vocab_size` dropped
  // (0: none).
  at::Tensor gather_vocabulary(const at::Tensor& logits, std::int64_t vocab_size = 0) const;

  // --- Randomness --------------------------------------------------------------------------------
  // Dropout of activations that differ across ranks (this rank's heads, its sequence slice)
  // draws from the sharded stream (tessera/parallel/sharded_rng.hpp); of replicated ones, from
  // the default generator, the same on every rank.
  at::Tensor dropout(const at::Tensor& x, double p, bool train, bool sharded) const;
  // Dropout of the residual stream: sharded exactly when sequence parallelism is on.
  at::Tensor stream_dropout(const at::Tensor& x, double p, bool train) const {
    return dropout(x, p, train, sequence_parallel());
  }

 private:
  std::shared_ptr<Communicator> group_;
  std::int64_t size_ = 1, rank_ = 0;
  bool sequence_parallel_ = false;
};

// RAII: the sharded random stream while alive, when `tp` has more than one rank.
class TESSERA_API ShardedRandomness {
 public:
  ShardedRandomness(const TensorParallel& tp, const c10::Device& device);
  ~ShardedRandomness();
  ShardedRandomness(const ShardedRandomness&) = delete;
  ShardedRandomness& operator=(const ShardedRandomness&) = delete;

 private:
  std::unique_ptr<ShardedRng::Scope> scope_;
};

}  // namespace tessera
