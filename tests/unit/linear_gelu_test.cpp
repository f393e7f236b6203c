// tessera::linear_gelu against at::gelu(at::linear(...)) in float64: values and the gradients of
// x, the weight and the bias on the CPU kernel (rows and columns off the vector and block sizes,
// with and without a bias, the tails of the normal distribution), and where it hands over.
#include "tessera/kernels/linear_gelu.hpp"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tessera/run/precision.hpp"

namespace tessera {
namespace linear_gelu_test {

struct Case {
  std::vector<std::int64_t> x_sizes;
  std::int64_t out;
  bool bias;
  std::string name() const {
    std::string n;
    for (std::int64_t s : x_sizes) n += std::to_string(s) + "x";
    return n + "to" + std::to_string(out) + (bias ? "" : "_nobias");
  }
};

struct Layer {
  at::Tensor x, weight, bias;

  static Layer make(const Case& c) {
    Layer l;
    l.x = at::randn(c.x_sizes).requires_grad_();
    l.weight = (at::randn({c.out, c.x_sizes.back()}) * 0.3).requires_grad_();
    if (c.bias) l.bias = at::randn({c.out}).requires_grad_();
    return l;
  }
  std::vector<at::Tensor> inputs() const {
    return bias.defined() ? std::vector<at::Tensor>{x, weight, bias} : std::vector<at::Tensor>{x, weight};
  }
};

at::Tensor reference(const Layer& l) {
  return at::gelu(at::linear(l.x.to(at::kDouble), l.weight.to(at::kDouble),
                             l.bias.defined() ? l.bias.to(at::kDouble) : at::Tensor()));
}

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class GeluKernel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Layer probe = Layer::make({{2, 8}, 8, true});
    if (!linear_gelu_uses_cpu_kernel(probe.x, probe.weight, probe.bias)) {
      GTEST_SKIP() << "this CPU has no AVX2 + FMA: linear_gelu uses LibTorch's operators";
    }
  }
};

// Rows fewer than, equal to and more than the 64-row block; columns of part of a vector, whole
// vectors and a tail; the quickstart's MLP (2048 tokens, 128 -> 512).
INSTANTIATE_TEST_SUITE_P(Shapes, GeluKernel,
                         ::testing::Values(Case{{3, 5}, 7, true}, Case{{2, 7, 13}, 24, true}, Case{{64, 16}, 40, false},
                                           Case{{3, 70, 9}, 19, true}, Case{{16, 128, 128}, 512, true}),
                         [](const auto& info) { return info.param.name(); });

TEST_P(GeluKernel, ValuesAndGradientsEqualLibTorchsLinearAndGelu) {
  at::manual_seed(21);
  const Layer l = Layer::make(GetParam());
  ASSERT_TRUE(linear_gelu_uses_cpu_kernel(l.x, l.weight, l.bias));
  const at::Tensor y = linear_gelu(l.x, l.weight, l.bias);
  const at::Tensor expected = reference(l);
  ASSERT_EQ(y.sizes(), expected.sizes());
  EXPECT_LT(max_difference(y, expected), 2e-5);

  const at::Tensor upstream = at::randn(y.sizes());
  const auto grads = torch::autograd::grad({y}, l.inputs(), {upstream});
  const auto expected_grads = torch::autograd::grad({expected}, l.inputs(), {upstream.to(at::kDouble)});
  const char* names[] = {"x", "weight", "bias"};
  for (std::size_t i = 0; i < grads.size(); ++i) {
    ASSERT_EQ(grads[i].sizes(), expected_grads[i].sizes()) << names[i];
    // Sums over up to 2048 rows: float32 rounding grows with them.
    const double scale = std::max(1.0, expected_grads[i].abs().max().item<double>());
    EXPECT_LT(max_difference(grads[i], expected_grads[i]) / scale, 2e-5) << names[i];
  }
}

TEST_P(GeluKernel, WithoutGradModeItComputesTheSameValues) {
  at::manual_seed(22);
  const Layer l = Layer::make(GetParam());
  const at::Tensor with_grad = linear_gelu(l.x, l.weight, l.bias);
  c10::NoGradGuard no_grad;
  EXPECT_TRUE(linear_gelu(l.x, l.weight, l.bias).equal(with_grad.detach()));
}

