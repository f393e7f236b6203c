// What the host gives components from the rest of the run before it validates them: values a
// user would otherwise have to repeat. Today: a dataset that checks token ids against the model's
// vocabulary (it declares a `vocab_size` field) gets the model's components.model.config.vocab_size
// when its own config leaves it out, so a prepared token file whose index names a larger tokenizer
// is refused at validation, with its position.
#pragma once

#include <functional>
#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/registry.hpp"

namespace tessera::core {

// `components`: the spec's components section (changed in place).
void give_datasets_the_model_vocabulary(ConfigNode& components, const Registry& registry);

// Every component of `kind` in `components` (inline ones inside other components too), with its
// path ("components.callbacks[1].config.data"), in YAML order.
void for_each_component(const ConfigNode& components, const std::string& kind,
                        const std::function<void(const ConfigNode&, const std::string&)>& visit);

}  // namespace tessera::core
