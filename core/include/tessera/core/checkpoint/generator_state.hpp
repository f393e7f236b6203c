// The random generators a checkpoint holds, so a resumed run draws what the uninterrupted one
// would have: the CPU's, the device's, and the sharded stream of tensor-parallel activations
// (tessera/parallel/sharded_rng.hpp) with the rank that owns it.
#pragma once

#include <c10/core/Device.h>

#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera::core {

// "cpu", "cuda" (on a CUDA device) and "sharded/..." with "sharded/tp" = [rank, size] of `owner`.
StateDict capture_generators(const c10::Device& device, ShardRanks owner);
// Sets the generators from `rng` (capture_generators'). The sharded stream continues only on the
// same tensor-parallel rank of a group of the same size; under another mesh it starts afresh from
// this rank's seed (set by the run): two ranks must never share one.
void restore_generators(const StateDict& rng, const c10::Device& device, ShardRanks owner);

}  // namespace tessera::core
