// Moving a StateDict between ranks: how the pipeline stages' parts of a model come together on
// rank 0 for a checkpoint or an export (each stage holds its own blocks' parameters).
#pragma once

#include "tessera/run/communicator.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera::core {

// Every rank's `local` (host tensors) onto rank 0 of `group`, which gets their union (a name on
// several ranks keeps the lowest rank's tensor: a tied embedding is the first stage's); the
// others get an empty dict. Point to point: every rank of `group` calls it.
StateDict gather_state_dicts(const StateDict& local, Communicator& group);

}  // namespace tessera::core
