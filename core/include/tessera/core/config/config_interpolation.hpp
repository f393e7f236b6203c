// `${...}` references in a spec, resolved once includes and overrides are applied.
#pragma once

#include "tessera/core/config/config_tree.hpp"

namespace tessera::core {

// Replaces ${env:VAR} and ${path.to.key} in every scalar. A scalar that is exactly one
// ${path} takes the referenced node whole (keeping its type).
void resolve_interpolations(ConfigNode& root);

}  // namespace tessera::core
