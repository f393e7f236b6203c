// tessera::rms_norm against its formula in float64: values and the gradients of x and the weight
// on the CPU kernel (rows of less than a vector, at and past a vector's edge, a model's width, rows
// split over threads, Gemma's offset, strided inputs), the same gradient on any number of threads,
// and what it hands to LibTorch.
#include "tessera/kernels/rms_norm.hpp"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/rsqrt.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>


namespace tessera {
namespace rms_norm_test {

struct Shape {
  std::int64_t rows, cols;
  double offset;
  std::string name() const {
    return std::to_string(rows) + "x" + std::to_string(cols) + (offset != 0 ? "_offset" : "");
  }
};

// x / sqrt(mean(x²) + eps) · (w + offset) in float64.
at::Tensor formula(const at::Tensor& x, const at::Tensor& w, double eps, double offset) {
  const at::Tensor x64 = x.to(at::kDouble), w64 = w.to(at::kDouble);
  return x64 * at::rsqrt((x64 * x64).mean({-1}, /*keepdim=*/true) + eps) * (w64 + offset);
}

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class RmsNormCpuKernel : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!rms_norm_uses_cpu_kernel(at::randn({2, 8}), at::randn({8}))) {
      GTEST_SKIP() << "this CPU has no AVX2 + FMA: rms_norm uses LibTorch's, tested by its own suite";
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormCpuKernel,
                         ::testing::Values(Shape{3, 7, 0}, Shape{5, 8, 0}, Shape{4, 33, 1}, Shape{1, 256, 0},
                                           Shape{1168, 256, 0}, Shape{1000, 1024, 1}, Shape{37, 32, 0}),
                         [](const auto& info) { return info.param.name(); });

TEST_P(RmsNormCpuKernel, ValuesAndGradientsEqualTheFormula) {
  const Shape s = GetParam();
  at::manual_seed(1);
  const at::Tensor x = (at::randn({s.rows, s.cols}) * 3).requires_grad_();
  const at::Tensor w = at::randn({s.cols}).requires_grad_();
  const at::Tensor dy = at::randn({s.rows, s.cols});
  const at::Tensor y = rms_norm(x, w, 1e-6, s.offset);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_LT(max_difference(y, formula(x, w, 1e-6, s.offset)), 1e-5);
  const auto grads = torch::autograd::grad({y}, {x, w}, {dy});

  const at::Tensor x64 = x.detach().to(at::kDouble).requires_grad_();
  const at::Tensor w64 = w.detach().to(at::kDouble).requires_grad_();
  const auto expected = torch::autograd::grad({formula(x64, w64, 1e-6, s.offset)}, {x64, w64}, {dy.to(at::kDouble)});
  EXPECT_LT(max_difference(grads[0], expected[0]), 1e-4);
  // The weight's gradient sums every row: its error grows with them.
  EXPECT_LT(max_difference(grads[1], expected[1]), 1e-5 * static_cast<double>(s.rows) + 1e-5);

  c10::NoGradGuard no_grad;
  EXPECT_TRUE(rms_norm(x, w, 1e-6, s.offset).equal(y.detach())) << "without grad mode";
}

TEST(RmsNorm, TheWeightsGradientIsTheSameOnAnyNumberOfThreads) {
  const at::Tensor x = at::randn({4096, 64}).requires_grad_();
  const at::Tensor w = at::randn({64}).requires_grad_();
  const at::Tensor dy = at::randn({4096, 64});
  // LibTorch's composite backward (the fallback) promises no order of its sums.
  if (!rms_norm_uses_cpu_kernel(x, w)) GTEST_SKIP() << "no AVX2 + FMA: rms_norm uses LibTorch's";
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = torch::autograd::grad({rms_norm(x, w, 1e-5)}, {x, w}, {dy});
  at::set_num_threads(std::max(2, threads));
  const auto more = torch::autograd::grad({rms_norm(x, w, 1e-5)}, {x, w}, {dy});
  at::set_num_threads(threads);
  EXPECT_TRUE(one[0].equal(more[0]));
  EXPECT_TRUE(one[1].equal(more[1]));
}

TEST(RmsNorm, StridedInputsAsModelsMakeThem) {
  // A head's norm (qk-norm) over a [batch, seq, heads, dim] view of a projection's output.
  const at::Tensor projected = at::randn({2, 5, 3 * 32}).requires_grad_();
  const at::Tensor heads = projected.narrow(2, 32, 64).view({2, 5, 2, 32}).transpose(1, 2);
  const at::Tensor w = at::randn({32});
  const at::Tensor y = rms_norm(heads, w, 1e-6);
  EXPECT_EQ(y.sizes(), heads.sizes());
  EXPECT_LT(max_difference(y, formula(heads, w, 1e-6, 0.0)), 1e-5);
  const at::Tensor grad = torch::autograd::grad({y.sum()}, {projected})[0];
  EXPECT_TRUE(grad.narrow(2, 0, 32).eq(0).all().item<bool>());
  EXPECT_FALSE(grad.narrow(2, 32, 64).eq(0).all().item<bool>());
}

TEST(RmsNorm, ASecondDerivativeIsRefused) {
  const at::Tensor x = at::randn({3, 16}).requires_grad_();
  const at::Tensor w = at::randn({16});
  if (!rms_norm_uses_cpu_kernel(x, w)) GTEST_SKIP() << "no AVX2 + FMA";
  const at::Tensor y = rms_norm(x, w, 1e-6);
  try {
    torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph went through the kernel's backward";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("create_graph"), std::string::npos) << e.what();
  }
}

// bf16 activations (a head's norm under autocast) and other devices: LibTorch's rms_norm in
// float32, times the weight in x's dtype (offset 0) or in float32 (offset 1), as before the kernel.
TEST(RmsNorm, OtherInputsGoToLibTorchsRmsNorm) {
  const at::Tensor x = at::randn({4, 16}).to(at::kBFloat16);
  const at::Tensor w = at::randn({16});
  EXPECT_FALSE(rms_norm_uses_cpu_kernel(x, w));
  EXPECT_FALSE(rms_norm_uses_cpu_kernel(x.to(at::kFloat), at::randn({8}))) << "a weight of another width";
  const at::Tensor normed = at::rms_norm(x.to(at::kFloat), {16}, std::nullopt, 1e-6);
  EXPECT_TRUE(rms_norm(x, w, 1e-6).equal(normed.to(at::kBFloat16) * w.to(at::kBFloat16)));
  EXPECT_TRUE(rms_norm(x, w, 1e-6, 1.0).equal((normed * (w + 1.0)).to(at::kBFloat16)));
}

}  // namespace rms_norm_test
}  // namespace tessera
