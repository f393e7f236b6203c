// Parameters, gradients and optimizer state one rank holds under the run's strategy, as
// plugins/parallel/strategies keeps them: fp32 master weights (bf16 precision is autocast over
// them), flat units padded to the group's size (a few elements, left out here), stacked experts
// sharded over their own expert data-parallel group.
//   ddp     parameters n, gradients n (the flat reduction buffer)
//   zero1   parameters n, gradients n + n/W (the buffer and this rank's reduced shard)
//   zero2   parameters n, gradients n/W
//   fsdp    parameters n/W, gradients n/W (hybrid: W is the shard group, dp_shard x cp)
//   local   parameters n, gradients n (freed between steps; the measured gradient_bytes is 0)
// Optimizer state covers what the rank updates (n, or n/W when sharded): adamw two fp32 moments
// per element and, fused, a step per tensor; sgd a momentum buffer when momentum > 0; muon a
// momentum buffer for its hidden matrices and AdamW's moments for the rest. A frozen
// base (adapters) counts in the parameters only: gradients and optimizer state are the trained
// parameters' (fsdp shards the frozen base like the rest; ddp and zero hold it whole). A loss
// that compares with a frozen copy of the starting weights (loss/dpo without adapters) holds one
// more set of parameters, sharded as they are.
#include "plan_parts.hpp"

namespace tessera::core::plan {
namespace {

constexpr double kMaster = 4;  // fp32 master weights, gradients and optimizer state

}  // namespace

std::string resolved_strategy(const StepFacts& step, const ParallelDims& dims) {
  const std::int64_t gradient_ranks = dims.dp_replicate * dims.dp_shard * dims.cp;
  if (!step.strategy.empty()) return step.strategy;
  return gradient_ranks > 1 ? "ddp" : "local";
}

PlannedMemory plan_model_state(const RankModel& model, const StepFacts& step, const ParallelDims& dims) {
  const std::string strategy = resolved_strategy(step, dims);
  const bool hybrid = strategy == "fsdp" && dims.dp_replicate > 1;
  const double shards = static_cast<double>(hybrid ? dims.dp_shard * dims.cp : dims.dp_replicate * dims.dp_shard * dims.cp);
  // Stacked experts are sharded over the ranks holding the same ones: the shard group over ep
  // (expert parallelism and hybrid sharding do not combine).
  const double expert_group = shards / static_cast<double>(dims.ep);
  // Elements the rank holds whole, and the share of them it owns when a strategy shards.
  const double whole = model.dense + model.experts;
  const double owned = model.dense / shards + model.experts / expert_group;
  // The same for the trained parameters alone (all of them without adapters).
  const double trained_whole = model.trained_dense() + model.trained_experts();
  const double trained_owned = model.trained_dense() / shards + model.trained_experts() / expert_group;
  PlannedMemory m;
  if (strategy == "fsdp") {
    m.parameters = kMaster * owned;
    m.gradients = kMaster * trained_owned;
  } else {
    m.parameters = kMaster * whole;
    if (strategy == "zero1") {
      m.gradients = kMaster * (trained_whole + trained_owned);
    } else if (strategy == "zero2") {
      m.gradients = kMaster * trained_owned;
    } else {
      m.gradients = kMaster * trained_whole;  // ddp, local
    }
  }
  // loss/dpo's reference without adapters: the strategy holds the copy as it holds the weights.
  if (step.reference_copy) m.reference = m.parameters;
  const bool sharded_state = strategy == "zero1" || strategy == "zero2" || strategy == "fsdp";
  const double updated = sharded_state ? trained_owned : trained_whole;
  if (step.optimizer == "adamw") {
    m.optimizer_state = 2 * kMaster * updated + (step.fused_optimizer ? 4 * (model.tensors - model.frozen_tensors) : 0);
  } else if (step.whole_matrices) {
    // muon: one fp32 buffer per hidden-matrix element, AdamW's two moments for the rest (its
    // foreach steps count on the host).
    const double matrices = model.matrix_dense / (sharded_state ? shards : 1) +
                            model.matrix_experts / (sharded_state ? expert_group : 1);
    m.optimizer_state = kMaster * matrices + 2 * kMaster * (updated - matrices);
  } else if (step.optimizer == "sgd") {
    m.optimizer_state = step.sgd_momentum > 0 ? kMaster * updated : 0;
  }
  return m;
}

}  // namespace tessera::core::plan
