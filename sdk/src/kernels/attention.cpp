// tessera::causal_attention: Tessera's CPU kernel (causal_attention_kernel.cpp) where it applies,
// LibTorch's scaled_dot_product_attention elsewhere. This file lays the tensors out for the
// kernel, runs its (batch, head) pairs on LibTorch's intra-op threads and makes it an autograd
// function.
#include "tessera/kernels/attention.hpp"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <utility>
#include <string>
#include <vector>

#include "avx2_math.hpp"
#include "causal_attention_kernel.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

namespace kernel = attention_kernel;

// A [batch, seq, 3 · heads · dim] tensor's query, key and value heads as [batch, heads, seq, dim]
// views (GPT-2's c_attn layout: all query heads, then all key heads, then all value heads).
std::vector<at::Tensor> split_heads(const at::Tensor& qkv, std::int64_t heads) {
  const std::int64_t batch = qkv.size(0), seq = qkv.size(1), dim = qkv.size(2) / (3 * heads);
  return qkv.view({batch, seq, 3, heads, dim}).permute({2, 0, 3, 1, 4}).unbind(0);
}

// The inputs as the kernel reads them: float32 [batch, heads, seq, dim] views, each row's elements
// contiguous.
struct FloatInputs {
  at::Tensor q, k, v;
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, dim = 0;
  float scale = 1.0f;

  static FloatInputs of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    FloatInputs in;
    in.q = rows_contiguous(q.to(at::kFloat));
    in.k = rows_contiguous(k.to(at::kFloat));
    in.v = rows_contiguous(v.to(at::kFloat));
    in.batch = q.size(0);
    in.heads = q.size(1);
    in.kv_heads = k.size(1);
    in.seq = q.size(2);
    in.dim = q.size(3);
    in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in.dim)));
    return in;
  }

  // `qkv`: float32 [batch, seq, 3 · heads · dim], contiguous.
  static FloatInputs of_packed(const at::Tensor& qkv, std::int64_t heads) {
    const auto parts = split_heads(qkv, heads);
    return of(parts[0], parts[1], parts[2]);
  }

  std::int64_t group() const { return heads / kv_heads; }

  static at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }
};

// [batch, heads, seq, dim] float32 whose memory is [batch, seq, heads, dim]; not a view, so a
// custom function may return it and its users may modify it in place.
at::Tensor heads_tensor(std::int64_t batch, std::int64_t heads, std::int64_t seq, std::int64_t dim) {
  return at::empty_strided({batch, heads, seq, dim}, {seq * heads * dim, dim, heads * dim, 1},
                           at::TensorOptions().dtype(at::kFloat));
}

// Pair `head` of batch `b` of a [batch, heads, seq, dim] tensor with unit inner stride.
kernel::Rows rows_of(const at::Tensor& t, std::int64_t b, std::int64_t head) {
  return {t.const_data_ptr<float>() + b * t.stride(0) + head * t.stride(1), t.stride(2)};
}
kernel::MutableRows mutable_rows_of(at::Tensor& t, std::int64_t b, std::int64_t head) {
  return {t.mutable_data_ptr<float>() + b * t.stride(0) + head * t.stride(1), t.stride(2)};
}

// Runs `pair_fn(pair, scratch)` for every (batch, head) pair on LibTorch's intra-op threads, each
// thread with its own scratch of `scratch_floats`.
template <typename PairFn>
void for_each_pair(const FloatInputs& in, std::size_t scratch_floats, const PairFn& pair_fn) {
  at::parallel_for(0, in.batch * in.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scratch(scratch_floats);
    for (std::int64_t pair = begin; pair < end; ++pair) pair_fn(pair, scratch.data());
  });
}

at::Tensor probs_for(const FloatInputs& in) {
  return at::empty({in.batch, in.heads, in.seq, kernel::row_len(in.seq)}, at::TensorOptions().dtype(at::kFloat));
}

// The forward pass into `out` (float32 [batch, heads, seq, dim], unit inner stride); `probs`
// (probs_for) receives the probabilities when defined (for backward), else each thread keeps them
// in its scratch.
void forward_into(const FloatInputs& in, at::Tensor probs, at::Tensor& out) {
  const std::int64_t ld = kernel::row_len(in.seq);
  const std::size_t kernel_scratch = kernel::forward_scratch_floats(in.seq, in.dim);
  const std::size_t scratch = kernel_scratch + (probs.defined() ? 0 : static_cast<std::size_t>(in.seq * ld));
  float* all_probs = probs.defined() ? probs.mutable_data_ptr<float>() : nullptr;
  for_each_pair(in, scratch, [&](std::int64_t pair, float* scratch_data) {
    const std::int64_t b = pair / in.heads, h = pair % in.heads, kv = h / in.group();
    float* pair_probs = all_probs != nullptr ? all_probs + pair * in.seq * ld : scratch_data + kernel_scratch;
    kernel::forward_pair(in.seq, in.dim, in.scale, rows_of(in.q, b, h), rows_of(in.k, b, kv), rows_of(in.v, b, kv),
                         pair_probs, mutable_rows_of(out, b, h), scratch_data);
  });
}

