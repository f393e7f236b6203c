// Reading a run spec's text into a ConfigNode tree: files with their includes, and strings.
#pragma once

#include <string>

#include "tessera/core/config/config_tree.hpp"

namespace tessera::core {

// Loads a YAML file; `include: FILE` or `include: [FILES]` at the top level loads those first
// (relative to the including file) and merges this file over them.
ConfigNode load_config_file(const std::string& path);
ConfigNode parse_config_string(const std::string& text, const std::string& source_name);

// Maps merge key by key, recursively; anything else in `overlay` replaces what `base` had.
void deep_merge(ConfigNode& base, const ConfigNode& overlay);

}  // namespace tessera::core
