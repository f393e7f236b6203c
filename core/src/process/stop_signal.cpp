#include "tessera/core/process/stop_signal.hpp"

#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdint>

namespace tessera::core {
namespace {

std::atomic<int> g_signal{0};
std::atomic<std::int64_t> g_first_ns{0};  // CLOCK_MONOTONIC of the first signal

// Two seconds: more than a launcher takes to forward a signal (it polls every 100 ms), less
// than a person takes to press Ctrl-C again on purpose.
constexpr std::int64_t kDuplicateWindowNs = 2'000'000'000;

std::int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

extern "C" void on_stop_signal(int signal) {
  const std::int64_t now = monotonic_ns();
  if (g_signal.load() == 0) {
    g_first_ns.store(now);
    g_signal.store(signal);
    return;
  }
  // The same stop delivered twice: a Ctrl-C or a scheduler signals the whole process group,
  // and `tessera launch` forwards what it got to its ranks as well.
  if (now - g_first_ns.load() < kDuplicateWindowNs) return;
  // Asked again later: a stuck process must still be killable.
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

int stop_signal_received() { return g_signal.load(); }

void reset_stop_signal() {
  g_signal.store(0);
  g_first_ns.store(0);
}

}  // namespace tessera::core
