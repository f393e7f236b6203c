// loss/cross_entropy built through the real loader and factory, checked against a hand
// computation with log_softmax: the summed loss, the target count, label smoothing and gradients.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tessera/run/batch.hpp"
#include "tessera/components/loss.hpp"
#include "autograd_graph.hpp"
#include "test_support.hpp"

namespace tessera {
namespace cross_entropy_test {

constexpr std::int64_t I = kIgnoreIndex;

std::shared_ptr<Loss> make_loss(const std::string& config = "{}") {
  auto b = testing::build_components("loss: {component_key: loss, variant_key: cross_entropy, config: " + config + "}\n");
  return testing::built<Loss>(b, "loss");
}

at::Tensor small_logits() {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  return at::randn({2, 3, 5}, gen, at::kFloat) * 2;
}

const at::Tensor& labels() {
  static const at::Tensor l = at::tensor(std::vector<std::int64_t>{1, I, 4, 0, 2, I}, at::kLong).view({2, 3});
  return l;
}

// Sum over labelled positions of (1 - eps) * -log p[label] + eps / V * sum_j -log p[j].
double hand_loss(const at::Tensor& logits, const at::Tensor& labels, double eps) {
  const at::Tensor logp = at::log_softmax(logits.to(at::kDouble), -1);
  const std::int64_t vocab = logits.size(-1);
  double sum = 0;
  for (std::int64_t b = 0; b < labels.size(0); ++b) {
    for (std::int64_t t = 0; t < labels.size(1); ++t) {
      const std::int64_t y = labels[b][t].item<std::int64_t>();
      if (y == I) continue;
      const double nll = -logp[b][t][y].item<double>();
      const double uniform = -logp[b][t].sum().item<double>() / static_cast<double>(vocab);
      sum += (1 - eps) * nll + eps * uniform;
    }
  }
  return sum;
}

TEST(CrossEntropyLoss, IsTheSummedNllOverLabelledTokens) {
  auto loss = make_loss();
  const at::Tensor logits = small_logits();
  LossSum l = loss->compute(logits, labels());
  EXPECT_EQ(l.sum.dim(), 0);
  EXPECT_EQ(l.sum.scalar_type(), at::kFloat);
  EXPECT_EQ(l.count.dim(), 0);
  EXPECT_EQ(l.count.scalar_type(), at::kLong);
  EXPECT_EQ(l.count.item<std::int64_t>(), 4);
  const double expected = hand_loss(logits, labels(), 0.0);
  EXPECT_NEAR(l.sum.item<double>(), expected, 1e-5 * expected);
  // A sum, not a mean: about four times the per-token loss.
  EXPECT_GT(l.sum.item<double>(), 1.0);
}

TEST(CrossEntropyLoss, LabelSmoothingFollowsTheFormula) {
  const at::Tensor logits = small_logits();
  const double plain = make_loss()->compute(logits, labels()).sum.item<double>();
  LossSum smoothed = make_loss("{label_smoothing: 0.2}")->compute(logits, labels());
  const double expected = hand_loss(logits, labels(), 0.2);
  EXPECT_NEAR(smoothed.sum.item<double>(), expected, 1e-5 * expected);
  EXPECT_GT(std::abs(smoothed.sum.item<double>() - plain), 1e-3);
  EXPECT_EQ(smoothed.count.item<std::int64_t>(), 4);
}

TEST(CrossEntropyLoss, AllIgnoredGivesZero) {
  LossSum l = make_loss("{label_smoothing: 0.1}")->compute(small_logits(), at::full({2, 3}, I, at::kLong));
  EXPECT_EQ(l.sum.item<double>(), 0.0);
  EXPECT_EQ(l.count.item<std::int64_t>(), 0);
}

TEST(CrossEntropyLoss, ComputesInFloat32FromBf16Logits) {
  const at::Tensor logits = small_logits().to(at::kBFloat16);
  LossSum l = make_loss()->compute(logits, labels());
  EXPECT_EQ(l.sum.scalar_type(), at::kFloat);
  const double expected = hand_loss(logits.to(at::kFloat), labels(), 0.0);
  EXPECT_NEAR(l.sum.item<double>(), expected, 1e-5 * expected);
}

TEST(CrossEntropyLoss, GradientIsSoftmaxMinusOneHotOnLabelledTokensOnly) {
  at::Tensor logits = small_logits().requires_grad_(true);
  make_loss()->compute(logits, labels()).sum.backward();
  const at::Tensor expected =
      (at::softmax(logits.detach(), -1) - at::one_hot(labels().clamp_min(0), 5).to(at::kFloat)) *
      labels().ne(I).unsqueeze(-1).to(at::kFloat);
  EXPECT_TRUE(at::allclose(logits.grad(), expected, 1e-5, 1e-6));
  EXPECT_EQ(logits.grad()[0][1].abs().sum().item<double>(), 0.0);  // an ignored position
}

}  // namespace cross_entropy_test
}  // namespace tessera

