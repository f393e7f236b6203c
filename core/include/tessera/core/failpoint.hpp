// Named points where a test can make this process die as a crash would: with
// TESSERA_FAILPOINT=NAME (or NAME@N: the N-th time) in the environment, reaching failpoint(NAME)
// sends SIGKILL to this process.
// Used to prove that checkpoints survive a kill at every stage of a save.
#pragma once

namespace tessera::core {

void failpoint(const char* name);

}  // namespace tessera::core
