// spdlog behind the SDK's logging interface. This file must not include LibTorch headers (see
// the note in sdk/CMakeLists.txt about the two fmt copies).
#include "tessera/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace tessera::log {
namespace {

struct State {
  std::mutex mutex;
  std::shared_ptr<spdlog::logger> logger;
  std::string prefix;
};

State& state() {
  static State* s = [] {
    auto* st = new State;  // never destroyed: plugins may log during static destruction
    st->logger = spdlog::stderr_color_mt("tessera");
    st->logger->set_pattern("%^[%H:%M:%S %L]%$ %v");
    st->logger->set_level(spdlog::level::info);
    return st;
  }();
  return *s;
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
    case Level::off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

void write(Level level, std::string_view message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.logger->log(to_spdlog(level), "{}{}", s.prefix, message);
}

bool enabled(Level level) { return state().logger->should_log(to_spdlog(level)); }

void set_level(Level level) { state().logger->set_level(to_spdlog(level)); }

bool parse_level(std::string_view name, Level& out) {
  static const std::pair<std::string_view, Level> names[] = {
      {"trace", Level::trace}, {"debug", Level::debug}, {"info", Level::info},
      {"warn", Level::warn},   {"error", Level::error}, {"off", Level::off}};
  for (const auto& [n, l] : names) {
    if (n == name) {
      out = l;
      return true;
    }
  }
  return false;
}

void set_prefix(std::string prefix) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.prefix = std::move(prefix);
}

}  // namespace tessera::log
