// tessera::cached_attention: Tessera's CPU kernel (cached_attention_kernel.cpp) where it applies,
// LibTorch's scaled_dot_product_attention elsewhere. This file checks the inputs, lays them out for
// the kernel and runs its (batch, query head) pairs on LibTorch's intra-op threads.
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <optional>
#include <vector>

#include "avx2_math.hpp"
#include "cached_attention_kernel.hpp"
#include "tessera/kernels/attention.hpp"

namespace tessera {
namespace {

namespace kernel = attention_kernel;

bool needs_grad(const at::Tensor& t) { return c10::GradMode::is_enabled() && t.requires_grad(); }

}  // namespace

bool cached_attention_uses_cpu_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& visible) {
  static const bool cpu_supported = avx2::cpu_supported();
  // Under CPU autocast LibTorch's attention takes float32 inputs down to the autocast dtype; the
  // kernel would answer in float32.
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  const auto float_on_cpu = [](const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; };
  return cpu_supported && float_on_cpu(q) && float_on_cpu(k) && float_on_cpu(v) && q.dim() == 4 && k.dim() == 4 &&
         v.dim() == 4 && q.size(0) == k.size(0) && k.sizes() == v.sizes() && q.size(3) == k.size(3) &&
         q.size(1) % k.size(1) == 0 && q.size(2) <= kCpuCachedAttentionMaxQueries &&
         kernel::head_dim_supported(q.size(3)) && !needs_grad(q) && !needs_grad(k) && !needs_grad(v) &&
         (!visible.defined() || (visible.device().is_cpu() && visible.scalar_type() == at::kBool));
}

at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible,
                            std::optional<double> scale) {
  if (!cached_attention_uses_cpu_kernel(q, k, v, visible)) {
    const std::optional<at::Tensor> mask = visible.defined() ? std::optional<at::Tensor>(visible) : std::nullopt;
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale,
                                            /*enable_gqa=*/q.size(1) != k.size(1));
  }
  const std::int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3);
  const std::int64_t keys = k.size(2), group = heads / k.size(1);
  const auto rows = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  const at::Tensor qr = rows(q), kr = rows(k), vr = rows(v);
  // The mask's rows as the kernel reads them: keys contiguous, any dimension broadcast.
  at::Tensor seen;
  if (visible.defined()) {
    seen = visible.expand({batch, heads, queries, keys});
    if (seen.stride(3) != 1) seen = seen.contiguous();
  }
  // [batch, heads, queries, dim] over [batch, queries, heads, dim] memory: merging the heads back
  // with transpose(1, 2) copies nothing.
  at::Tensor out = at::empty_strided({batch, heads, queries, dim}, {queries * heads * dim, dim, heads * dim, 1},
                                     q.options());
  const float factor = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(dim)));
  const float* q_data = qr.const_data_ptr<float>();
  const float* k_data = kr.const_data_ptr<float>();
  const float* v_data = vr.const_data_ptr<float>();
  const bool* seen_data = seen.defined() ? seen.const_data_ptr<bool>() : nullptr;
  float* out_data = out.mutable_data_ptr<float>();
  at::parallel_for(0, batch * heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scratch(kernel::cached_scratch_floats(keys));
    for (std::int64_t pair = begin; pair < end; ++pair) {
      const std::int64_t b = pair / heads, h = pair % heads, kv = h / group;
      const kernel::Rows q_rows{q_data + b * qr.stride(0) + h * qr.stride(1), qr.stride(2)};
      const kernel::Rows k_rows{k_data + b * kr.stride(0) + kv * kr.stride(1), kr.stride(2)};
      const kernel::Rows v_rows{v_data + b * vr.stride(0) + kv * vr.stride(1), vr.stride(2)};
      const bool* pair_seen = seen_data != nullptr ? seen_data + b * seen.stride(0) + h * seen.stride(1) : nullptr;
      kernel::cached_pair(queries, keys, dim, factor, q_rows, k_rows, v_rows, pair_seen,
                          seen_data != nullptr ? seen.stride(2) : 0,
                          {out_data + b * out.stride(0) + h * out.stride(1), out.stride(2)}, scratch.data());
    }
  });
  return out;
}

}  // namespace tessera
