// Sampling processors and the draw (tessera/generation/sampling.hpp).
#include "tessera/generation/sampling.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>

#include <limits>
#include <mutex>
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

namespace {

// A uniform number in [0, 1) from a CPU generator: its next 53 random bits.
double uniform(at::Generator& generator) {
  auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return static_cast<double>(cpu->random64() >> 11) * 0x1.0p-53;
}

// The token where `u` falls in the cumulative distribution `p` [vocab] (sums to about 1).
std::int64_t inverse_cdf(const float* p, std::int64_t vocab, double u) {
  double total = 0;
  for (std::int64_t i = 0; i < vocab; ++i) total += p[i];
  const double target = u * total;
  double cumulative = 0;
  std::int64_t last = 0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (p[i] <= 0) continue;
    cumulative += p[i];
    last = i;
    if (cumulative > target) return i;
  }
  return last;  // rounding left the target at the very end
}

bool alike(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p;
}

}  // namespace

std::int64_t draw_token(const at::Tensor& logits, const SamplingParams& p, at::Generator& generator) {
  std::vector<at::Generator> generators{generator};
  return draw_tokens(logits.unsqueeze(0), {p}, generators).front();
}

std::vector<std::int64_t> draw_tokens(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                                      std::vector<at::Generator>& generators) {
  const std::int64_t rows = logits.size(0), vocab = logits.size(1);
  if (static_cast<std::int64_t>(params.size()) != rows || static_cast<std::int64_t>(generators.size()) != rows) {
    throw Error("draw_tokens: one sampling setting and one generator per row of the logits");
  }
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(rows), -1);
  std::vector<bool> drawn(static_cast<std::size_t>(rows), false);
  for (std::int64_t first = 0; first < rows; ++first) {
    if (drawn[static_cast<std::size_t>(first)]) continue;
    const SamplingParams& p = params[static_cast<std::size_t>(first)];
    std::vector<std::int64_t> group;
    for (std::int64_t r = first; r < rows; ++r) {
      if (!drawn[static_cast<std::size_t>(r)] && alike(params[static_cast<std::size_t>(r)], p)) {
        group.push_back(r);
        drawn[static_cast<std::size_t>(r)] = true;
      }
    }
    const bool all = static_cast<std::int64_t>(group.size()) == rows;
    const at::Tensor scores = all ? logits : logits.index_select(0, at::tensor(group, at::kLong));
    if (p.greedy()) {
      const at::Tensor best = at::argmax(scores, -1).contiguous();
      for (std::size_t i = 0; i < group.size(); ++i) tokens[static_cast<std::size_t>(group[i])] = best.data_ptr<std::int64_t>()[i];
      continue;
    }
    const at::Tensor probabilities = at::softmax(processed_logits(scores, p), -1).to(at::kFloat).contiguous();
    const float* base = probabilities.data_ptr<float>();
    for (std::size_t i = 0; i < group.size(); ++i) {
      const auto r = static_cast<std::size_t>(group[i]);
      tokens[r] = inverse_cdf(base + static_cast<std::int64_t>(i) * vocab, vocab, uniform(generators[r]));
    }
  }
  return tokens;
}

}  // namespace tessera
