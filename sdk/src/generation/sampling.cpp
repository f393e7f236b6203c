// Sampling processors and the draw (tessera/generation/sampling.hpp).
#include "tessera/generation/sampling.hpp"

#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>

#include <limits>
#include <string>

#include "tessera/error.hpp"

namespace tessera {

void check_sampling(const SamplingParams& p) {
  if (p.temperature < 0) throw Error("sampling: temperature must be at least 0 (0: greedy)");
  if (p.top_k < 0) throw Error("sampling: top_k must be at least 0 (0: every token)");
  if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("sampling: top_p must lie in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) throw Error("sampling: min_p must lie in [0, 1]");
}

at::Tensor processed_logits(const at::Tensor& logits, const SamplingParams& p) {
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor scores = p.greedy() ? logits.clone() : logits / p.temperature;
  const std::int64_t vocab = scores.size(-1);
  if (p.top_k > 0 && p.top_k < vocab) {
    // Below the k-th largest score (ties with it kept, as transformers keeps them).
    const at::Tensor kth = std::get<0>(at::topk(scores, p.top_k, -1)).narrow(-1, p.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, -inf);
  }
  if (p.top_p < 1) {
    // The least likely tokens whose probabilities sum to at most 1 - top_p go; the most likely stays.
    const auto [sorted, order] = at::sort(scores, -1, /*descending=*/false);
    const at::Tensor cumulative = at::cumsum(at::softmax(sorted, -1), -1);
    at::Tensor drop = cumulative <= (1 - p.top_p);
    drop.narrow(-1, vocab - 1, 1).fill_(false);
    scores = scores.masked_fill(drop.scatter(-1, order, drop), -inf);  // back in vocabulary order
  }
  if (p.min_p > 0) {
    const at::Tensor probabilities = at::softmax(scores, -1);
    const at::Tensor top = std::get<0>(probabilities.max(-1, /*keepdim=*/true));
    scores = scores.masked_fill(probabilities < top * p.min_p, -inf);
  }
  return scores;
}

std::int64_t draw_token(const at::Tensor& logits, const SamplingParams& p, at::Generator& generator) {
  if (p.greedy()) return at::argmax(logits, -1).item<std::int64_t>();
  const at::Tensor probabilities = at::softmax(processed_logits(logits, p), -1);
  return at::multinomial(probabilities, 1, /*replacement=*/false, generator).item<std::int64_t>();
}

}  // namespace tessera
