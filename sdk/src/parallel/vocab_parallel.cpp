// Vocab-parallel cross-entropy (tessera/parallel/vocab_parallel.hpp). Per token t over the whole
// vocabulary V: loss_t = log Σ exp z - (1 - ε) z_label - ε · mean(z), computed from three sums
// over the group (the maximum for stability, Σ exp, and z_label plus Σ z for smoothing).
#include "tessera/parallel/vocab_parallel.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>

namespace tessera {

VocabParallelCrossEntropy vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& labels,
                                                       std::int64_t vocab_start, std::int64_t vocab_size,
                                                       Communicator& group, double label_smoothing,
                                                       std::int64_t ignore_index, bool with_grad) {
  c10::NoGradGuard no_grad;
  // A padded vocabulary's columns past vocab_size are left out (a rank may hold none of its own).
  const std::int64_t held = logits.size(-1);
  const std::int64_t local = std::max<std::int64_t>(0, std::min(held, vocab_size - vocab_start));
  const at::Tensor z = logits.narrow(-1, 0, local).to(at::kFloat);
  // The maximum over the whole vocabulary, for a stable exponent.
  at::Tensor max = local > 0 ? std::get<0>(z.max(-1))
                             : at::full({logits.size(0)}, -std::numeric_limits<float>::infinity(), z.options());
  group.all_reduce(max, ReduceOp::max);
  const at::Tensor shifted = z - max.unsqueeze(-1);
  const at::Tensor exp = shifted.exp();
  const at::Tensor valid = labels.ne(ignore_index);
  const at::Tensor mine = labels.ge(vocab_start).logical_and(labels.lt(vocab_start + local)).logical_and(valid);
  const at::Tensor local_label = at::where(mine, labels - vocab_start, 0);
  const at::Tensor label_logit =
      local > 0 ? shifted.gather(-1, local_label.unsqueeze(-1)).squeeze(-1) * mine : at::zeros_like(max);
  // One all-reduce for the three per-token sums: Σ exp, z_label, Σ z.
  at::Tensor sums = at::stack({exp.sum(-1), label_logit, label_smoothing > 0 ? shifted.sum(-1) : at::zeros_like(max)});
  group.all_reduce(sums);
  const at::Tensor log_normaliser = sums[0].log();
  at::Tensor per_token = log_normaliser - (1.0 - label_smoothing) * sums[1];
  if (label_smoothing > 0) per_token = per_token - label_smoothing * sums[2] / static_cast<double>(vocab_size);
  VocabParallelCrossEntropy out;
  out.sum = (per_token * valid).sum();
  if (with_grad) {
    // softmax - (1 - ε) onehot(label) - ε / V, for the tokens with a label.
    at::Tensor grad = exp / sums[0].unsqueeze(-1);
    if (label_smoothing > 0) grad = grad - label_smoothing / static_cast<double>(vocab_size);
    if (local > 0) {
      grad.scatter_add_(-1, local_label.unsqueeze(-1), (mine.to(at::kFloat) * -(1.0 - label_smoothing)).unsqueeze(-1));
    }
    out.grad_logits = grad * valid.unsqueeze(-1);
    if (local < held) out.grad_logits = at::constant_pad_nd(out.grad_logits, {0, held - local});
  }
  return out;
}

}  // namespace tessera