at::Tensor forward(const FloatInputs& in, at::Tensor probs) {
  at::Tensor out = heads_tensor(in.batch, in.heads, in.seq, in.dim);
  forward_into(in, std::move(probs), out);
  return out;
}

// [batch, seq, heads · dim], written through a [batch, heads, seq, dim] alias; the result is the
// base tensor, not a view.
at::Tensor forward_merged(const FloatInputs& in, at::Tensor probs) {
  at::Tensor merged = at::empty({in.batch, in.seq, in.heads * in.dim}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor heads = merged.view({in.batch, in.seq, in.heads, in.dim}).permute({0, 2, 1, 3});
  forward_into(in, std::move(probs), heads);
  return merged;
}

// Second derivatives would need the kernel's backward to be differentiable; it is not.
void refuse_double_backward(const char* function) {
  if (c10::GradMode::is_enabled()) {
    throw Error(std::string(function) + ": backward with create_graph (a second derivative) is not supported by "
                "Tessera's CPU kernel");
  }
}

// The backward pass into float32 [batch, heads, seq, dim] views with unit inner stride; grad_k and
// grad_v have one head per query head (with grouped queries the caller sums each group).
void backward(const FloatInputs& in, const at::Tensor& probs, const at::Tensor& grad_out, at::Tensor& grad_q,
              at::Tensor& grad_k, at::Tensor& grad_v) {
  const std::int64_t ld = kernel::row_len(in.seq);
  const float* all_probs = probs.const_data_ptr<float>();
  for_each_pair(in, kernel::backward_scratch_floats(in.seq, in.dim), [&](std::int64_t pair, float* scratch) {
    const std::int64_t b = pair / in.heads, h = pair % in.heads, kv = h / in.group();
    kernel::backward_pair(in.seq, in.dim, in.scale, rows_of(in.q, b, h), rows_of(in.k, b, kv), rows_of(in.v, b, kv),
                          all_probs + pair * in.seq * ld, rows_of(grad_out, b, h), mutable_rows_of(grad_q, b, h),
                          mutable_rows_of(grad_k, b, h), mutable_rows_of(grad_v, b, h), scratch);
  });
}

std::int64_t dtype_code(const at::Tensor& t) { return static_cast<std::int64_t>(t.scalar_type()); }
at::ScalarType dtype_of(const at::IValue& code) { return static_cast<at::ScalarType>(code.toInt()); }

struct CpuCausalAttention : torch::autograd::Function<CpuCausalAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    const FloatInputs in = FloatInputs::of(q, k, v);
    at::Tensor probs = probs_for(in);
    at::Tensor out = tessera::forward(in, probs);
    ctx->save_for_backward({in.q, in.k, in.v, probs});
    ctx->saved_data["dtypes"] = std::vector<std::int64_t>{dtype_code(q), dtype_code(k), dtype_code(v)};
    return out.to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    refuse_double_backward("causal_attention");
    const auto saved = ctx->get_saved_variables();
    const FloatInputs in = FloatInputs::of(saved[0], saved[1], saved[2]);
    const at::Tensor grad_out = FloatInputs::rows_contiguous(grad_outputs[0].to(at::kFloat));
    at::Tensor grad_q = heads_tensor(in.batch, in.heads, in.seq, in.dim);
    at::Tensor grad_k = heads_tensor(in.batch, in.heads, in.seq, in.dim);
    at::Tensor grad_v = heads_tensor(in.batch, in.heads, in.seq, in.dim);
    tessera::backward(in, saved[3], grad_out, grad_q, grad_k, grad_v);
    if (in.group() > 1) {
      // [batch, seq, heads, dim] memory: query head h = kv · group + g.
      const auto per_kv_head = [&](const at::Tensor& g) {
        return g.permute({0, 2, 1, 3})
            .view({in.batch, in.seq, in.kv_heads, in.group(), in.dim})
            .sum(3)
            .permute({0, 2, 1, 3});
      };
      grad_k = per_kv_head(grad_k);
      grad_v = per_kv_head(grad_v);
    }
    const std::vector<std::int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    return {grad_q.to(static_cast<at::ScalarType>(dtypes[0])), grad_k.to(static_cast<at::ScalarType>(dtypes[1])),
            grad_v.to(static_cast<at::ScalarType>(dtypes[2]))};
  }
};

