// Batched generation with a model's KV cache (Model::decode): the requests in batches of
// `batch_size`, each batch's prompts left-padded into one prefill, then one token a row a pass,
// every request with its own sampling, stops and length. What `tessera generate`, `tessera chat`,
// callback/sample_text and RL rollouts run. Every rank of a tensor-parallel group calls it with
// the same requests (the model's collectives run in every pass; each rank draws the same tokens
// from the same logits and seeds).
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/generation/sampling.hpp"

namespace tessera {

class Model;

struct GenerationRequest {
  std::vector<std::int64_t> prompt_ids;  // at least one token
  SamplingParams sampling;
  std::int64_t max_new_tokens = 128;
  std::vector<std::int64_t> stop_token_ids;  // ends the completion, which keeps it (as an EOS)
};

struct GenerationResult {
  // The tokens generated; with the EOS or stop token that ended them.
  std::vector<std::int64_t> completion_ids;
  // Each token's log-probability under the raw logits (before temperature and filters).
  std::vector<double> logprobs;
  std::string finish_reason;  // "stop" (an EOS, a stop token or stop()) or "length"
};

// What a generate() call measured.
struct GenerationStats {
  std::int64_t cache_bytes = 0;  // the largest KV cache one batch held
};

struct GenerationOptions {
  std::vector<std::int64_t> eos_token_ids;  // end every request (the model's generation_config)
  std::int64_t batch_size = 8;
  // Draw only ids below this (a tokenizer's, where the model's vocabulary is padded past it); the
  // log-probabilities stay those of the raw logits over every id. 0: every id.
  std::int64_t vocabulary = 0;
  c10::Device device = c10::Device(c10::kCPU);  // the model's
  // Called after each token a request draws (streaming, stop strings): true ends the request
  // there with finish_reason "stop". Unset: never.
  std::function<bool(std::size_t request, const std::vector<std::int64_t>& completion)> after_token;
  GenerationStats* stats = nullptr;  // filled when set
};

// The completions of `requests`, in their order. Refuses (naming the request) an empty prompt, a
// prompt whose length plus max_new_tokens passes the model's max_seq_len, bad sampling settings,
// and a model that does not decode. Runs without gradients with the model in eval mode, restoring
// its mode after.
TESSERA_API std::vector<GenerationResult> generate(Model& model, const std::vector<GenerationRequest>& requests,
                                                   const GenerationOptions& options);

}  // namespace tessera
