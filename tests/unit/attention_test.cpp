// tessera::causal_attention against LibTorch's scaled_dot_product_attention in float64: values
// and the gradients of q, k and v, on the CPU kernel (shapes at and around its vector and tile
// edges, grouped queries, strided inputs as models make them, bfloat16) and where it hands over.
#include "tessera/kernels/attention.hpp"

#include "tessera/error.hpp"
#include "tessera/run/precision.hpp"

#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace tessera {
namespace attention_test {

struct Shape {
  std::int64_t batch, heads, kv_heads, seq, dim;
  std::string name() const {
    return std::to_string(batch) + "x" + std::to_string(heads) + "_kv" + std::to_string(kv_heads) + "_seq" +
           std::to_string(seq) + "_dim" + std::to_string(dim);
  }
};

// q, k, v as the models make them: views into one projection's output, rows a large stride apart.
struct Inputs {
  at::Tensor qkv, q, k, v;

  static Inputs make(const Shape& s, at::ScalarType dtype = at::kFloat) {
    Inputs in;
    const std::int64_t width = (s.heads + 2 * s.kv_heads) * s.dim;
    in.qkv = at::randn({s.batch, s.seq, width}).to(dtype).requires_grad_();
    const auto heads = [&](std::int64_t first, std::int64_t count) {
      return in.qkv.narrow(2, first * s.dim, count * s.dim).view({s.batch, s.seq, count, s.dim}).transpose(1, 2);
    };
    in.q = heads(0, s.heads);
    in.k = heads(s.heads, s.kv_heads);
    in.v = heads(s.heads + s.kv_heads, s.kv_heads);
    return in;
  }
};

at::Tensor reference(const Inputs& in) {
  return at::scaled_dot_product_attention(in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble), {}, 0.0,
                                          /*is_causal=*/true, std::nullopt, in.q.size(1) != in.k.size(1));
}

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class CpuKernel : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const Inputs probe = Inputs::make({1, 1, 1, 8, 8});
    if (!causal_attention_uses_cpu_kernel(probe.q, probe.k, probe.v)) {
      GTEST_SKIP() << "this CPU has no AVX2 + FMA: causal_attention uses LibTorch's kernel, tested by its own suite";
    }
  }
};

// Sequences of one row, of less than a vector, of a vector and one, odd ones past a tile of 4,
// the quickstart's 128 and the kernel's longest; head sizes of one to sixteen vectors.
INSTANTIATE_TEST_SUITE_P(Shapes, CpuKernel,
                         ::testing::Values(Shape{2, 4, 4, 1, 8}, Shape{2, 4, 4, 7, 32}, Shape{2, 4, 4, 9, 16},
                                           Shape{3, 2, 2, 33, 40}, Shape{16, 4, 4, 128, 32}, Shape{2, 6, 2, 64, 64},
                                           Shape{2, 4, 1, 200, 24}, Shape{1, 2, 2, 256, 128}),
                         [](const auto& info) { return info.param.name(); });

TEST_P(CpuKernel, ValuesAndGradientsEqualScaledDotProductAttention) {
  at::manual_seed(7);
  const Shape s = GetParam();
  const Inputs in = Inputs::make(s);
  ASSERT_TRUE(causal_attention_uses_cpu_kernel(in.q, in.k, in.v));
  const at::Tensor out = causal_attention(in.q, in.k, in.v);
  const at::Tensor expected = reference(in);
  ASSERT_EQ(out.sizes(), expected.sizes());
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_LT(max_difference(out, expected), 1e-5);

  const at::Tensor upstream = at::randn(out.sizes());
  const at::Tensor grad = torch::autograd::grad({out}, {in.qkv}, {upstream})[0];
  const at::Tensor expected_grad = torch::autograd::grad({expected}, {in.qkv}, {upstream.to(at::kDouble)})[0];
  EXPECT_LT(max_difference(grad, expected_grad), 2e-5) << "the gradients of q, k and v, side by side in qkv";
}

TEST_P(CpuKernel, WithoutGradModeItComputesTheSameValues) {
  at::manual_seed(8);
  const Inputs in = Inputs::make(GetParam());
  const at::Tensor with_grad = causal_attention(in.q, in.k, in.v);
  c10::NoGradGuard no_grad;
  const at::Tensor without = causal_attention(in.q, in.k, in.v);
  EXPECT_FALSE(without.requires_grad());
  EXPECT_TRUE(without.equal(with_grad.detach()));
}

