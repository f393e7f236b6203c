// SIGINT/SIGTERM ask the trainer to stop after the current step (e.g. cluster preemption).
// A second signal gets the default action, so a stuck process can still be killed.
#pragma once

namespace tessera::core {

void install_stop_signal_handlers();
// The signal number received, or 0.
int stop_signal_received();
void reset_stop_signal();

}  // namespace tessera::core
