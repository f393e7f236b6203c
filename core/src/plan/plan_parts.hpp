// The pieces of `tessera plan` (core/include/tessera/core/plan/mesh_plan.hpp), one file each:
//   layout_mesh.cpp          a DeviceMesh whose groups know their ranks but move no data
//   rank_model.cpp           the spec's model built on the meta device for one rank of a mesh
//   model_state_plan.cpp     parameters, gradients and optimizer state under the strategy
//   communication_plan.cpp   the bytes each group moves per step
//   activation_plan.cpp      the activations a rank keeps at the step's peak
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/core/plan/mesh_plan.hpp"
#include "tessera/components/model.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera::core::plan {

// The mesh of `dims` as rank `rank` sees it, with communicators that know their place and size
// and refuse to move data: what a model reads while it is built (TensorParallel::of, ...).
std::shared_ptr<DeviceMesh> make_layout_mesh(const ParallelDims& dims, std::int64_t rank);

// What one rank's part of the model holds, in parameter elements.
struct RankModel {
  std::int64_t rank = 0;
  double dense = 0;            // every parameter but stacked experts
  double experts = 0;          // stacked experts (over the expert-parallel ranks)
  double tensors = 0;          // parameter tensors
  // Of those, the ones no optimizer updates (a base that adapters froze): held (whole, or sharded
  // by fsdp) but without gradients, optimizer state or reductions.
  double frozen_dense = 0, frozen_experts = 0, frozen_tensors = 0;
  double trained_dense() const { return dense - frozen_dense; }
  double trained_experts() const { return experts - frozen_experts; }
  double unit_dense = 0;       // dense elements inside the sharding units (fsdp's per-block units)
  double tied = 0;             // held by both pipeline ends (a tied embedding), on an end
  double tp_replicated = 0;    // left whole by the tensor-parallel plan (norms, biases, positions)
  double tp_shared_by_heads = 0;  // of those, used on each rank's heads: gradients summed always
  // Trained hidden matrices (StepFacts::whole_matrices): dense and stacked experts, and of the
  // dense ones those split over the tensor-parallel ranks (local elements).
  double matrix_dense = 0, matrix_experts = 0, matrix_tp_split = 0;
  std::vector<std::int64_t> blocks;  // the global indices of the blocks it holds
  std::int64_t local_stages = 1;
  std::int64_t stage_boundaries_in = 0;   // its stages that receive activations (not the first)
  std::int64_t stage_boundaries_out = 0;  // its stages that send them on (not the last)
  bool first_stage = true;
  bool last_stage = true;
};

struct StepFacts;

// Counts `model` as built by the rank of `context` (context.mesh: a layout mesh).
RankModel describe_rank(Model& model, const RunContext& context, const TransformerShape& shape,
                        const StepFacts& step);
// The global indices of the blocks the rank of `context` holds (none when the shape is unknown).
std::vector<std::int64_t> rank_blocks(const RunContext& context, const TransformerShape& shape);

// What the spec says about a step, read once.
struct StepFacts {
  std::int64_t micro_batch = 1;    // trainer.micro_batch_size
  std::int64_t micro_batches = 1;  // trainer.grad_accum
  std::int64_t seq_len = 0;        // components.train_data.config.seq_len
  bool bf16 = false;               // settings.precision
  std::string strategy;            // ddp, zero1, zero2, fsdp ("" : the spec names none)
  std::int64_t reduce_bytes = 4;   // the strategy's reduce_dtype
  std::int64_t gather_bytes = 4;   // fsdp's param_dtype
  std::string optimizer;           // adamw, sgd, ...
  bool fused_optimizer = true;     // adamw's implementation auto|fused (a device step per tensor)
  double sgd_momentum = 0;
  // optimizer/muon: the hidden matrices (tessera/components/hidden_matrices.hpp, with its
  // adamw_params as `element_wise`) keep a momentum buffer and are made whole every step.
  bool whole_matrices = false;
  std::vector<std::string> element_wise;
  std::int64_t vocab = 0;
  bool reference_copy = false;     // the loss keeps a frozen copy of the weights (loss/dpo, no adapters)
};

// `strategy` as the run would resolve it for `dims`: the spec's, ddp where a run of several
// data-parallel ranks names none, "local" where the gradient group is one rank.
std::string resolved_strategy(const StepFacts& step, const ParallelDims& dims);

PlannedMemory plan_model_state(const RankModel& model, const StepFacts& step, const ParallelDims& dims);
std::map<std::string, double> plan_communication(const RankModel& model, const TransformerShape& shape,
                                                 const StepFacts& step, const ParallelDims& dims);
double plan_activations(const RankModel& model, const TransformerShape& shape, const StepFacts& step,
                        const ParallelDims& dims);

// The name under which the metrics count the bytes of the group of `axes` that holds `rank`:
// "world" when it spans every rank, "" when it is the rank alone.
std::string group_label(const ParallelDims& dims, const std::vector<MeshAxis>& axes, std::int64_t rank);

}  // namespace tessera::core::plan
