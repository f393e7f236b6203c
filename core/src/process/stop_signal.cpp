#include "tessera/core/process/stop_signal.hpp"

#include <atomic>
#include <csignal>

namespace tessera::core {
namespace {

std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int signal) {
  g_signal.store(signal);
  std::signal(signal, SIG_DFL);  // the next one terminates at once
}

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

int stop_signal_received() { return g_signal.load(); }

void reset_stop_signal() { g_signal.store(0); }

}  // namespace tessera::core
