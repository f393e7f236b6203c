#include "chunked_linear_cross_entropy.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/parallel/vocab_parallel.hpp"
#include "tessera/run/precision.hpp"

namespace tessera_plugins {
namespace {

// Where the vocabulary is split over ranks: the head's group and this rank's rows; `size` the
// true vocabulary (0: the head's rows), past which a padded head's columns take no probability.
struct VocabSplit {
  std::shared_ptr<tessera::Communicator> group;  // null: the whole vocabulary here
  std::int64_t start = 0, size = 0;
};

// One chunk's summed loss and, with `with_grad`, d loss / d logits (float32).
std::pair<at::Tensor, at::Tensor> chunk_loss(const at::Tensor& logits, const at::Tensor& labels, double label_smoothing,
                                             std::int64_t ignore_index, bool with_grad, const VocabSplit& split) {
  if (split.group) {
    const tessera::VocabParallelCrossEntropy ce = tessera::vocab_parallel_cross_entropy(
        logits, labels, split.start, split.size, *split.group, label_smoothing, ignore_index, with_grad);
    return {ce.sum, ce.grad_logits};
  }
  // A padded head (pad_vocab_to_multiple_of): its columns past the vocabulary are left out.
  const std::int64_t held = logits.size(-1);
  const std::int64_t real = split.size > 0 ? std::min(held, split.size) : held;
  const at::Tensor z = logits.narrow(-1, 0, real);
  if (!with_grad) {
    return {at::cross_entropy_loss(z.to(at::kFloat), labels, {}, at::Reduction::Sum, ignore_index, label_smoothing),
            at::Tensor()};
  }
  // The chunk's logits as a leaf, so ATen's own cross-entropy backward gives d loss / d logits
  // (label smoothing and ignored labels included).
  c10::AutoGradMode grad_mode(true);
  at::Tensor leaf = z.to(at::kFloat).detach().requires_grad_(true);
  at::Tensor loss = at::cross_entropy_loss(leaf, labels, {}, at::Reduction::Sum, ignore_index, label_smoothing);
  at::Tensor grad = torch::autograd::grad({loss}, {leaf})[0];
  if (real < held) grad = at::constant_pad_nd(grad, {0, held - real});
  return {loss.detach(), grad};
}

struct ChunkedLinearCrossEntropy : torch::autograd::Function<ChunkedLinearCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& labels, std::int64_t chunk_size,
                            double label_smoothing, std::int64_t ignore_index, at::ScalarType matmul_dtype,
                            bool with_grad, VocabSplit split, double softcap) {
    tessera::NoAutocast no_autocast(hidden.device());  // it chooses its dtypes itself
    const at::Tensor h_all = hidden.to(matmul_dtype);
    const at::Tensor w = weight.to(matmul_dtype);
    const bool has_bias = bias.numel() > 0;
    const at::Tensor b = has_bias ? bias.to(matmul_dtype) : at::Tensor();
    const std::int64_t tokens = hidden.size(0);
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    at::Tensor grad_hidden, grad_weight, grad_bias;
    if (with_grad) {
      grad_hidden = at::empty(hidden.sizes(), hidden.options());
      grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
      if (has_bias) grad_bias = at::zeros(bias.sizes(), bias.options().dtype(at::kFloat));
    }
    for (std::int64_t start = 0; start < tokens; start += chunk_size) {
      const std::int64_t n = std::min(chunk_size, tokens - start);
      const at::Tensor h = h_all.narrow(0, start, n);
      const at::Tensor y = labels.narrow(0, start, n);
      at::Tensor logits = at::linear(h, w, b);
      at::Tensor capped;  // tanh(z / cap), for the chain rule: d(cap · tanh(z / cap))/dz = 1 - tanh²
      if (softcap > 0) {
        capped = at::tanh(logits.to(at::kFloat) / softcap);
        logits = capped * softcap;
      }
      auto [loss, grad] = chunk_loss(logits, y, label_smoothing, ignore_index, with_grad, split);
      total += loss;
      if (!with_grad) continue;
      if (capped.defined()) grad = grad * (1 - capped * capped);
      const at::Tensor d_logits = grad.to(matmul_dtype);
      grad_hidden.narrow(0, start, n).copy_(d_logits.mm(w));
      grad_weight.add_(d_logits.t().mm(h));
      if (grad_bias.defined()) grad_bias.add_(d_logits.sum(0));
    }
    ctx->save_for_backward({grad_hidden, grad_weight, grad_bias});
    ctx->saved_data["weight_dtype"] = static_cast<std::int64_t>(weight.scalar_type());
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& scale = grad_outputs[0];
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data.at("weight_dtype").toInt());
    at::Tensor grad_hidden = saved[0].defined() ? saved[0] * scale.to(saved[0].scalar_type()) : at::Tensor();
    at::Tensor grad_weight = saved[1].defined() ? (saved[1] * scale).to(weight_dtype) : at::Tensor();
    at::Tensor grad_bias = saved[2].defined() ? (saved[2] * scale).to(weight_dtype) : at::Tensor();
    return {grad_hidden, grad_weight, grad_bias, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

}  // namespace

at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const tessera::OutputHead& head,
                                        const at::Tensor& labels, std::int64_t chunk_size, double label_smoothing,
                                        std::int64_t ignore_index) {
  const at::Tensor& weight = head.weight;
  const at::Tensor& bias = head.bias;
  VocabSplit split{nullptr, 0, head.vocab_size};
  if (head.vocab_parallel()) split = {head.vocab_group, head.vocab_start, head.vocab_size};
  if (chunk_size <= 0) {
    throw tessera::Error("chunked_linear_cross_entropy: chunk_size must be positive, got " + std::to_string(chunk_size));
  }
  const c10::DeviceType type = hidden.device().type();
  const at::ScalarType matmul_dtype =
      at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : hidden.scalar_type();
  const bool with_grad = c10::GradMode::is_enabled() &&
                         (hidden.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  // Custom functions take defined tensors only: no bias is an empty one.
  const at::Tensor bias_or_empty = bias.defined() ? bias : at::empty({0}, weight.options());
  return ChunkedLinearCrossEntropy::apply(hidden, weight, bias_or_empty, labels, chunk_size, label_smoothing, ignore_index,
                                          matmul_dtype, with_grad, split, head.logit_softcap);
}

}  // namespace tessera_plugins
