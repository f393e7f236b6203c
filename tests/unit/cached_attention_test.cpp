// tessera::cached_attention (a KvCache pass' queries over its keys) against LibTorch's
// scaled_dot_product_attention in float64: one query and a few, grouped queries, masks of every
// broadcast form, keys at and around a vector's edge, a scale of its own; what an unseen key's slot
// holds; and where it hands over to LibTorch.
#include "tessera/kernels/attention.hpp"

#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <optional>
#include <string>

#include "tessera/run/precision.hpp"

namespace tessera {
namespace cached_attention_test {

struct Shape {
  std::int64_t batch, heads, kv_heads, queries, keys, dim;
  std::string name() const {
    return std::to_string(batch) + "x" + std::to_string(heads) + "_kv" + std::to_string(kv_heads) + "_q" +
           std::to_string(queries) + "_keys" + std::to_string(keys) + "_dim" + std::to_string(dim);
  }
};

// Keys and values as a KvCache hands them over: the first `keys` slots of a larger allocation.
struct Inputs {
  at::Tensor q, k, v;
  static Inputs make(const Shape& s) {
    Inputs in;
    in.q = at::randn({s.batch, s.heads, s.queries, s.dim});
    in.k = at::randn({s.batch, s.kv_heads, s.keys + 5, s.dim}).narrow(2, 0, s.keys);
    in.v = at::randn({s.batch, s.kv_heads, s.keys + 5, s.dim}).narrow(2, 0, s.keys);
    return in;
  }
};

at::Tensor reference(const Inputs& in, const at::Tensor& visible, std::optional<double> scale = std::nullopt) {
  const std::optional<at::Tensor> mask = visible.defined() ? std::optional<at::Tensor>(visible) : std::nullopt;
  return at::scaled_dot_product_attention(in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble), mask,
                                          0.0, false, scale, in.q.size(1) != in.k.size(1));
}

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Every query sees a random half of the keys or more, and always the first.
at::Tensor random_mask(std::int64_t batch, std::int64_t heads, std::int64_t queries, std::int64_t keys) {
  at::Tensor mask = at::rand({batch, heads, queries, keys}) > 0.4;
  mask.narrow(3, 0, 1).fill_(true);
  return mask;
}

class CachedCpuKernel : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const Inputs probe = Inputs::make({1, 1, 1, 1, 8, 8});
    if (!cached_attention_uses_cpu_kernel(probe.q, probe.k, probe.v, at::Tensor())) {
      GTEST_SKIP() << "this CPU has no AVX2 + FMA: cached_attention uses LibTorch's kernel, tested by its own suite";
    }
  }
};

// A decode step of one query (grouped and not), a few drafted queries, keys of one, of less than
// a vector, of a vector and one and of a long cache; head sizes of one to sixteen vectors.
INSTANTIATE_TEST_SUITE_P(Shapes, CachedCpuKernel,
                         ::testing::Values(Shape{32, 8, 4, 1, 74, 32}, Shape{2, 4, 4, 1, 1, 8},
                                           Shape{3, 6, 2, 1, 7, 16}, Shape{2, 4, 1, 3, 9, 64},
                                           Shape{1, 2, 2, 16, 33, 40}, Shape{2, 2, 1, 1, 1000, 128}),
                         [](const auto& info) { return info.param.name(); });

TEST_P(CachedCpuKernel, ValuesEqualScaledDotProductAttentionForEveryFormOfTheMask) {
  const Shape s = GetParam();
  at::manual_seed(3);
  const Inputs in = Inputs::make(s);
  // None; a KvCache's [batch, 1, queries, keys]; one per head; one for every row alike.
  for (const at::Tensor& visible : {at::Tensor(), random_mask(s.batch, 1, s.queries, s.keys),
                                    random_mask(s.batch, s.heads, s.queries, s.keys), random_mask(1, 1, 1, s.keys)}) {
    ASSERT_TRUE(cached_attention_uses_cpu_kernel(in.q, in.k, in.v, visible));
    const at::Tensor out = cached_attention(in.q, in.k, in.v, visible);
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    EXPECT_EQ(out.sizes(), in.q.sizes());
    EXPECT_LT(max_difference(out, reference(in, visible)), 1e-5)
        << (visible.defined() ? visible.sizes() : at::IntArrayRef{});
  }
  EXPECT_LT(max_difference(cached_attention(in.q, in.k, in.v, at::Tensor(), 0.3), reference(in, at::Tensor(), 0.3)),
            1e-5)
      << "a scale of its own";
}

TEST(CachedAttention, MergingTheHeadsOfItsOutputCopiesNothing) {
  const Inputs in = Inputs::make({2, 8, 4, 1, 20, 32});
  if (!cached_attention_uses_cpu_kernel(in.q, in.k, in.v, at::Tensor())) GTEST_SKIP() << "no AVX2 + FMA";
  const at::Tensor out = cached_attention(in.q, in.k, in.v, at::Tensor());
  EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
}

