// tessera::linear_gelu: a bias-free matrix product and Tessera's fused bias + GELU kernel
// (gelu_kernel.cpp) where it applies, at::gelu(at::linear(...)) elsewhere. This file cuts the
// rows into blocks for LibTorch's intra-op threads and makes it an autograd function.
#include "tessera/kernels/linear_gelu.hpp"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "avx2_math.hpp"
#include "gelu_kernel.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

namespace kernel = gelu_kernel;

// The backward pass sums the bias gradient per block of this many rows, then the blocks in order:
// the same sum whatever the number of threads.
constexpr std::int64_t kRowsPerBlock = 64;

// [..., out] for x's [..., in].
std::vector<std::int64_t> output_sizes(at::IntArrayRef x_sizes, std::int64_t out) {
  std::vector<std::int64_t> sizes(x_sizes.begin(), x_sizes.end());
  sizes.back() = out;
  return sizes;
}

// h (float32 [rows, cols], contiguous) += bias, then GELU into y (contiguous, rows · cols); h keeps
// the pre-activation.
void bias_gelu(at::Tensor& h, const at::Tensor& bias, at::Tensor& y) {
  const std::int64_t rows = h.size(0), cols = h.size(1);
  float* h_data = h.mutable_data_ptr<float>();
  float* y_data = y.mutable_data_ptr<float>();
  const float* bias_data = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  at::parallel_for(0, rows, kRowsPerBlock, [&](std::int64_t begin, std::int64_t end) {
    kernel::bias_gelu_forward(end - begin, cols, h_data + begin * cols, bias_data, y_data + begin * cols);
  });
}

// The pre-activation's gradient from the activation's, and the bias gradient when asked for.
struct GeluGrad {
  at::Tensor grad_h, grad_bias;
};

GeluGrad gelu_grad(const at::Tensor& h, const at::Tensor& grad_y, bool with_bias) {
  const std::int64_t rows = h.size(0), cols = h.size(1);
  const std::int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  GeluGrad out;
  out.grad_h = at::empty_like(h);
  std::vector<float> partial(with_bias ? static_cast<std::size_t>(blocks * cols) : 0);
  const float* h_data = h.const_data_ptr<float>();
  const float* dy_data = grad_y.const_data_ptr<float>();
  float* dh_data = out.grad_h.mutable_data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t block = begin; block < end; ++block) {
      const std::int64_t first = block * kRowsPerBlock, count = std::min(kRowsPerBlock, rows - first);
      kernel::gelu_backward(count, cols, h_data + first * cols, dy_data + first * cols, dh_data + first * cols,
                            with_bias ? partial.data() + block * cols : nullptr);
    }
  });
  if (with_bias) {
    out.grad_bias = at::empty({cols}, h.options());
    float* sum = out.grad_bias.mutable_data_ptr<float>();
    std::copy(partial.begin(), partial.begin() + cols, sum);
    for (std::int64_t block = 1; block < blocks; ++block) {
      const float* part = partial.data() + block * cols;
      for (std::int64_t c = 0; c < cols; ++c) sum[c] += part[c];
    }
  }
  return out;
}

// x·Wᵀ without the bias (the matrix product writes its result once instead of starting from a
// broadcast copy of the bias), then bias + GELU in one pass. Returns {activation, pre-activation,
// x as rows}.
struct Forward {
  at::Tensor y, h, x_rows;
};

Forward run_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  Forward f;
  f.x_rows = x.reshape({-1, x.size(-1)}).contiguous();
  f.h = at::mm(f.x_rows, weight.t());
  // Allocated in its final shape: not a view, so users may modify it in place.
  f.y = at::empty(output_sizes(x.sizes(), weight.size(0)), f.h.options());
  bias_gelu(f.h, bias.defined() ? bias.contiguous() : bias, f.y);
  return f;
}

// The autograd function, with and without a bias (an undefined tensor cannot be an input).
at::Tensor forward_saving(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                          const at::Tensor& bias) {
  Forward f = run_forward(x, weight, bias);
  ctx->save_for_backward({f.x_rows, weight, f.h});
  ctx->saved_data["x_sizes"] = x.sizes().vec();
  return f.y;
}

// {grad x, grad weight, grad bias}, each undefined where not needed.
torch::autograd::variable_list backward_from(torch::autograd::AutogradContext* ctx, const at::Tensor& grad_output,
                                             bool bias_grad) {
  if (c10::GradMode::is_enabled()) {
    throw Error("linear_gelu: backward with create_graph (a second derivative) is not supported by Tessera's CPU "
                "kernel");
  }
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &x_rows = saved[0], &weight = saved[1], &h = saved[2];
  const GeluGrad g = gelu_grad(h, grad_output.reshape({-1, weight.size(0)}).contiguous(), bias_grad);
  at::Tensor grad_x, grad_weight;
  if (ctx->needs_input_grad(0)) grad_x = at::mm(g.grad_h, weight).view(ctx->saved_data["x_sizes"].toIntVector());
  if (ctx->needs_input_grad(1)) grad_weight = at::mm(g.grad_h.t(), x_rows);
  return {grad_x, grad_weight, g.grad_bias};
}

struct CpuLinearGelu : torch::autograd::Function<CpuLinearGelu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    return forward_saving(ctx, x, weight, bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    return backward_from(ctx, grad_outputs[0], ctx->needs_input_grad(2));
  }
};

struct CpuLinearGeluWithoutBias : torch::autograd::Function<CpuLinearGeluWithoutBias> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    return forward_saving(ctx, x, weight, at::Tensor());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    torch::autograd::variable_list grads = backward_from(ctx, grad_outputs[0], false);
    grads.pop_back();
    return grads;
  }
};

bool float32_on_cpu(const at::Tensor& t) {
  return t.layout() == at::kStrided && t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

}  // namespace

bool linear_gelu_uses_cpu_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const std::string& approximate) {
  if (approximate != "none" || !x.defined() || !weight.defined() || x.dim() < 1 || weight.dim() != 2) return false;
  if (x.size(-1) != weight.size(1) || x.numel() == 0) return false;
  if (!float32_on_cpu(x) || !float32_on_cpu(weight)) return false;
  if (bias.defined() && (!float32_on_cpu(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0))) return false;
  // Under autocast at::linear computes in bf16; the kernel would not.
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;
  static const bool cpu_has_it = avx2::cpu_supported();
  return cpu_has_it;
}

at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       const std::string& approximate) {
  if (!linear_gelu_uses_cpu_kernel(x, weight, bias, approximate)) {
    return at::gelu(at::linear(x, weight, bias), approximate);
  }
  const bool needs_grad = c10::GradMode::is_enabled() &&
                          (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (needs_grad) {
    return bias.defined() ? CpuLinearGelu::apply(x, weight, bias) : CpuLinearGeluWithoutBias::apply(x, weight);
  }
  return run_forward(x, weight, bias).y;
}

}  // namespace tessera
