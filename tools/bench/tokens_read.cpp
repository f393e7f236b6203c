// How fast dataset/tokens produces batches: the real plugin, loaded as `tessera train` loads it,
// reading shuffled windows of a token file for a fixed time. Run by tools/bench/data_read.
//   tessera_bench_tokens_read FILE DTYPE SEQ_LEN BATCH SECONDS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/components/dataset.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s FILE DTYPE SEQ_LEN BATCH SECONDS\n", argv[0]);
    return 2;
  }
  using namespace tessera;
  const std::string yaml = std::string("data: {component_key: dataset, variant_key: tokens, config: {path: ") + argv[1] +
                           ", dtype: " + argv[2] + ", seq_len: " + argv[3] + ", shuffle: true, seed: 1}}";
  const std::int64_t batch = std::atoll(argv[4]);
  const double seconds = std::atof(argv[5]);
  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, {}));
  core::BuiltComponents built =
      core::ComponentFactory(host.registry(), RunContext{}).build(core::parse_config_string(yaml, "bench"));
  auto data = std::static_pointer_cast<Dataset>(built.instances.at("data").object);
  data->set_shard(0, 1);
  std::int64_t tokens = 0, batches = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    const Batch b = data->next_batch(batch);
    tokens += b.input_ids.numel();
    ++batches;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("{\"tokens_per_s\": %.0f, \"batches\": %lld, \"seconds\": %.3f}\n", static_cast<double>(tokens) / elapsed,
              static_cast<long long>(batches), elapsed);
  return 0;
}
