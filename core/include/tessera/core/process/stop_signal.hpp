// SIGINT/SIGTERM ask the trainer to stop after the current step (e.g. cluster preemption).
// Another signal within two seconds of the first is the same request arriving twice (a Ctrl-C
// reaches the launcher and its ranks, and the launcher forwards it too) and is ignored; a later
// one gets the default action, so a stuck process can still be killed.
#pragma once

namespace tessera::core {

void install_stop_signal_handlers();
// The signal number received, or 0.
int stop_signal_received();
void reset_stop_signal();

}  // namespace tessera::core
