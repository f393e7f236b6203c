// How one request draws each token from its last position's logits: small processors in the order
// transformers applies them (temperature, then top_k, top_p, min_p), then a draw from the softmax
// with the request's own random generator; greedy when the temperature is 0. The chosen token's
// log-probability is taken from the raw logits, before temperature and filters (vLLM's default).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy (the most likely token)
  std::int64_t top_k = 0;    // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the most likely tokens whose probabilities sum to top_p; 1: all
  double min_p = 0.0;        // drop tokens less likely than min_p times the most likely one; 0: none
  std::uint64_t seed = 0;    // the request's random generator's

  bool greedy() const { return temperature == 0; }
};

// Refuses a temperature below 0, a negative top_k, top_p outside (0, 1] and min_p outside [0, 1],
// naming the field.
TESSERA_API void check_sampling(const SamplingParams& p);

// `logits` [..., vocab] float32 divided by the temperature, the tokens the filters drop at -inf
// (at least the most likely token kept). The distribution a token is drawn from is its softmax.
TESSERA_API at::Tensor processed_logits(const at::Tensor& logits, const SamplingParams& p);

// One token drawn from `logits` [vocab] (float32, on the host) as `p` says, with `generator` (a
// CPU generator seeded from p.seed); the argmax when p.greedy(). The draw takes one uniform number
// from the generator and finds where it falls in the cumulative softmax.
TESSERA_API std::int64_t draw_token(const at::Tensor& logits, const SamplingParams& p, at::Generator& generator);

// draw_token for each row of `logits` [rows, vocab]: row r as params[r] says, with generators[r].
// Rows that sample alike (the same temperature and filters) are processed in one pass, and each
// row's draw uses its own generator alone: a request draws the same tokens in any batch.
TESSERA_API std::vector<std::int64_t> draw_tokens(const at::Tensor& logits, const std::vector<SamplingParams>& params,
                                                  std::vector<at::Generator>& generators);

}  // namespace tessera
