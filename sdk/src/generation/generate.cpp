// Batched generation over a model's KV cache (tessera/generation/generate.hpp).
#include "tessera/generation/generate.hpp"

#include <ATen/ops/full.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>

#include "tessera/components/kv_cache.hpp"
#include "tessera/components/model.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace {

void check_request(const Model& model, const GenerationRequest& r, std::size_t index) {
  const std::string which = "request " + std::to_string(index) + ": ";
  if (r.prompt_ids.empty()) throw Error(which + "the prompt has no tokens");
  if (r.max_new_tokens < 1) throw Error(which + "max_new_tokens must be at least 1");
  const auto prompt = static_cast<std::int64_t>(r.prompt_ids.size());
  if (prompt + r.max_new_tokens > model.max_seq_len()) {
    throw Error(which + "a prompt of " + std::to_string(prompt) + " tokens and max_new_tokens " +
                std::to_string(r.max_new_tokens) + " pass the model's max_seq_len " +
                std::to_string(model.max_seq_len()) + "; shorten the prompt or lower max_new_tokens");
  }
  for (const std::int64_t id : r.prompt_ids) {
    if (id < 0 || id >= model.vocab_size()) {
      throw Error(which + "token id " + std::to_string(id) + " is outside the model's vocabulary of " +
                  std::to_string(model.vocab_size()));
    }
  }
  try {
    check_sampling(r.sampling);
  } catch (const Error& e) {
    throw Error(which + e.what());
  }
}

// One batch of requests [first, first + rows) to the end.
void generate_batch(Model& model, const std::vector<GenerationRequest>& requests, std::size_t first, std::size_t rows,
                    const GenerationOptions& options, std::vector<GenerationResult>& results) {
  std::int64_t longest = 0, most_new = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(requests[first + r].prompt_ids.size()));
    most_new = std::max(most_new, requests[first + r].max_new_tokens);
  }
  const auto batch = static_cast<std::int64_t>(rows);
  // The prompts left-padded (position -1: slots of no key) so every row's next token is the last.
  at::Tensor ids = at::zeros({batch, longest}, at::kLong), positions = at::full({batch, longest}, -1, at::kLong);
  std::vector<std::int64_t> next_position(rows);
  std::vector<at::Generator> generators;
  auto prompt_ids = ids.accessor<std::int64_t, 2>(), prompt_positions = positions.accessor<std::int64_t, 2>();
  for (std::size_t r = 0; r < rows; ++r) {
    const auto& prompt = requests[first + r].prompt_ids;
    const auto n = static_cast<std::int64_t>(prompt.size());
    const auto row = static_cast<std::int64_t>(r);
    for (std::int64_t i = 0; i < n; ++i) {
      prompt_ids[row][longest - n + i] = prompt[static_cast<std::size_t>(i)];
      prompt_positions[row][longest - n + i] = i;
    }
    next_position[r] = n;
    generators.push_back(at::make_generator<at::CPUGeneratorImpl>(requests[first + r].sampling.seed));
  }
  KvCache cache(batch, model.decode_slots(longest) + most_new * model.decode_slots(1),
                static_cast<std::size_t>(model.transformer_shape().blocks), options.device);
  at::Tensor logits = model.decode(ids.to(options.device), positions, cache, /*last_only=*/true);
  std::vector<bool> done(rows, false);
  std::size_t remaining = rows;
  while (true) {
    // The step's logits on the host in float32: the draw, the log-probabilities and the stops.
    const at::Tensor raw = logits.squeeze(1).to(at::kCPU, at::kFloat);
    const at::Tensor logprobs = at::log_softmax(raw, -1).contiguous();
    const at::Tensor drawn_from =
        options.vocabulary > 0 && options.vocabulary < raw.size(-1) ? raw.narrow(-1, 0, options.vocabulary) : raw;
    at::Tensor step_ids = at::zeros({batch, 1}, at::kLong), step_positions = at::full({batch, 1}, -1, at::kLong);
    auto next_ids = step_ids.accessor<std::int64_t, 2>(), next_positions = step_positions.accessor<std::int64_t, 2>();
    // The rows still running draw together: one pass for those that sample alike.
    std::vector<std::int64_t> running;
    std::vector<SamplingParams> sampling;
    std::vector<at::Generator> running_generators;
    for (std::size_t r = 0; r < rows; ++r) {
      if (done[r]) continue;
      running.push_back(static_cast<std::int64_t>(r));
      sampling.push_back(requests[first + r].sampling);
      running_generators.push_back(generators[r]);
    }
    const at::Tensor candidates = running.size() == rows ? drawn_from : drawn_from.index_select(0, at::tensor(running, at::kLong));
    const std::vector<std::int64_t> drawn = draw_tokens(candidates.contiguous(), sampling, running_generators);
    const float* row_logprobs = logprobs.data_ptr<float>();
    const std::int64_t vocab = logprobs.size(-1);
    for (std::size_t i = 0; i < running.size(); ++i) {
      const auto r = static_cast<std::size_t>(running[i]);
      const GenerationRequest& request = requests[first + r];
      GenerationResult& out = results[first + r];
      const auto row = static_cast<std::int64_t>(r);
      const std::int64_t token = drawn[i];
      out.completion_ids.push_back(token);
      out.logprobs.push_back(row_logprobs[row * vocab + token]);
      const auto is = [token](const std::vector<std::int64_t>& ids) {
        return std::find(ids.begin(), ids.end(), token) != ids.end();
      };
      if (is(options.eos_token_ids) || is(request.stop_token_ids) ||
          (options.after_token && options.after_token(first + r, out.completion_ids))) {
        out.finish_reason = "stop";
      } else if (static_cast<std::int64_t>(out.completion_ids.size()) >= request.max_new_tokens) {
        out.finish_reason = "length";
      } else {
        next_ids[row][0] = token;
        next_positions[row][0] = next_position[r]++;
        continue;
      }
      done[r] = true;
      --remaining;
    }
    if (remaining == 0) {
      if (options.stats) options.stats->cache_bytes = std::max(options.stats->cache_bytes, cache.bytes());
      return;
    }
    logits = model.decode(step_ids.to(options.device), step_positions, cache, /*last_only=*/true);
  }
}

}  // namespace

std::vector<GenerationResult> generate(Model& model, const std::vector<GenerationRequest>& requests,
                                       const GenerationOptions& options) {
  if (!model.decodes()) {
    throw Error("model/" + model.name() + " does not decode from a KV cache; generate with a model built on the "
                "transformer kit");
  }
  if (options.batch_size < 1) throw Error("generation: batch_size must be at least 1");
  for (std::size_t i = 0; i < requests.size(); ++i) check_request(model, requests[i], i);
  std::vector<GenerationResult> results(requests.size());
  const bool training = model.is_training();
  model.eval();
  try {
    c10::NoGradGuard no_grad;
    const auto batch = static_cast<std::size_t>(options.batch_size);
    for (std::size_t first = 0; first < requests.size(); first += batch) {
      generate_batch(model, requests, first, std::min(batch, requests.size() - first), options, results);
    }
  } catch (...) {
    model.train(training);
    throw;
  }
  model.train(training);
  return results;
}

}  // namespace tessera
