// Context-parallel attention on real Gloo ranks against one process's attention over the whole
// sequence: each rank's slice of the output and of the gradients of q, k and v, for ring and
// Ulysses, 2 and 3 ranks, grouped-query heads, with and without packed documents.
#include "tessera/parallel/context_parallel.hpp"

#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <mutex>

#include "gloo_ranks.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace context_parallel_test {

struct Case {
  std::int64_t ranks;
  ContextParallel::Attention kind;
  std::int64_t heads, kv_heads;
  bool documents;
};

// Causal attention over the whole sequence, within documents when given.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents) {
  const std::int64_t length = q.size(2);
  at::Tensor mask = at::ones({length, length}, at::kBool).tril();
  if (documents.defined()) mask = mask.logical_and(documents.unsqueeze(2).eq(documents.unsqueeze(1))).unsqueeze(1);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, std::nullopt, k.size(1) != q.size(1));
}

void check(const Case& c) {
  const std::int64_t batch = 2, length = 12 * c.ranks, dim = 8;
  const at::Tensor q = at::randn({batch, c.heads, length, dim}), k = at::randn({batch, c.kv_heads, length, dim}),
                   v = at::randn({batch, c.kv_heads, length, dim}), grad = at::randn({batch, c.heads, length, dim});
  // Documents of uneven lengths, crossing the chunks.
  std::vector<std::int64_t> ids;
  for (std::int64_t t = 0; t < length; ++t) ids.push_back(t < 5 ? 0 : t < length / 2 + 3 ? 1 : 2);
  const at::Tensor documents = c.documents ? at::tensor(ids, at::kLong).unsqueeze(0).expand({batch, length}).contiguous()
                                           : at::Tensor();
  at::Tensor rq = q.clone().requires_grad_(true), rk = k.clone().requires_grad_(true), rv = v.clone().requires_grad_(true);
  const at::Tensor expected = reference(rq, rk, rv, documents);
  torch::autograd::backward({expected}, {grad});
  const auto errors = testing::run_on_gloo_ranks(c.ranks, [&](std::int64_t, std::shared_ptr<Communicator> group) {
    const ContextParallel cp(group, c.kind);
    at::Tensor mq = cp.slice(q, 2).requires_grad_(true), mk = cp.slice(k, 2).requires_grad_(true),
               mv = cp.slice(v, 2).requires_grad_(true);
    const at::Tensor out = cp.attend(mq, mk, mv, documents);
    torch::autograd::backward({out}, {cp.slice(grad, 2)});
    auto near = [](const at::Tensor& a, const at::Tensor& b, const char* what) {
      if (!at::allclose(a, b, 1e-4, 1e-5)) {
        throw Error(std::string(what) + " differs by " + std::to_string((a - b).abs().max().item<double>()));
      }
    };
    near(out, cp.slice(expected.detach(), 2), "output");
    near(mq.grad(), cp.slice(rq.grad(), 2), "d q");
    near(mk.grad(), cp.slice(rk.grad(), 2), "d k");
    near(mv.grad(), cp.slice(rv.grad(), 2), "d v");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ContextParallel, SlicesAreBalancedChunksAndGatherBackInOrder) {
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
    const ContextParallel cp(group, ContextParallel::Attention::ring);
    const at::Tensor positions = cp.positions(8, c10::Device(c10::kCPU));
    const at::Tensor expected = rank == 0 ? at::tensor({0, 1, 6, 7}, at::kLong) : at::tensor({2, 3, 4, 5}, at::kLong);
    if (!positions.equal(expected)) throw Error("rank " + std::to_string(rank) + " holds " + c10::str(positions));
    const at::Tensor whole = at::arange(16, at::kFloat).view({2, 8});
    if (!cp.gather(cp.slice(whole)).equal(whole)) throw Error("gather(slice) is not the whole");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(ContextParallel, RingAttentionEqualsTheWholeSequences) {
  for (const std::int64_t ranks : {2, 3}) {
    for (const bool documents : {false, true}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, documents " + std::to_string(documents));
      check({ranks, ContextParallel::Attention::ring, 6, 2, documents});
    }
  }
}

TEST(ContextParallel, UlyssesAttentionEqualsTheWholeSequences) {
  for (const bool documents : {false, true}) {
    SCOPED_TRACE("documents " + std::to_string(documents));
    check({2, ContextParallel::Attention::ulysses, 4, 2, documents});  // key/value heads split too
    check({3, ContextParallel::Attention::ulysses, 6, 2, documents});  // key/value heads replicated
  }
}

}  // namespace context_parallel_test
}  // namespace tessera
