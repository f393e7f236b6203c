// Context parallelism's slices and Ulysses attention (tessera/parallel/context_parallel.hpp);
// ring attention is ring_attention.cpp.
#include "tessera/parallel/context_parallel.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <utility>
#include <vector>

#include "ring_attention.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera {
namespace {

// The chunks of the sequence, in the order the ranks' slices hold them: rank 0's two, rank 1's
// two, ... (chunk r and 2 cp - 1 - r for rank r).
std::vector<std::int64_t> chunk_order(std::int64_t cp) {
  std::vector<std::int64_t> order;
  for (std::int64_t r = 0; r < cp; ++r) {
    order.push_back(r);
    order.push_back(2 * cp - 1 - r);
  }
  return order;
}

// Where each position of the whole sequence (in natural order) sits in the ranks' slices laid
// end to end, and back: index tensors for index_select.
at::Tensor rank_order_positions(std::int64_t length, std::int64_t cp, const c10::Device& device) {
  const std::int64_t chunk = length / (2 * cp);
  std::vector<at::Tensor> parts;
  for (std::int64_t c : chunk_order(cp)) parts.push_back(at::arange(c * chunk, (c + 1) * chunk, at::kLong));
  return at::cat(parts).to(device);
}

// Plain causal attention over a whole sequence (natural order), within documents when given.
at::Tensor whole_sequence_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& document_ids) {
  const bool gqa = k.size(1) != q.size(1);
  if (!document_ids.defined()) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, gqa);
  }
  const std::int64_t length = q.size(2);
  const at::Tensor causal = at::ones({length, length}, q.options().dtype(at::kBool)).tril();
  const at::Tensor same_document = document_ids.unsqueeze(2).eq(document_ids.unsqueeze(1));  // [B, T, T]
  const at::Tensor mask = same_document.logical_and(causal).unsqueeze(1);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, std::nullopt, gqa);
}

}  // namespace

ContextParallel::ContextParallel() : group_(make_single_rank_communicator()) {}

ContextParallel::ContextParallel(std::shared_ptr<Communicator> group, Attention attention)
    : group_(std::move(group)), attention_(attention) {
  if (!group_) throw Error("ContextParallel: no group");
  size_ = group_->world_size();
  rank_ = group_->rank();
}

ContextParallel ContextParallel::of(const RunContext& run) {
  if (!run.mesh || run.mesh->dims().cp == 1) return ContextParallel();
  const Attention kind = run.mesh->dims().cp_type == "ulysses" ? Attention::ulysses : Attention::ring;
  return ContextParallel(run.mesh->group_ptr({MeshAxis::cp}), kind);
}

at::Tensor ContextParallel::positions(std::int64_t length, const c10::Device& device) const {
  if (size_ == 1) return at::arange(length, at::TensorOptions().dtype(at::kLong).device(device));
  if (length % (2 * size_) != 0) {
    throw Error("context parallelism: a sequence of " + std::to_string(length) + " positions does not split into " +
                std::to_string(2 * size_) + " equal chunks (2 x cp)");
  }
  const std::int64_t chunk = length / (2 * size_);
  const std::int64_t early = rank_, late = 2 * size_ - 1 - rank_;
  return at::cat({at::arange(early * chunk, (early + 1) * chunk, at::kLong),
                  at::arange(late * chunk, (late + 1) * chunk, at::kLong)})
      .to(device);
}

at::Tensor ContextParallel::slice(const at::Tensor& t, std::int64_t dim) const {
  if (size_ == 1) return t;
  return t.index_select(dim, positions(t.size(dim), t.device()));
}

at::Tensor ContextParallel::gather(const at::Tensor& t, std::int64_t dim) const {
  if (size_ == 1) return t;
  const at::Tensor laid_end_to_end = collectives::gather_from(t, dim, group_);
  const std::int64_t length = laid_end_to_end.size(dim);
  // Natural position p sits at index inverse[p] of the slices laid end to end.
  const at::Tensor inverse = at::argsort(rank_order_positions(length, size_, t.device()));
  return laid_end_to_end.index_select(dim, inverse);
}

at::Tensor ContextParallel::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& document_ids) const {
  if (size_ == 1) return whole_sequence_attention(q, k, v, document_ids);
  if (attention_ == Attention::ring) return ring_attention(q, k, v, document_ids, group_);
  // Ulysses: [B, H, T/cp, D] sequence slices -> [B, H/cp, T, D] head slices (the sequence in the
  // ranks' order), attention in natural order, and back.
  const std::int64_t heads = q.size(1), kv_heads = k.size(1);
  if (heads % size_ != 0) {
    throw Error("ulysses attention: " + std::to_string(heads) + " heads do not divide over " + std::to_string(size_) +
                " context-parallel ranks");
  }
  at::Tensor keys = k, values = v;
  if (kv_heads % size_ != 0) {
    // Too few key/value heads to split: each query head gets its own copy.
    static bool said = false;
    if (!said) {
      log::info("ulysses attention: ", kv_heads, " key/value heads do not divide over ", size_,
                " context-parallel ranks; they are replicated to the ", heads, " query heads for the exchange");
      said = true;
    }
    keys = k.repeat_interleave(heads / kv_heads, 1);
    values = v.repeat_interleave(heads / kv_heads, 1);
  }
  const std::int64_t length = q.size(2) * size_;
  const at::Tensor order = rank_order_positions(length, size_, q.device());
  const at::Tensor natural = at::argsort(order);
  auto to_heads = [&](const at::Tensor& t) {
    return collectives::all_to_all(t, 1, 2, group_).index_select(2, natural);
  };
  const at::Tensor documents = document_ids.defined() ? document_ids : at::Tensor();
  at::Tensor y = whole_sequence_attention(to_heads(q), to_heads(keys), to_heads(values), documents);
  // Back to the ranks' order of the sequence, then from head slices to sequence slices.
  y = y.index_select(2, order);
  return collectives::all_to_all(y, 2, 1, group_);
}

}  // namespace tessera
