// tessera::rms_norm: Tessera's CPU kernel (rms_norm_kernel.cpp) where it applies, LibTorch's
// rms_norm elsewhere. This file splits the rows over LibTorch's intra-op threads and makes the
// kernel an autograd function.
#include "tessera/kernels/rms_norm.hpp"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "avx2_math.hpp"
#include "rms_norm_kernel.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

namespace kernel = rms_norm_kernel;

// Rows go to the threads in blocks of this many; backward sums the weight's gradient per block,
// then the blocks in order, so it does not depend on the thread count.
constexpr std::int64_t kRowsPerBlock = 64;

std::int64_t blocks_of(std::int64_t rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

// Rows [first, last) of block b.
std::pair<std::int64_t, std::int64_t> block_rows(std::int64_t rows, std::int64_t b) {
  return {b * kRowsPerBlock, std::min(rows, (b + 1) * kRowsPerBlock)};
}

// y and each row's reciprocal RMS.
std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
  const std::int64_t cols = x.size(-1), rows = x.numel() / std::max<std::int64_t>(cols, 1);
  at::Tensor y = at::empty_like(x), r = at::empty({rows}, x.options());
  // One block (a decode step's rows) runs on the calling thread.
  at::parallel_for(0, blocks_of(rows), 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const auto [first, last] = block_rows(rows, b);
      kernel::forward(last - first, cols, static_cast<float>(eps), static_cast<float>(offset),
                      x.const_data_ptr<float>() + first * cols, weight.const_data_ptr<float>(),
                      y.mutable_data_ptr<float>() + first * cols, r.mutable_data_ptr<float>() + first);
    }
  });
  return {y, r};
}

struct CpuRmsNorm : torch::autograd::Function<CpuRmsNorm> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, double offset) {
    const at::Tensor rows = x.contiguous();
    auto [y, r] = tessera::forward(rows, weight.contiguous(), eps, offset);
    ctx->save_for_backward({rows, weight, r});
    ctx->saved_data["offset"] = offset;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    if (c10::GradMode::is_enabled()) {
      throw Error("rms_norm: backward with create_graph (a second derivative) is not supported by Tessera's CPU "
                  "kernel");
    }
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor weight = saved[1].contiguous();
    const at::Tensor& r = saved[2];
    const at::Tensor dy = grad_outputs[0].to(at::kFloat).contiguous();
    const auto offset = static_cast<float>(ctx->saved_data["offset"].toDouble());
    const std::int64_t cols = x.size(-1), rows = r.numel();
    at::Tensor dx = at::empty_like(x);
    const std::int64_t blocks = blocks_of(rows);
    at::Tensor partial = at::zeros({blocks, cols}, x.options());  // each block's share of dw
    at::parallel_for(0, blocks, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t b = begin; b < end; ++b) {
        const auto [first, last] = block_rows(rows, b);
        kernel::backward(last - first, cols, offset, x.const_data_ptr<float>() + first * cols,
                         weight.const_data_ptr<float>(), r.const_data_ptr<float>() + first,
                         dy.const_data_ptr<float>() + first * cols, dx.mutable_data_ptr<float>() + first * cols,
                         partial.mutable_data_ptr<float>() + b * cols);
      }
    });
    at::Tensor dw = at::empty({cols}, x.options());
    float* sum = dw.mutable_data_ptr<float>();
    const float* parts = partial.const_data_ptr<float>();
    std::copy(parts, parts + cols, sum);
    for (std::int64_t b = 1; b < blocks; ++b) {
      for (std::int64_t c = 0; c < cols; ++c) sum[c] += parts[b * cols + c];
    }
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool rms_norm_uses_cpu_kernel(const at::Tensor& x, const at::Tensor& weight) {
  static const bool cpu_has_it = avx2::cpu_supported();
  const auto float_on_cpu = [](const at::Tensor& t) {
    return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && t.scalar_type() == at::kFloat;
  };
  return cpu_has_it && float_on_cpu(x) && float_on_cpu(weight) && x.dim() >= 1 && weight.dim() == 1 &&
         weight.size(0) == x.size(-1) && x.size(-1) > 0;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
  if (!rms_norm_uses_cpu_kernel(x, weight)) {
    const at::Tensor normed = at::rms_norm(x.to(at::kFloat), {x.size(-1)}, std::nullopt, eps);
    if (offset == 0.0) return normed.to(x.scalar_type()) * weight.to(x.scalar_type());
    return (normed * (weight.to(at::kFloat) + offset)).to(x.scalar_type());
  }
  if (c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())) {
    return CpuRmsNorm::apply(x, weight, eps, offset);
  }
  return forward(x.contiguous(), weight.contiguous(), eps, offset).first;
}

}  // namespace tessera
