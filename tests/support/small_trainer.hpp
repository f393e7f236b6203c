// A small real trainer for tests: the bundled gpt, tokens, cross_entropy and an optimizer on
// a token file with uneven padding, built through the real factory on one local rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/core/run/training_run.hpp"
#include "test_support.hpp"
#include "trainer_parts.hpp"

namespace tessera::testing {

using core::BuiltComponents;
using core::Trainer;
using core::TrainerParts;
using core::TrainerSettings;

// Token file where token 0 is padding (ignored as a label) in runs of varying length, so
// micro-batches carry very different numbers of target tokens.
inline std::string uneven_token_file(const TempDir& dir) {
  std::vector<std::uint16_t> tokens;
  std::uint32_t state = 7;
  for (int doc = 0; tokens.size() < 4000; ++doc) {
    int text = 3 + doc * 7 % 29, pad = doc * 11 % 23;
    for (int i = 0; i < text; ++i) tokens.push_back(static_cast<std::uint16_t>(1 + (state = state * 1103515245u + 12345u) % 31));
    for (int i = 0; i < pad; ++i) tokens.push_back(0);
  }
  const std::string path = dir.file("uneven.bin");
  testing::write_token_file(path, tokens);
  return path;
}

inline std::string components_yaml(const std::string& data, const std::string& optimizer = "sgd",
                            const std::string& optimizer_config = "lr: 0.5") {
  return "model: {component_key: model, variant_key: gpt,\n"
         "        config: {vocab_size: 32, n_layer: 2, n_head: 2, n_embd: 16, max_seq_len: 16}}\n"
         "train_data: {component_key: dataset, variant_key: tokens,\n"
         "             config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n"
         "loss: {component_key: loss, variant_key: cross_entropy}\n"
         "optimizer: {component_key: optimizer, variant_key: " + optimizer + ",\n"
         "            config: {" + optimizer_config + ", model: {instance_key: model}}}\n";
}

struct Built {
  BuiltComponents components;
  std::unique_ptr<Trainer> trainer;
};

// `callbacks` first, then the callbacks the yaml builds under the names in `callback_instances`
// (so they may refer to the run's other components); `run_dir` is the run context's.
inline Built make_trainer(const std::string& yaml, TrainerSettings settings,
                          std::vector<std::shared_ptr<Callback>> callbacks = {},
                          const std::vector<std::string>& callback_instances = {}, const std::string& run_dir = {},
                          double peak_flops = 0) {
  RunContext context;
  context.seed = 42;
  context.run_dir = run_dir;
  context.communicator = core::make_local_communicator();
  core::seed_everything(context.seed, "cpu");
  Built b;
  b.components = testing::build_components(yaml, context);
  TrainerParts parts = trainer_parts(b.components);
  parts.callbacks = std::move(callbacks);
  for (const auto& name : callback_instances) parts.callbacks.push_back(testing::built<Callback>(b.components, name));
  b.trainer = std::make_unique<Trainer>(std::move(parts), settings, context, peak_flops);
  return b;
}

inline TrainerSettings settings(std::int64_t accum, std::int64_t micro_batch, std::int64_t max_steps = 1) {
  TrainerSettings s;
  s.grad_accum = accum;
  s.micro_batch_size = micro_batch;
  s.max_steps = max_steps;
  return s;
}

}  // namespace tessera::testing