// causal_self_attention on one projection's output: the same values as splitting the heads and
// calling LibTorch's attention, and qkv's gradient in one piece.
TEST_P(CpuKernel, PackedHeadsGiveTheValuesAndGradientOfScaledDotProductAttention) {
  const Shape s = GetParam();
  if (s.kv_heads != s.heads) GTEST_SKIP() << "packed heads are GPT-2's: as many key/value heads as query heads";
  at::manual_seed(12);
  const Inputs in = Inputs::make(s);
  ASSERT_TRUE(causal_self_attention_uses_cpu_kernel(in.qkv, s.heads));
  const at::Tensor out = causal_self_attention(in.qkv, s.heads);
  ASSERT_EQ(out.sizes(), (std::vector<std::int64_t>{s.batch, s.seq, s.heads * s.dim}));
  const at::Tensor expected = reference(in).transpose(1, 2).reshape({s.batch, s.seq, s.heads * s.dim});
  EXPECT_LT(max_difference(out, expected), 1e-5);
  const at::Tensor upstream = at::randn(out.sizes());
  const at::Tensor grad = torch::autograd::grad({out}, {in.qkv}, {upstream})[0];
  const at::Tensor expected_grad = torch::autograd::grad({expected}, {in.qkv}, {upstream.to(at::kDouble)})[0];
  EXPECT_LT(max_difference(grad, expected_grad), 2e-5);
  EXPECT_TRUE(grad.is_contiguous());
}

TEST(CausalAttention, PackedHeadsElsewhereAreLibTorchsAttentionOnTheSplitHeads) {
  at::manual_seed(13);
  const Inputs in = Inputs::make({2, 2, 2, 16, 12});  // head size 12: not the kernel's
  ASSERT_FALSE(causal_self_attention_uses_cpu_kernel(in.qkv, 2));
  const at::Tensor out = causal_self_attention(in.qkv, 2);
  const at::Tensor expected =
      at::scaled_dot_product_attention(in.q, in.k, in.v, {}, 0.0, true).transpose(1, 2).reshape({2, 16, 24});
  EXPECT_TRUE(out.equal(expected));
}

TEST_P(CpuKernel, PackedHeadsWithoutGradModeGiveTheSameValues) {
  const Shape s = GetParam();
  if (s.kv_heads != s.heads) GTEST_SKIP() << "packed heads are GPT-2's: as many key/value heads as query heads";
  at::manual_seed(15);
  const Inputs in = Inputs::make(s);
  const at::Tensor with_grad = causal_self_attention(in.qkv, s.heads);
  c10::NoGradGuard no_grad;
  EXPECT_TRUE(causal_self_attention(in.qkv, s.heads).equal(with_grad.detach()));
}

TEST(CausalAttention, PackedHeadsOfTheWrongWidthAreOneError) {
  const at::Tensor qkv = at::zeros({1, 4, 3 * 16 + 1});
  try {
    causal_self_attention(qkv, 2);
    FAIL() << "a width that is not 3 · heads · head_dim was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 · heads · head_dim"), std::string::npos) << e.what();
  }
}

