// `--set` overrides of a loaded spec.
#pragma once

#include <string>

#include "tessera/core/config/config_tree.hpp"

namespace tessera::core {

// Applies "a.b.c=VALUE" (VALUE parsed as YAML; numeric path parts index sequences).
void apply_override(ConfigNode& root, const std::string& assignment);

}  // namespace tessera::core
