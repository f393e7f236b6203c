// The fixed shape of a run spec: its top-level keys, the trainer's component roles, and the
// schemas of the sections the host reads itself (plugins, settings, trainer, checkpoint,
// parallelism), for
// validation, `tessera describe`, the JSON Schema and docs/components.md.
#pragma once

#include <string>
#include <vector>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/config/schema.hpp"

namespace tessera::core {

const std::vector<std::string>& top_level_keys();

// The trainer's roles under `components`: name, kind, and whether it may be left out.
struct ComponentRole {
  const char* name;
  const char* kind;
  bool required;
  bool list;
  const char* doc;
};
const std::vector<ComponentRole>& trainer_roles();

// Fails on the first role that is missing, of the wrong shape (one component or a list) or
// declared with another kind. `components` may be null; `top` is where to point then.
// `model_only` (generation): only the model and its adapters are looked at.
void check_trainer_roles(const ConfigNode* components, const SourcePos& top, bool model_only = false);
// No component refers to components.train_data ({instance_key: train_data}): the trainer's alone.
void check_train_data_unshared(const ConfigNode* components);

Schema plugins_schema();
Schema settings_schema();
Schema trainer_schema();
Schema checkpoint_schema();
Schema parallelism_schema();

}  // namespace tessera::core
