// Context parallelism: every sequence split over the cp ranks, so a rank holds and computes only
// its slice of each sequence's activations. The slices are balanced for causal attention: the
// sequence is cut into 2 x cp equal chunks and rank r holds chunks r and 2 cp - 1 - r (an early
// one and a late one, as torchtitan does), so every rank attends over about as many keys.
//
// Attention crosses the slices one of two ways (parallelism.cp_type):
//   ulysses  all-to-all from sequence slices to head slices, attention over the whole sequence on
//            heads / cp heads, all-to-all back (DeepSpeed-Ulysses; needs heads divisible by cp)
//   ring     key/value blocks passed around the ring of ranks while each rank's queries attend
//            to them with an online-softmax merge, forward and backward (ring attention), chunk
//            pairs that causality masks entirely skipped
// Positions (rotary or learned) are the global ones of the slice, packed documents' masks hold
// across slices, and the trainer takes each slice's loss on the slice's labels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API ContextParallel {
 public:
  enum class Attention { ring, ulysses };

  // One rank: the whole sequence, plain attention.
  ContextParallel();
  ContextParallel(std::shared_ptr<Communicator> group, Attention attention);
  // This run's context-parallel group from its mesh (one rank when it has none).
  static ContextParallel of(const RunContext& run);

  std::int64_t size() const { return size_; }
  std::int64_t rank() const { return rank_; }
  Attention attention_kind() const { return attention_; }
  const std::shared_ptr<Communicator>& group() const { return group_; }

  // The global positions of this rank's slice of a sequence of `length` (int64 [length / cp]).
  at::Tensor positions(std::int64_t length, const c10::Device& device) const;
  // This rank's slice of `t` along `dim` (a sequence dimension of `length` = t.size(dim)).
  at::Tensor slice(const at::Tensor& t, std::int64_t dim = 1) const;
  // The whole sequence again from every rank's slice along `dim`, in natural order (gradient:
  // this rank's slice of it). For callers that want every position's output, e.g. logits to
  // sample from; training never gathers.
  at::Tensor gather(const at::Tensor& t, std::int64_t dim = 1) const;

  // Causal attention of this rank's queries over the whole sequence. q [batch, heads, length /
  // cp, head_dim], k and v [batch, kv_heads, length / cp, head_dim] (grouped-query attention when
  // kv_heads < heads), all this rank's slice; `document_ids` (optional) [batch, length] for the
  // whole sequence: a query attends only within its document. Returns [batch, heads, length / cp,
  // head_dim]. A collective over the group.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& document_ids = {}) const;

 private:
  std::shared_ptr<Communicator> group_;
  std::int64_t size_ = 1, rank_ = 0;
  Attention attention_ = Attention::ring;
};

}  // namespace tessera