// GELU of values across both tails and of the non-finite ones, as LibTorch computes them.
TEST(LinearGelu, TailsAndNonFiniteValuesAreGelusOwn) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Through a one-by-one identity layer, so the pre-activations are these values themselves.
  const at::Tensor values =
      at::cat({at::linspace(-40.0, 40.0, 321), at::tensor({inf, -inf, nan, -0.0f, 1e-30f})}).view({-1, 1});
  const at::Tensor one = at::ones({1, 1}), zero = at::zeros({1});
  if (!linear_gelu_uses_cpu_kernel(values, one, zero)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  const at::Tensor y = linear_gelu(values, one, zero).view({-1});
  const at::Tensor expected = at::gelu(values.view({-1}));
  const std::int64_t finite = 321;  // the linspace; the special values follow
  EXPECT_LT(max_difference(y.narrow(0, 0, finite), expected.narrow(0, 0, finite)), 1e-6);
  EXPECT_EQ(y[finite].item<float>(), inf);
  EXPECT_TRUE(std::isnan(y[finite + 1].item<float>())) << "-inf · Φ(-inf) = -inf · 0, as LibTorch's";
  EXPECT_TRUE(std::isnan(y[finite + 2].item<float>()));
  EXPECT_EQ(y[finite + 3].item<float>(), 0.0f);
  EXPECT_NEAR(y[finite + 4].item<float>(), 0.5e-30f, 1e-36f);
  EXPECT_TRUE(at::isnan(expected[finite + 1]).item<bool>()) << "LibTorch's GELU changed its answer at -inf";
}

// The bias gradient is summed in fixed blocks of rows (x's and the weight's come from LibTorch's
// matrix products, whose sums are its own).
TEST(LinearGelu, TheBiasGradientDoesNotDependOnTheNumberOfThreads) {
  at::manual_seed(23);
  const Layer l = Layer::make({{300, 24}, 40, true});
  if (!linear_gelu_uses_cpu_kernel(l.x, l.weight, l.bias)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  const at::Tensor upstream = at::randn({300, 40});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = torch::autograd::grad({linear_gelu(l.x, l.weight, l.bias)}, l.inputs(), {upstream});
  at::set_num_threads(std::max(2, threads));
  const auto many = torch::autograd::grad({linear_gelu(l.x, l.weight, l.bias)}, l.inputs(), {upstream});
  at::set_num_threads(threads);
  EXPECT_TRUE(one[2].equal(many[2]));
}

TEST(LinearGelu, ItsResultMayBeModifiedInPlaceAndASecondDerivativeIsRefused) {
  const Layer l = Layer::make({{4, 16}, 8, true});
  if (!linear_gelu_uses_cpu_kernel(l.x, l.weight, l.bias)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  at::Tensor y = linear_gelu(l.x, l.weight, l.bias);
  y.mul_(3.0);
  EXPECT_TRUE(at::isfinite(torch::autograd::grad({y.sum()}, {l.x})[0]).all().item<bool>());
  const at::Tensor z = linear_gelu(l.x, l.weight, l.bias);
  try {
    torch::autograd::grad({z.sum()}, {l.x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph went through the kernel's backward";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("create_graph"), std::string::npos) << e.what();
  }
}

// A bias that is a view with strides (or a broadcast) is read as such.
TEST(LinearGelu, AStridedBiasIsReadByItsStrides) {
  at::manual_seed(25);
  const Layer l = Layer::make({{5, 16}, 8, false});
  const at::Tensor table = at::randn({8, 3});
  const at::Tensor strided = table.select(1, 1), broadcast = at::randn({1}).expand({8});
  for (const at::Tensor& bias : {strided, broadcast}) {
    EXPECT_LT(max_difference(linear_gelu(l.x, l.weight, bias), at::gelu(at::linear(l.x, l.weight, bias))), 2e-5);
  }
}

// Where the kernel does not apply, linear_gelu is LibTorch's linear and GELU themselves.
TEST(LinearGelu, OtherInputsGoToLibTorchsOperators) {
  at::manual_seed(24);
  const Layer l = Layer::make({{4, 16}, 8, true});
  EXPECT_FALSE(linear_gelu_uses_cpu_kernel(l.x, l.weight, l.bias, "tanh"));
  EXPECT_TRUE(linear_gelu(l.x, l.weight, l.bias, "tanh").equal(at::gelu(at::linear(l.x, l.weight, l.bias), "tanh")));
  const at::Tensor x64 = l.x.to(at::kDouble), w64 = l.weight.to(at::kDouble), b64 = l.bias.to(at::kDouble);
  EXPECT_FALSE(linear_gelu_uses_cpu_kernel(x64, w64, b64));
  EXPECT_TRUE(linear_gelu(x64, w64, b64).equal(at::gelu(at::linear(x64, w64, b64))));
  {
    // Under bf16 autocast the product runs in bf16, as at::linear's does.
    AutocastGuard autocast(c10::Device(c10::kCPU), at::kBFloat16);
    EXPECT_FALSE(linear_gelu_uses_cpu_kernel(l.x, l.weight, l.bias));
    const at::Tensor y = linear_gelu(l.x, l.weight, l.bias);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(y.equal(at::gelu(at::linear(l.x, l.weight, l.bias))));
  }
}

}  // namespace linear_gelu_test
}  // namespace tessera
