// A model's linear layers by module path, and PEFT's rule for naming them: how adapters find the
// layers they wrap (tessera/components/adapter.hpp). A layer's path ends with its Hugging Face
// name ("q_proj" is layers.N.self_attn.q_proj of a Llama, "c_attn" h.N.attn.c_attn of a GPT-2,
// "attn.c_proj" the attention's output projection only).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/export.hpp"
#include "tessera/nn/linear.hpp"

namespace tessera {

// One of a model's linear layers and its module path ("layers.0.self_attn.q_proj").
struct LinearLayer {
  std::string path;
  std::shared_ptr<Linear> layer;
};

// Every tessera::Linear of `model`, in registration order (adaptable or not).
TESSERA_API std::vector<LinearLayer> linear_layers(Model& model);

// Whether the layer at module path `path` is the Hugging Face target name `target`: the path is
// the target or ends with "." + target, as PEFT's target_modules match.
TESSERA_API bool matches_target(const std::string& path, const std::string& target);

}  // namespace tessera
