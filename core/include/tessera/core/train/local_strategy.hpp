// The parallel strategy of a run of one rank, a null object: parameters, gradients and optimizer
// state stay whole where the model put them and no collective runs. The trainer uses it when a
// run names no strategy, so a step has one shape whatever the number of ranks.
#pragma once

#include <memory>

#include "tessera/components/strategy.hpp"

namespace tessera::core {

std::shared_ptr<ParallelStrategy> make_local_strategy();
// Whether `strategy` is the one make_local_strategy() makes.
bool is_local_strategy(const ParallelStrategy& strategy);

}  // namespace tessera::core
