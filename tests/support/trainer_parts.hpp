// The trainer's parts from components built for a test (tests/support/test_support.hpp).
#pragma once

#include "tessera/core/train/trainer.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/components/strategy.hpp"
#include "test_support.hpp"

namespace tessera::testing {

// Components named model, train_data, loss, optimizer and, when present, parallel.
inline core::TrainerParts trainer_parts(const core::BuiltComponents& built) {
  core::TrainerParts parts;
  parts.model = testing::built<Model>(built, "model");
  parts.train_data = testing::built<Dataset>(built, "train_data");
  parts.loss = testing::built<Loss>(built, "loss");
  parts.optimizer = testing::built<Optimizer>(built, "optimizer");
  if (built.instances.count("parallel")) parts.parallel = testing::built<ParallelStrategy>(built, "parallel");
  parts.adapter_parameters = built.adapter_parameters;
  return parts;
}

}  // namespace tessera::testing
