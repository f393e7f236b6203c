// Clipping by the global norm: the coefficient min(1, max_norm / (norm + 1e-6)) scales every
// gradient, each in its own dtype's arithmetic.
#include "tessera/core/train/gradient_clipping.hpp"

#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>

namespace tessera::core {
namespace gradient_clipping_test {

at::Tensor norm_of(double value) { return at::scalar_tensor(value, at::kFloat); }

TEST(GradientClipping, AboveTheLimitEveryGradientIsScaledToIt) {
  std::vector<at::Tensor> grads = {at::full({4}, 3.0), at::full({2, 2}, -6.0)};
  clip_gradients_by_norm(grads, norm_of(12.0), 1.5);
  const float coef = 1.5f / (12.0f + 1e-6f);
  EXPECT_FLOAT_EQ(grads[0][0].item<float>(), 3.0f * coef);
  EXPECT_FLOAT_EQ(grads[1][1][1].item<float>(), -6.0f * coef);
}

TEST(GradientClipping, AtOrBelowTheLimitGradientsAreUnchanged) {
  std::vector<at::Tensor> grads = {at::full({3}, 0.25)};
  clip_gradients_by_norm(grads, norm_of(0.5), 1.0);
  EXPECT_TRUE(grads[0].equal(at::full({3}, 0.25)));
}

// A bf16 parameter listed first (a plugin may keep one in bf16) must not round the coefficient
// that scales the float32 gradients after it: 1/3 in bf16 is 0.333984375, 0.2 % off.
TEST(GradientClipping, EachDtypeIsScaledByTheCoefficientInItsOwnPrecision) {
  std::vector<at::Tensor> grads = {at::full({2}, 3.0, at::kBFloat16), at::full({2}, 3.0), at::full({1}, 3.0, at::kDouble)};
  clip_gradients_by_norm(grads, norm_of(3.0), 1.0);
  const at::Tensor coef = 1.0 / (norm_of(3.0) + 1e-6);
  EXPECT_FLOAT_EQ(grads[1][0].item<float>(), 3.0f * coef.item<float>());
  EXPECT_NEAR(grads[2][0].item<double>(), 1.0, 1e-6);
  EXPECT_EQ(grads[0][0].item<float>(), (at::full({}, 3.0, at::kBFloat16) * coef.to(at::kBFloat16)).item<float>());
  EXPECT_EQ(grads[0].scalar_type(), at::kBFloat16);
}

}  // namespace gradient_clipping_test
}  // namespace tessera::core
