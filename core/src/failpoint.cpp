#include "tessera/core/failpoint.hpp"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

#include "tessera/log.hpp"

namespace tessera::core {
namespace {

// TESSERA_FAILPOINT=NAME fires the first time NAME is reached; NAME@N the N-th time.
struct Armed {
  std::string name;
  long count = 1;
};

const Armed& armed() {
  static const Armed a = [] {
    Armed out;
    if (const char* v = std::getenv("TESSERA_FAILPOINT")) {
      out.name = v;
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
    log::warn("failpoint ", name, ": killing this process (TESSERA_FAILPOINT)");
    std::raise(SIGKILL);
  }
}

}  // namespace tessera::core
