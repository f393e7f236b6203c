// Logging for host and plugins. Backed by spdlog inside the SDK library; this header carries no
// spdlog or fmt so it is safe next to LibTorch's own bundled fmt (see docs/architecture.md).
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "tessera/export.hpp"

namespace tessera::log {

enum class Level { trace, debug, info, warn, error, off };

TESSERA_API void write(Level level, std::string_view message);
TESSERA_API bool enabled(Level level);
TESSERA_API void set_level(Level level);
// Parses "trace|debug|info|warn|error|off"; returns false for anything else.
TESSERA_API bool parse_level(std::string_view name, Level& out);
// Prefix for every line of this process, e.g. "[rank 1] " under a multi-process launch.
TESSERA_API void set_prefix(std::string prefix);

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Each takes any streamable values and joins them: log::info("step ", step, " loss ", loss).
template <class... Args>
void debug(Args&&... args) {
  if (enabled(Level::debug)) write(Level::debug, detail::concat(std::forward<Args>(args)...));
}
template <class... Args>
void info(Args&&... args) {
  if (enabled(Level::info)) write(Level::info, detail::concat(std::forward<Args>(args)...));
}
template <class... Args>
void warn(Args&&... args) {
  if (enabled(Level::warn)) write(Level::warn, detail::concat(std::forward<Args>(args)...));
}
template <class... Args>
void error(Args&&... args) {
  if (enabled(Level::error)) write(Level::error, detail::concat(std::forward<Args>(args)...));
}

}  // namespace tessera::log
