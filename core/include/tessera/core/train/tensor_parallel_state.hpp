// A model's whole parameters under tensor parallelism: joined from the tensor-parallel ranks'
// parts for checkpoints and exports, and cut again into this rank's parts when loading, by the
// model's plan (Model::tensor_parallel_plan). Checkpoints hold whole parameters, so a run saved
// under one mesh resumes under another.
#pragma once

#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera::core {

// `local`: this rank's parameters by name (its parts of split ones). A collective over the
// tensor-parallel group: every rank of it calls it with the same names; tensor-parallel rank 0
// gets the whole model, the others an empty dict.
StateDict join_tensor_parallel(const StateDict& local, const TensorParallelPlan& plan, const TensorParallel& tp);
// The same over the expert-parallel group for the stacked experts (TensorShard::experts): expert-
// parallel rank 0 gets every expert, the others keep nothing.
StateDict join_expert_parallel(const StateDict& local, const TensorParallelPlan& plan, const ExpertParallel& ep);
// This rank's parts of `whole` (every other tensor as it is): tensor-parallel splits by `tp`,
// stacked experts by `ep`.
StateDict cut_tensor_parallel(const StateDict& whole, const TensorParallelPlan& plan, const TensorParallel& tp,
                              const ExpertParallel& ep);

}  // namespace tessera::core
