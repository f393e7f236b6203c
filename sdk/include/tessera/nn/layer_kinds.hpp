// Per-block kinds of a decoder whose blocks differ (Gemma's sliding and global attention layers,
// Qwen's and Mistral's windows): the list a config gives, or a pattern, checked once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/error.hpp"

namespace tessera::nn {

// `listed` when given, else `n` blocks of `kind` with every `every`-th one `last_kind`
// (Hugging Face's sliding_window_pattern).
inline std::vector<std::string> layer_kinds(const std::vector<std::string>& listed, std::int64_t n, std::int64_t every,
                                            const std::string& kind, const std::string& last_kind) {
  if (!listed.empty()) return listed;
  std::vector<std::string> kinds;
  for (std::int64_t i = 1; i <= n; ++i) kinds.push_back(every > 0 && i % every == 0 ? last_kind : kind);
  return kinds;
}

// One of `allowed` for each of `n` blocks, or a ConfigError at `field`.
inline void check_layer_kinds(const std::vector<std::string>& kinds, std::int64_t n,
                              const std::vector<std::string>& allowed, const std::string& field) {
  if (static_cast<std::int64_t>(kinds.size()) != n) {
    throw ConfigError(field + " lists " + std::to_string(kinds.size()) + " kinds for " + std::to_string(n) + " blocks",
                      field);
  }
  for (const std::string& kind : kinds) {
    bool known = false;
    for (const std::string& a : allowed) known = known || a == kind;
    if (!known) throw ConfigError(field + " lists '" + kind + "', not one of the kinds the model has", field);
  }
}

}  // namespace tessera::nn
