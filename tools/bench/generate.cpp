// The harness of tools/bench/generate: Tessera's generation (tessera/generation/generate.hpp)
// of a model imported from a Hugging Face folder, greedy, B prompts of P random tokens, N new
// tokens each. Prints one JSON line: the time to the first token (the prefill and its draw), the
// decode's tokens per second after it, and the KV cache's bytes.
#include <ATen/Parallel.h>
#include <ATen/ops/randint.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/generation/generate.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s VARIANT HF_FOLDER BATCH PROMPT_TOKENS NEW_TOKENS THREADS REPEATS\n", argv[0]);
    return 2;
  }
  const int repeats = std::atoi(argv[7]);
  using namespace tessera;
  const std::string variant = argv[1], folder = argv[2];
  const std::int64_t batch = std::atoll(argv[3]), prompt = std::atoll(argv[4]), new_tokens = std::atoll(argv[5]);
  at::set_num_threads(std::atoi(argv[6]));
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, {}));
  core::seed_everything(1, "cpu");
  const std::string yaml =
      "model: {component_key: model, variant_key: " + variant + ", config: {init_from: " + folder + "}}";
  core::BuiltComponents built =
      core::ComponentFactory(host.registry(), RunContext{}).build(core::parse_config_string(yaml, "bench"));
  auto model = std::static_pointer_cast<Model>(built.instances.at("model").object);

  std::vector<GenerationRequest> requests(static_cast<std::size_t>(batch));
  for (GenerationRequest& r : requests) {
    const at::Tensor ids = at::randint(0, model->vocab_size(), {prompt}, at::kLong);
    r.prompt_ids.assign(ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + prompt);
    r.sampling.temperature = 0;
    r.max_new_tokens = new_tokens;
  }
  GenerationOptions options;
  options.batch_size = batch;
  GenerationStats stats;
  options.stats = &stats;
  using Clock = std::chrono::steady_clock;
  Clock::time_point first_token;
  bool seen = false;
  options.after_token = [&](std::size_t, const std::vector<std::int64_t>&) {
    if (!seen) first_token = Clock::now();
    seen = true;
    return false;
  };
  generate(*model, requests, options);  // warm-up: the allocator and the kernels' first calls
  // The median of `repeats` runs of each figure: one CPU's runs differ by tens of percent.
  std::vector<double> ttfts, rates;
  std::vector<GenerationResult> out;
  std::int64_t tokens = 0;
  for (int run = 0; run < repeats; ++run) {
    seen = false;
    const Clock::time_point start = Clock::now();
    out = generate(*model, requests, options);
    const Clock::time_point end = Clock::now();
    tokens = 0;
    for (const GenerationResult& r : out) tokens += static_cast<std::int64_t>(r.completion_ids.size());
    ttfts.push_back(std::chrono::duration<double>(first_token - start).count());
    rates.push_back(static_cast<double>(tokens - batch) / std::chrono::duration<double>(end - first_token).count());
  }
  std::sort(ttfts.begin(), ttfts.end());
  std::sort(rates.begin(), rates.end());
  const double ttft = ttfts[ttfts.size() / 2], rate = rates[rates.size() / 2];
  // Request 0's prompt and completion: the driver checks them against transformers' greedy ones.
  std::string prompt_ids, completion_ids;
  for (const std::int64_t id : requests[0].prompt_ids) prompt_ids += (prompt_ids.empty() ? "" : ", ") + std::to_string(id);
  for (const std::int64_t id : out[0].completion_ids) {
    completion_ids += (completion_ids.empty() ? "" : ", ") + std::to_string(id);
  }
  std::printf("{\"batch\": %lld, \"ttft_s\": %.6f, \"decode_tokens_per_s\": %.1f, \"new_tokens\": %lld, "
              "\"cache_bytes\": %lld, \"prompt_ids\": [%s], \"completion_ids\": [%s]}\n",
              static_cast<long long>(batch), ttft, rate,
              static_cast<long long>(tokens), static_cast<long long>(stats.cache_bytes), prompt_ids.c_str(),
              completion_ids.c_str());
  return 0;
}