namespace tessera {
namespace cross_entropy_test {

struct HeadCase {
  at::Tensor hidden, weight, bias, labels;
};

HeadCase head_case(bool with_bias) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  HeadCase c;
  c.hidden = at::randn({2, 7, 6}, gen, at::kFloat).requires_grad_(true);
  c.weight = (at::randn({11, 6}, gen, at::kFloat) * 0.5).requires_grad_(true);
  if (with_bias) c.bias = at::randn({11}, gen, at::kFloat).requires_grad_(true);
  c.labels = at::randint(0, 11, {2, 7}, gen, at::kLong);
  c.labels.index_put_({0, 2}, kIgnoreIndex);
  c.labels.index_put_({1, 6}, kIgnoreIndex);
  return c;
}

// The loss and its gradients (hidden, weight, bias) of one backward through `loss`.
std::vector<at::Tensor> loss_and_grads(Loss& loss, const HeadCase& c, bool from_hidden) {
  for (const at::Tensor& t : {c.hidden, c.weight, c.bias}) {
    if (t.defined()) t.mutable_grad() = at::Tensor();
  }
  const OutputHead head{c.weight, c.bias};
  const LossSum sum = from_hidden ? loss.compute_from_hidden(c.hidden, head, c.labels)
                                  : loss.compute(at::linear(c.hidden, c.weight, c.bias), c.labels);
  EXPECT_EQ(sum.count.item<std::int64_t>(), 12);
  // The chunked path is its own autograd function, never the whole logits' linear + cross-entropy.
  EXPECT_EQ(testing::count_graph_nodes(sum.sum, "ChunkedLinearCrossEntropy"), from_hidden ? 1 : 0);
  (sum.sum * 0.37).backward();
  std::vector<at::Tensor> out{sum.sum.detach(), c.hidden.grad(), c.weight.grad()};
  if (c.bias.defined()) out.push_back(c.bias.grad());
  return out;
}

// Logits made a chunk of tokens at a time (chunks that divide the tokens, that do not, and one
// larger than all of them) give the unchunked loss and gradients within float rounding, with
// label smoothing and ignored labels, with and without a bias.
TEST(CrossEntropyLoss, ChunkedLogitsEqualTheWholeLogits) {
  for (const bool with_bias : {false, true}) {
    for (const std::string smoothing : {"0.0", "0.1"}) {
      auto whole = make_loss("{label_smoothing: " + smoothing + "}");
      EXPECT_FALSE(whole->takes_hidden_states());
      const HeadCase c = head_case(with_bias);
      const auto expected = loss_and_grads(*whole, c, false);
      for (const std::string chunk : {"1", "4", "7", "100"}) {
        SCOPED_TRACE("chunk " + chunk + ", smoothing " + smoothing + (with_bias ? ", bias" : ""));
        auto chunked = make_loss("{label_smoothing: " + smoothing + ", chunk_size: " + chunk + "}");
        EXPECT_TRUE(chunked->takes_hidden_states());
        const auto got = loss_and_grads(*chunked, c, true);
        ASSERT_EQ(got.size(), expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(got[i].allclose(expected[i], 1e-5, 1e-6))
              << "output " << i << " differs by " << (got[i] - expected[i]).abs().max().item<double>();
        }
      }
    }
  }
}

// Without grad mode (an evaluation) the chunked loss is the plain loss and records no graph.
TEST(CrossEntropyLoss, ChunkedLossWithoutGradMode) {
  auto chunked = make_loss("{chunk_size: 3}");
  const HeadCase c = head_case(false);
  c10::NoGradGuard no_grad;
  const LossSum got = chunked->compute_from_hidden(c.hidden, OutputHead{c.weight, {}}, c.labels);
  EXPECT_FALSE(got.sum.requires_grad());
  const LossSum whole = make_loss()->compute(at::linear(c.hidden, c.weight), c.labels);
  EXPECT_NEAR(got.sum.item<double>(), whole.sum.item<double>(), 1e-5 * whole.sum.item<double>());
}

// A loss without chunk_size may still be handed hidden states (the SDK's contract for every
// loss): it projects all tokens at once. It used to loop forever on a zero chunk size.
TEST(CrossEntropyLoss, WithoutChunkSizeHiddenStatesGiveTheWholeLogitsLoss) {
  auto whole = make_loss();
  const HeadCase c = head_case(true);
  const LossSum from_hidden = whole->compute_from_hidden(c.hidden, OutputHead{c.weight, c.bias}, c.labels);
  const LossSum from_logits = whole->compute(at::linear(c.hidden, c.weight, c.bias), c.labels);
  EXPECT_TRUE(from_hidden.sum.allclose(from_logits.sum, 1e-6, 1e-6));
  EXPECT_EQ(from_hidden.count.item<std::int64_t>(), from_logits.count.item<std::int64_t>());
}

// A softcapped head (Gemma 2's final_logit_softcapping): the chunked loss and its gradients are
// those of cross-entropy over cap · tanh(logits / cap), through autograd; the cap matters here.
TEST(CrossEntropyLoss, ChunkedLogitsOfASoftcappedHeadEqualTheCappedWholeLogits) {
  const HeadCase c = head_case(true);
  const double cap = 1.5;
  auto grads = [&](const std::function<LossSum()>& loss) {
    for (const at::Tensor& t : {c.hidden, c.weight, c.bias}) t.mutable_grad() = at::Tensor();
    const LossSum sum = loss();
    sum.sum.backward();
    return std::vector<at::Tensor>{sum.sum.detach(), c.hidden.grad(), c.weight.grad(), c.bias.grad()};
  };
  OutputHead head{c.weight, c.bias};
  head.logit_softcap = cap;
  auto whole = make_loss();
  const auto expected = grads([&] { return whole->compute(at::tanh(at::linear(c.hidden, c.weight, c.bias) / cap) * cap, c.labels); });
  const auto uncapped = grads([&] { return whole->compute(at::linear(c.hidden, c.weight, c.bias), c.labels); });
  EXPECT_GT((uncapped[0] - expected[0]).abs().item<double>(), 1e-2) << "the cap matters";
  auto chunked = make_loss("{chunk_size: 4}");
  for (Loss* loss : {whole.get(), chunked.get()}) {
    const auto got = grads([&] { return loss->compute_from_hidden(c.hidden, head, c.labels); });
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].allclose(expected[i], 1e-5, 1e-6))
          << "output " << i << " differs by " << (got[i] - expected[i]).abs().max().item<double>();
    }
  }
}

}  // namespace cross_entropy_test
}  // namespace tessera