TEST(CachedAttention, ARowThatSeesNoKeyGetsZerosAndAnUnseenSlotIsNeverRead) {
  at::manual_seed(5);
  Inputs in = Inputs::make({2, 4, 2, 1, 12, 16});
  if (!cached_attention_uses_cpu_kernel(in.q, in.k, in.v, at::Tensor())) GTEST_SKIP() << "no AVX2 + FMA";
  at::Tensor visible = at::full({2, 1, 1, 12}, true, at::kBool);
  visible[0].fill_(false);           // batch row 0 sees nothing
  visible[1][0][0][11].fill_(false);  // batch row 1 does not see its last slot...
  in.k[1].select(1, 11).fill_(std::numeric_limits<float>::quiet_NaN());  // ...which holds garbage
  in.v[1].select(1, 11).fill_(std::numeric_limits<float>::quiet_NaN());
  const at::Tensor out = cached_attention(in.q, in.k, in.v, visible);
  EXPECT_TRUE(out[0].eq(0).all().item<bool>());
  EXPECT_FALSE(at::isnan(out[1]).any().item<bool>());
  Inputs seen_part = in;
  seen_part.k = in.k.narrow(2, 0, 11);
  seen_part.v = in.v.narrow(2, 0, 11);
  seen_part.q = in.q.narrow(0, 1, 1);
  seen_part.k = seen_part.k.narrow(0, 1, 1);
  seen_part.v = seen_part.v.narrow(0, 1, 1);
  EXPECT_LT(max_difference(out[1].unsqueeze(0), reference(seen_part, at::Tensor())), 1e-5);
}

TEST(CachedAttention, ANaNInASeenKeyReachesItsRowOnly) {
  Inputs in = Inputs::make({2, 2, 2, 1, 9, 8});
  if (!cached_attention_uses_cpu_kernel(in.q, in.k, in.v, at::Tensor())) GTEST_SKIP() << "no AVX2 + FMA";
  in.k[0][1][4].fill_(std::numeric_limits<float>::quiet_NaN());
  const at::Tensor nan = at::isnan(cached_attention(in.q, in.k, in.v, at::Tensor()));
  EXPECT_TRUE(nan[0][1].all().item<bool>());
  EXPECT_FALSE(nan[0][0].any().item<bool>());
  EXPECT_FALSE(nan[1].any().item<bool>());
}

// Where the kernel does not apply, cached_attention is LibTorch's attention itself.
TEST(CachedAttention, OtherInputsGoToLibTorchsAttention) {
  at::manual_seed(7);
  const Inputs fine = Inputs::make({2, 4, 2, 1, 10, 8});
  const Inputs odd_head = Inputs::make({2, 4, 2, 1, 10, 12});
  const Inputs prefill = Inputs::make({2, 4, 2, kCpuCachedAttentionMaxQueries + 1, 20, 8});
  const at::Tensor none;
  EXPECT_FALSE(cached_attention_uses_cpu_kernel(odd_head.q, odd_head.k, odd_head.v, none)) << "head size";
  EXPECT_FALSE(cached_attention_uses_cpu_kernel(prefill.q, prefill.k, prefill.v, none)) << "a prompt's prefill";
  EXPECT_FALSE(cached_attention_uses_cpu_kernel(fine.q.to(at::kBFloat16), fine.k.to(at::kBFloat16),
                                                fine.v.to(at::kBFloat16), none));
  EXPECT_FALSE(cached_attention_uses_cpu_kernel(fine.q, fine.k, fine.v, at::zeros({2, 1, 1, 10})))
      << "an additive (float) mask";
  {
    AutocastGuard autocast(c10::Device(c10::kCPU), at::kBFloat16);
    EXPECT_FALSE(cached_attention_uses_cpu_kernel(fine.q, fine.k, fine.v, none)) << "autocast narrows LibTorch's";
  }
  const at::Tensor q = fine.q.clone().requires_grad_();
  EXPECT_FALSE(cached_attention_uses_cpu_kernel(q, fine.k, fine.v, none)) << "a query that needs a gradient";
  const at::Tensor out = cached_attention(q, fine.k, fine.v, none);
  EXPECT_TRUE(out.requires_grad());
  const at::Tensor grad = torch::autograd::grad({out.sum()}, {q})[0];
  const at::Tensor q2 = fine.q.clone().requires_grad_();
  const at::Tensor expected = torch::autograd::grad(
      {at::scaled_dot_product_attention(q2, fine.k, fine.v, std::nullopt, 0.0, false, std::nullopt, true).sum()},
      {q2})[0];
  EXPECT_TRUE(grad.equal(expected));
  for (const Inputs* in : {&odd_head, &prefill}) {
    EXPECT_TRUE(cached_attention(in->q, in->k, in->v, none)
                    .equal(at::scaled_dot_product_attention(in->q, in->k, in->v, std::nullopt, 0.0, false, std::nullopt,
                                                            true)));
  }
}

}  // namespace cached_attention_test
}  // namespace tessera
