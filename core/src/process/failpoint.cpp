#include "tessera/core/process/failpoint.hpp"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>
#include <chrono>

#include "tessera/log.hpp"

namespace tessera::core {
namespace {

// TESSERA_FAILPOINT=NAME fires the first time NAME is reached; NAME@N the N-th time. A suffix
// `:stall` makes it hang instead of dying (for the hang watchdog's tests). With
// TESSERA_FAILPOINT_RANK=R only the process whose RANK is R fires.
struct Armed {
  std::string name;
  long count = 1;
  bool stall = false;
};

bool this_rank_is_armed() {
  const char* only = std::getenv("TESSERA_FAILPOINT_RANK");
  if (!only || !*only) return true;
  const char* rank = std::getenv("RANK");
  return std::string(rank ? rank : "0") == only;
}

const Armed& armed() {
  static const Armed a = [] {
    Armed out;
    if (const char* v = std::getenv("TESSERA_FAILPOINT"); v && this_rank_is_armed()) {
      out.name = v;
      const auto colon = out.name.find(':');
      if (colon != std::string::npos) {
        out.stall = out.name.substr(colon + 1) == "stall";
        out.name.resize(colon);
      }
      const auto at = out.name.find('@');
      if (at != std::string::npos) {
        out.count = std::strtol(out.name.c_str() + at + 1, nullptr, 10);
        out.name.resize(at);
      }
    }
    return out;
  }();
  return a;
}

}  // namespace

void failpoint(const char* name) {
  static std::atomic<long> reached{0};
  const Armed& a = armed();
  if (a.name.empty() || a.name != name) return;
  if (++reached == a.count) {
    if (a.stall) {
      log::warn("failpoint ", name, ": stalling this process (TESSERA_FAILPOINT)");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    log::warn("failpoint ", name, ": killing this process (TESSERA_FAILPOINT)");
    std::raise(SIGKILL);
  }
}

}  // namespace tessera::core
