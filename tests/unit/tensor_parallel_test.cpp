// Tensor parallelism's pieces on real Gloo ranks: the autograd collectives (forward and backward
// of each against what one process computes, and the uneven all-gather), whole tensors cut into
// parts and joined again, and the vocab-parallel cross-entropy against LibTorch's on the whole
// logits.
#include "tessera/parallel/tensor_parallel.hpp"

#include <gtest/gtest.h>

#include <ATen/core/Reduction.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include "gloo_ranks.hpp"
#include "tessera/run/batch.hpp"
#include "tessera/error.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/parallel/vocab_parallel.hpp"

namespace tessera {
namespace tensor_parallel_test {

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  if (a.sizes() != b.sizes() || !at::allclose(a, b, 1e-5, 1e-6)) {
    throw Error(what + ": got " + c10::str(a) + " expected " + c10::str(b));
  }
}

TEST(TensorParallel, PartsJoinBackIntoTheWholeInBlocks) {
  const at::Tensor whole = at::arange(24, at::kFloat).view({6, 4});
  const TensorShard qkv = TensorShard::columns(3);  // three blocks of 2 rows, each split in 2
  std::vector<at::Tensor> parts(2);
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
    const TensorParallel tp(group, false);
    parts[static_cast<std::size_t>(rank)] = tp.part_of(whole, qkv);
    if (tp.whole_shape(parts[static_cast<std::size_t>(rank)].sizes(), qkv) != std::vector<std::int64_t>{6, 4}) {
      throw Error("whole_shape is wrong");
    }
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  // Rank 0 holds rows 0, 2, 4 (the first half of each block of two).
  EXPECT_TRUE(parts[0].equal(at::cat({whole.narrow(0, 0, 1), whole.narrow(0, 2, 1), whole.narrow(0, 4, 1)})));
  EXPECT_TRUE(TensorParallel::join(parts, qkv).equal(whole));
  EXPECT_EQ(TensorParallel::join(parts, TensorShard::rows()).sizes(), at::IntArrayRef({3, 8}));
  EXPECT_TRUE(TensorParallel().part_of(whole, qkv).is_same(whole)) << "one rank keeps the whole";
}

// A vocabulary of 9 rows over 2 ranks (and of 5 over 4, rows a multiple of 2): each part padded
// to the same rows with zeros, the whole and its shape the true rows, one rank padded too when a
// multiple asks it.
TEST(TensorParallel, APaddedSplitPadsItsPartsAndNeverItsWhole) {
  const at::Tensor whole = at::arange(1, 19, at::kFloat).view({9, 2});
  const TensorShard vocab = TensorShard::vocabulary(9);
  std::vector<at::Tensor> parts;
  for (std::int64_t r = 0; r < 2; ++r) parts.push_back(part_of(whole, vocab, {r, 2}));
  EXPECT_TRUE(parts[0].equal(whole.narrow(0, 0, 5)));
  EXPECT_TRUE(parts[1].narrow(0, 0, 4).equal(whole.narrow(0, 5, 4)));
  EXPECT_TRUE(parts[1][4].equal(at::zeros({2}))) << "the padding row is zero";
  EXPECT_EQ(whole_shape(parts[1].sizes(), vocab, {1, 2}), (std::vector<std::int64_t>{9, 2}));
  EXPECT_TRUE(TensorParallel::join(parts, vocab).equal(whole));

  const TensorShard by_two = TensorShard::vocabulary(5, 2);  // 4 ranks of 2 rows: the last all padding
  EXPECT_EQ(by_two.padded_part(4), 2);
  std::vector<at::Tensor> fours;
  for (std::int64_t r = 0; r < 4; ++r) fours.push_back(part_of(whole.narrow(0, 0, 5), by_two, {r, 4}));
  EXPECT_TRUE(fours[3].equal(at::zeros({2, 2})));
  EXPECT_TRUE(TensorParallel::join(fours, by_two).equal(whole.narrow(0, 0, 5)));
  // One rank: padded to the multiple (kernel-friendly rows), the whole cut back.
  const at::Tensor one = part_of(whole, TensorShard::vocabulary(9, 8), {0, 1});
  EXPECT_EQ(one.size(0), 16);
  EXPECT_TRUE(TensorParallel::join({one}, TensorShard::vocabulary(9, 8)).equal(whole));
  EXPECT_EQ(TensorParallel().vocab_rows(50257, 64), 50304) << "GPT-2's vocabulary as nanoGPT pads it";
  EXPECT_TRUE(part_of(whole, vocab, {0, 1}).is_same(whole)) << "one rank with nothing to pad keeps the whole";
  EXPECT_THROW(part_of(whole.narrow(0, 0, 8), vocab, {0, 2}), Error) << "not the whole of the split";
}

// Each collective's forward and backward on 2 ranks, against the one-process computation: y =
// f(x) for x different per rank, then the gradient of sum(w * y) with w different per rank.
TEST(Collectives, ForwardAndBackwardMatchTheOneProcessComputation) {
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
    auto input_of = [](std::int64_t r) { return at::arange(8, at::kFloat).view({2, 4}) + 100.0 * r; };
    auto weight_of = [](std::int64_t r) { return at::arange(8, at::kFloat).view({2, 4}) * (r + 2.0); };
    const at::Tensor x0 = input_of(0), x1 = input_of(1);
    auto run = [&](const std::function<at::Tensor(const at::Tensor&)>& f, const at::Tensor& out_weight) {
      at::Tensor x = input_of(rank).requires_grad_(true);
      at::Tensor y = f(x);
      torch::autograd::backward({(y * out_weight).sum()});
      return std::make_pair(y.detach(), x.grad());
    };
    const at::Tensor ones = at::ones({2, 4});
    {  // copy_to: identity; gradient summed over ranks.
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::copy_to(x, group); }, weight_of(rank));
      expect_close(y, input_of(rank), "copy_to forward");
      expect_close(g, weight_of(0) + weight_of(1), "copy_to backward");
    }
    {  // reduce_from: the sum; gradient passed through.
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::reduce_from(x, group); }, weight_of(rank));
      expect_close(y, x0 + x1, "reduce_from forward");
      expect_close(g, weight_of(rank), "reduce_from backward");
    }
    {  // gather_from along dim 1: [2, 8] whole; gradient: this rank's columns.
      const at::Tensor w = at::arange(16, at::kFloat).view({2, 8});
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::gather_from(x, 1, group); }, w);
      expect_close(y, at::cat({x0, x1}, 1), "gather_from forward");
      expect_close(g, w.narrow(1, 4 * rank, 4), "gather_from backward");
    }
    {  // split_to along dim 1: this rank's 2 columns; gradient gathered from both ranks.
      const at::Tensor w = at::full({2, 2}, rank + 1.0);
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::split_to(x, 1, group); }, w);
      expect_close(y, input_of(rank).narrow(1, 2 * rank, 2), "split_to forward");
      expect_close(g, at::cat({at::full({2, 2}, 1.0), at::full({2, 2}, 2.0)}, 1), "split_to backward");
    }
    {  // reduce_scatter_to along dim 1: this rank's columns of the sum; gradient gathered.
      const at::Tensor w = at::full({2, 2}, rank + 1.0);
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::reduce_scatter_to(x, 1, group); }, w);
      expect_close(y, (x0 + x1).narrow(1, 2 * rank, 2), "reduce_scatter_to forward");
      expect_close(g, at::cat({at::full({2, 2}, 1.0), at::full({2, 2}, 2.0)}, 1), "reduce_scatter_to backward");
    }
    {  // all_gather_from along dim 1: whole; gradient: this rank's columns of the summed gradient.
      auto [y, g] = run([&](const at::Tensor& x) { return collectives::all_gather_from(x, 1, group); },
                        at::arange(16, at::kFloat).view({2, 8}) * (rank + 1.0));
      expect_close(y, at::cat({x0, x1}, 1), "all_gather_from forward");
      const at::Tensor summed = at::arange(16, at::kFloat).view({2, 8}) * 3.0;
      expect_close(g, summed.narrow(1, 4 * rank, 4), "all_gather_from backward");
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// all_gather_uneven: every rank's 1-D tensor of its own length (one of them empty), in rank order.
TEST(Collectives, UnevenTensorsGatherInRankOrderWithTheirOwnLengths) {
  const auto errors = testing::run_on_gloo_ranks(3, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
    auto of = [](std::int64_t r) { return at::arange(r == 1 ? 0 : 3 + 2 * r, at::kDouble) + 10.0 * r; };
    const std::vector<at::Tensor> all = collectives::all_gather_uneven(of(rank), *group, c10::Device(c10::kCPU));
    if (all.size() != 3) throw Error("three ranks' tensors, got " + std::to_string(all.size()));
    for (std::int64_t r = 0; r < 3; ++r) {
      if (!at::equal(all[static_cast<std::size_t>(r)], of(r))) throw Error("rank " + std::to_string(r) + "'s tensor");
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// Split over 2 ranks along the vocabulary, the loss and its gradient equal LibTorch's on the
// whole logits, with label smoothing and ignored labels.
TEST(VocabParallelCrossEntropy, EqualsTheWholeLogitsLoss) {
  const at::Tensor logits = at::randn({6, 10}, at::kFloat) * 3;
  at::Tensor labels = at::tensor(std::vector<std::int64_t>{3, 7, kIgnoreIndex, 0, 9, 5}, at::kLong);
  for (const double smoothing : {0.0, 0.1}) {
    at::Tensor leaf = logits.clone().requires_grad_(true);
    const at::Tensor expected = at::cross_entropy_loss(leaf, labels, {}, at::Reduction::Sum, kIgnoreIndex, smoothing);
    const at::Tensor expected_grad = torch::autograd::grad({expected}, {leaf})[0];
    const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
      const VocabParallelCrossEntropy ce = vocab_parallel_cross_entropy(
          logits.narrow(1, 5 * rank, 5), labels, 5 * rank, 10, *group, smoothing, kIgnoreIndex, true);
      expect_close(ce.sum, expected.detach(), "loss");
      expect_close(ce.grad_logits, expected_grad.narrow(1, 5 * rank, 5), "gradient");
    });
    for (const auto& e : errors) EXPECT_EQ(e, "") << "label smoothing " << smoothing;
  }
}

// A padded vocabulary: 7 columns over 2 ranks of 4 (the last column padding, its logit huge so it
// would dominate were it counted) and 5 over 4 ranks of 2 (the last rank all padding): the loss
// and gradient of the true columns are LibTorch's, the padding's gradient zero.
TEST(VocabParallelCrossEntropy, PaddedColumnsTakeNoProbability) {
  const at::Tensor logits = at::randn({5, 7}, at::kFloat) * 3;
  const at::Tensor labels = at::tensor(std::vector<std::int64_t>{6, 0, kIgnoreIndex, 3, 4}, at::kLong);
  struct Case {
    std::int64_t vocab, ranks, per_rank;
  };
  for (const Case c : {Case{7, 2, 4}, Case{5, 4, 2}}) {
    const at::Tensor real = logits.narrow(1, 0, c.vocab);
    at::Tensor y = labels.clamp_max(c.vocab - 1).masked_fill(labels.eq(kIgnoreIndex), kIgnoreIndex);
    // The whole padded logits: the true columns, then 1e4 in every padding column.
    const at::Tensor padded = at::cat({real, at::full({5, c.ranks * c.per_rank - c.vocab}, 1e4)}, 1);
    for (const double smoothing : {0.0, 0.1}) {
      at::Tensor leaf = real.clone().requires_grad_(true);
      const at::Tensor expected = at::cross_entropy_loss(leaf, y, {}, at::Reduction::Sum, kIgnoreIndex, smoothing);
      const at::Tensor expected_grad = torch::autograd::grad({expected}, {leaf})[0];
      const at::Tensor whole_grad = at::cat({expected_grad, at::zeros({5, c.ranks * c.per_rank - c.vocab})}, 1);
      const auto errors = testing::run_on_gloo_ranks(c.ranks, [&](std::int64_t rank, std::shared_ptr<Communicator> group) {
        const std::int64_t start = rank * c.per_rank;
        const VocabParallelCrossEntropy ce = vocab_parallel_cross_entropy(padded.narrow(1, start, c.per_rank), y, start,
                                                                          c.vocab, *group, smoothing, kIgnoreIndex, true);
        expect_close(ce.sum, expected.detach(), "loss");
        expect_close(ce.grad_logits, whole_grad.narrow(1, start, c.per_rank), "gradient");
      });
      for (const auto& e : errors) EXPECT_EQ(e, "") << "vocab " << c.vocab << ", smoothing " << smoothing;
    }
  }
}

}  // namespace tensor_parallel_test
}  // namespace tessera
