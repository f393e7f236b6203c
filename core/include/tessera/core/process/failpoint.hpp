// Named points where a test can make this process die as a crash would: with
// TESSERA_FAILPOINT=NAME (or NAME@N: the N-th time) in the environment, reaching failpoint(NAME)
// sends SIGKILL to this process; NAME:stall makes it hang there instead, and
// TESSERA_FAILPOINT_RANK=R arms only rank R.
// Used to prove that checkpoints survive a kill at every stage of a save, and that the health
// callback's watchdog catches a hang (failpoint "trainer.step", reached at every step's start).
#pragma once

namespace tessera::core {

void failpoint(const char* name);

}  // namespace tessera::core
