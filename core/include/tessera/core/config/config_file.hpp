// Reading a run spec's text into a ConfigNode tree: files with their includes, and strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/core/config/config_tree.hpp"

namespace tessera::core {

// Bounds on what reading a spec may cost, whatever the input (a hostile file, a typo with aliases):
// exceeding one is a positioned ConfigIssue, reached in bounded time and memory.
namespace config_limits {
inline constexpr std::size_t kMaxBytes = 16u << 20;        // one file or --set value
inline constexpr std::int64_t kMaxNodes = 100'000;         // values after alias expansion, per text
inline constexpr std::size_t kMaxExpandedTreeBytes = 64u << 20;  // their scalars' bytes, per text
inline constexpr int kMaxDepth = 128;                      // nesting of maps and lists
inline constexpr std::size_t kMaxIncludeDepth = 16;        // include chains
inline constexpr int kMaxIncludes = 256;                   // files included in all
inline constexpr std::size_t kMaxInterpolationDepth = 32;  // ${a} -> ${b} -> ...
inline constexpr std::size_t kMaxExpandedBytes = 1u << 20; // one scalar after interpolation
inline constexpr std::int64_t kMaxInterpolatedNodes = 100'000;  // values copied by ${...} in all
}  // namespace config_limits

// Loads a YAML file; `include: FILE` or `include: [FILES]` at the top level loads those first
// (relative to the including file) and merges this file over them.
ConfigNode load_config_file(const std::string& path);
ConfigNode parse_config_string(const std::string& text, const std::string& source_name);

// Maps merge key by key, recursively; anything else in `overlay` replaces what `base` had.
void deep_merge(ConfigNode& base, const ConfigNode& overlay);

}  // namespace tessera::core