// causal_self_attention on the kernel: the heads are read from and their gradients written into
// qkv's layout, so neither direction splits or merges heads with a copy.
struct CpuCausalSelfAttention : torch::autograd::Function<CpuCausalSelfAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, std::int64_t heads) {
    const at::Tensor packed = qkv.to(at::kFloat).contiguous();
    const FloatInputs in = FloatInputs::of_packed(packed, heads);
    at::Tensor probs = probs_for(in);
    at::Tensor out = forward_merged(in, probs);
    ctx->save_for_backward({packed, probs});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["dtype"] = dtype_code(qkv);
    return out.to(qkv.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    refuse_double_backward("causal_self_attention");
    const auto saved = ctx->get_saved_variables();
    const FloatInputs in = FloatInputs::of_packed(saved[0], ctx->saved_data["heads"].toInt());
    const at::Tensor grad_out = grad_outputs[0]
                                    .to(at::kFloat)
                                    .contiguous()
                                    .view({in.batch, in.seq, in.heads, in.dim})
                                    .permute({0, 2, 1, 3});
    at::Tensor grad = at::empty_like(saved[0]);
    auto parts = split_heads(grad, in.heads);
    tessera::backward(in, saved[1], grad_out, parts[0], parts[1], parts[2]);
    return {grad.to(dtype_of(ctx->saved_data["dtype"])), at::Tensor()};
  }
};

bool same_kind(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.dim() == 4 && b.dim() == 4 && a.layout() == at::kStrided &&
         b.layout() == at::kStrided && a.device().is_cpu() && b.device().is_cpu() &&
         a.scalar_type() == b.scalar_type();
}

bool kernel_takes(at::ScalarType dtype, std::int64_t seq, std::int64_t dim, double dropout) {
  static const bool cpu_has_it = avx2::cpu_supported();
  // Under CPU autocast LibTorch's attention takes float32 heads down to the autocast dtype; the
  // kernel would answer in float32. Heads the projections made under autocast are bf16 already.
  if (dtype == at::kFloat && at::autocast::is_autocast_enabled(at::kCPU)) return false;
  return cpu_has_it && dropout <= 0.0 && (dtype == at::kFloat || dtype == at::kBFloat16) && seq >= 1 &&
         seq <= kCpuAttentionMaxSeq && attention_kernel::head_dim_supported(dim);
}

void check_packed(const at::Tensor& qkv, std::int64_t heads) {
  if (!qkv.defined() || qkv.dim() != 3 || heads < 1 || qkv.size(2) % (3 * heads) != 0) {
    throw Error("causal_self_attention: qkv must be [batch, seq, 3 · heads · head_dim] for " + std::to_string(heads) +
                " heads, got " + (qkv.defined() ? c10::str(qkv.sizes()) : std::string("an undefined tensor")));
  }
}

}  // namespace

bool causal_attention_uses_cpu_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout) {
  if (!same_kind(q, k) || !same_kind(q, v)) return false;
  if (k.sizes() != v.sizes() || q.size(0) != k.size(0) || q.size(2) != k.size(2) || q.size(3) != k.size(3)) {
    return false;
  }
  if (k.size(1) < 1 || q.size(1) % k.size(1) != 0) return false;
  return kernel_takes(q.scalar_type(), q.size(2), q.size(3), dropout);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout) {
  if (!causal_attention_uses_cpu_kernel(q, k, v, dropout)) {
    const bool grouped = q.dim() == 4 && k.dim() == 4 && q.size(1) != k.size(1);
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/true,
                                            /*scale=*/std::nullopt, /*enable_gqa=*/grouped);
  }
  const bool needs_grad = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (needs_grad) return CpuCausalAttention::apply(q, k, v);
  return forward(FloatInputs::of(q, k, v), at::Tensor()).to(q.scalar_type());
}

bool causal_self_attention_uses_cpu_kernel(const at::Tensor& qkv, std::int64_t heads, double dropout) {
  if (!qkv.defined() || qkv.dim() != 3 || heads < 1 || qkv.size(2) % (3 * heads) != 0) return false;
  if (qkv.layout() != at::kStrided || !qkv.device().is_cpu()) return false;
  return kernel_takes(qkv.scalar_type(), qkv.size(1), qkv.size(2) / (3 * heads), dropout);
}

at::Tensor causal_self_attention(const at::Tensor& qkv, std::int64_t heads, double dropout) {
  check_packed(qkv, heads);
  const std::int64_t batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3;
  if (!causal_self_attention_uses_cpu_kernel(qkv, heads, dropout)) {
    const auto parts = split_heads(qkv, heads);
    const at::Tensor y = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], /*attn_mask=*/{}, dropout,
                                                          /*is_causal=*/true);
    return y.transpose(1, 2).contiguous().view({batch, seq, width});
  }
  if (c10::GradMode::is_enabled() && qkv.requires_grad()) return CpuCausalSelfAttention::apply(qkv, heads);
  const at::Tensor packed = qkv.to(at::kFloat).contiguous();
  return forward_merged(FloatInputs::of_packed(packed, heads), at::Tensor()).to(qkv.scalar_type());
}

}  // namespace tessera