TEST(CausalAttention, MergingTheHeadsOfItsOutputCopiesNothing) {
  const Inputs in = Inputs::make({2, 4, 4, 16, 8});
  const at::Tensor out = causal_attention(in.q, in.k, in.v);
  if (!causal_attention_uses_cpu_kernel(in.q, in.k, in.v)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
}

// Under bf16 autocast the projections hand bfloat16 heads over: the kernel computes in float32 and
// answers in bfloat16, values and gradients.
TEST(CausalAttention, Bfloat16HeadsGiveBfloat16ValuesAndGradients) {
  at::manual_seed(10);
  const Inputs in = Inputs::make({2, 4, 2, 40, 32}, at::kBFloat16);
  if (!causal_attention_uses_cpu_kernel(in.q, in.k, in.v)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  const at::Tensor out = causal_attention(in.q, in.k, in.v);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_LT(max_difference(out, reference(in)), 2e-2);
  const at::Tensor upstream = at::randn(out.sizes());
  const at::Tensor grad = torch::autograd::grad({out}, {in.qkv}, {upstream.to(at::kBFloat16)})[0];
  EXPECT_EQ(grad.scalar_type(), at::kBFloat16);
  const at::Tensor expected = torch::autograd::grad({reference(in)}, {in.qkv}, {upstream.to(at::kDouble)})[0];
  EXPECT_LT(max_difference(grad, expected), 5e-2);
}

bool all_finite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

// A NaN or Inf reaches the rows that attend to it, as with LibTorch's kernel (the trainer's
// non-finite guard must see it), and no row before it: the kernel never multiplies a value right
// of a diagonal, even by zero.
TEST(CausalAttention, ANonFiniteValueReachesOnlyTheRowsThatSeeIt) {
  at::manual_seed(14);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor q = at::randn({1, 2, 24, 16}), k = at::randn({1, 2, 24, 16}), v = at::randn({1, 2, 24, 16});
  v[0][1][7][3] = inf;  // odd positions: the second row of a kernel tile
  k[0][1][9][0] = nan;
  q.requires_grad_();
  k.requires_grad_();
  v.requires_grad_();
  if (!causal_attention_uses_cpu_kernel(q, k, v)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  const at::Tensor out = causal_attention(q, k, v);
  EXPECT_TRUE(all_finite(out[0][0])) << "another head";
  EXPECT_TRUE(all_finite(out[0][1].narrow(0, 0, 7))) << "rows before the Inf in v";
  EXPECT_FALSE(all_finite(out[0][1][7])) << "the row that sees it";
  at::Tensor upstream = at::randn({1, 2, 24, 16});
  upstream[0][0][4][2] = nan;
  const auto grads = torch::autograd::grad({out}, {q, k, v}, {upstream});
  EXPECT_TRUE(all_finite(grads[0][0][1].narrow(0, 0, 7))) << "dQ before any non-finite key or value";
  EXPECT_TRUE(all_finite(grads[2][0][0].narrow(0, 5, 19))) << "dV after the NaN in dO: later rows never saw it";
  EXPECT_TRUE(all_finite(grads[1][0][0].narrow(0, 5, 19))) << "dK after the NaN in dO";
  EXPECT_FALSE(all_finite(grads[2][0][0][4]));
}

// The results are tensors of their own, not views: a model may change them in place.
TEST(CausalAttention, ItsResultsMayBeModifiedInPlace) {
  const Inputs in = Inputs::make({2, 2, 2, 16, 8});
  at::Tensor out = causal_attention(in.q, in.k, in.v);
  at::Tensor merged = causal_self_attention(in.qkv, 2);
  out.mul_(2.0);
  merged.add_(1.0);
  const auto grads = torch::autograd::grad({out.sum() + merged.sum()}, {in.qkv});
  EXPECT_TRUE(all_finite(grads[0]));
}

TEST(CausalAttention, ASecondDerivativeIsRefused) {
  const Inputs in = Inputs::make({1, 2, 2, 8, 8});
  if (!causal_attention_uses_cpu_kernel(in.q, in.k, in.v)) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  for (const at::Tensor& out : {causal_attention(in.q, in.k, in.v), causal_self_attention(in.qkv, 2)}) {
    try {
      torch::autograd::grad({out.sum()}, {in.qkv}, {}, /*retain_graph=*/true, /*create_graph=*/true);
      FAIL() << "create_graph went through the kernel's backward";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("create_graph"), std::string::npos) << e.what();
    }
  }
}

// Where the kernel does not apply, causal_attention is LibTorch's attention itself.
TEST(CausalAttention, OtherInputsGoToLibTorchsAttention) {
  at::manual_seed(11);
  const Inputs odd_head = Inputs::make({1, 2, 2, 16, 12});
  const Inputs long_seq = Inputs::make({1, 1, 1, kCpuAttentionMaxSeq + 1, 8});
  const Inputs fine = Inputs::make({1, 2, 2, 16, 8});
  EXPECT_FALSE(causal_attention_uses_cpu_kernel(odd_head.q, odd_head.k, odd_head.v)) << "head size not a whole vector";
  EXPECT_FALSE(causal_attention_uses_cpu_kernel(long_seq.q, long_seq.k, long_seq.v)) << "past kCpuAttentionMaxSeq";
  EXPECT_FALSE(causal_attention_uses_cpu_kernel(fine.q, fine.k, fine.v, 0.1)) << "dropout";
  EXPECT_FALSE(
      causal_attention_uses_cpu_kernel(fine.q.to(at::kDouble), fine.k.to(at::kDouble), fine.v.to(at::kDouble)));
  EXPECT_FALSE(causal_attention_uses_cpu_kernel(fine.q, fine.k.narrow(2, 0, 8), fine.v.narrow(2, 0, 8)))
      << "keys of another length";
  {
    // float32 heads under autocast: LibTorch's attention computes them in bf16, so it takes them.
    AutocastGuard autocast(c10::Device(c10::kCPU), at::kBFloat16);
    EXPECT_FALSE(causal_attention_uses_cpu_kernel(fine.q, fine.k, fine.v));
    EXPECT_FALSE(causal_self_attention_uses_cpu_kernel(fine.qkv, 2));
  }
  for (const Inputs* in : {&odd_head, &long_seq}) {
    const at::Tensor out = causal_attention(in->q, in->k, in->v);
    EXPECT_TRUE(out.equal(at::scaled_dot_product_attention(in->q, in->k, in->v, {}, 0.0, true)));
  }
}

}  // namespace attention_test
}  // namespace tessera
