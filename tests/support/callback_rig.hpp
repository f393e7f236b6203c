// A callback built through the real factory beside a small real gpt, with the context a trainer
// would hand it: what every callback plugin's tests drive it with.
#pragma once

#include <memory>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/components/model.hpp"
#include "test_support.hpp"

namespace tessera::testing {

struct CallbackRig {
  // `variant` of kind callback with `config` (YAML flow text); run dir DIR/run.
  CallbackRig(const std::string& variant, const std::string& config, std::int64_t rank = 0, std::int64_t world_size = 2,
              const std::string& model_config = "{vocab_size: 16, n_layer: 1, n_head: 1, n_embd: 8, max_seq_len: 4}") {
    run.run_dir = (dir.path() / "run").string();
    run.rank = rank;
    run.world_size = world_size;
    components = build_components(
        "model: {component_key: model, variant_key: gpt, config: " + model_config + "}\n"
        "callback: {component_key: callback, variant_key: " + variant + ", config: " + config + "}\n",
        run);
    model = built<Model>(components, "model");
    callback = built<Callback>(components, "callback");
  }

  CallbackContext context() { return CallbackContext{run, progress, *model, control}; }

  TempDir dir;
  RunContext run;
  TrainProgress progress;
  TrainerControl control;
  core::BuiltComponents components;
  std::shared_ptr<Model> model;
  std::shared_ptr<Callback> callback;
};

}  // namespace tessera::testing
