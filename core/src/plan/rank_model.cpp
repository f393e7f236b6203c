// One rank's part of the model, counted from the model as that rank builds it (on the meta device
// under a layout mesh): its parameters by kind, and which pipeline stages and blocks it holds.
#include <algorithm>
#include <set>

#include "plan_parts.hpp"
#include "tessera/components/hidden_matrices.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"

namespace tessera::core::plan {

RankModel describe_rank(Model& model, const RunContext& context, const TransformerShape& shape,
                        const StepFacts& step) {
  RankModel r;
  r.rank = context.rank;
  const TensorParallelPlan tp_plan = model.tensor_parallel_plan();
  const std::vector<std::string> tied = model.pipeline_tied_parameters();
  std::set<const void*> experts;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const double n = static_cast<double>(item.value().numel());
    const TensorShard shard = shard_in(tp_plan, item.key());
    const bool frozen = !item.value().requires_grad();  // the factory froze what no adapter trains
    r.tensors += 1;
    r.frozen_tensors += frozen ? 1 : 0;
    if (shard.experts) {
      r.experts += n;
      r.frozen_experts += frozen ? n : 0;
      experts.insert(item.value().unsafeGetTensorImpl());
    } else {
      r.dense += n;
      r.frozen_dense += frozen ? n : 0;
    }
    if (step.whole_matrices && !frozen && is_hidden_matrix(item.key(), item.value().dim(), step.element_wise)) {
      (shard.experts ? r.matrix_experts : r.matrix_dense) += n;
      if (!shard.experts && !shard.replicated()) r.matrix_tp_split += n;
    }
    if (shard.replicated()) r.tp_replicated += n;
    if (shard.shared_by_heads) r.tp_shared_by_heads += n;
    if (std::find(tied.begin(), tied.end(), item.key()) != tied.end()) r.tied += n;
  }
  std::set<const void*> counted;
  for (const auto& unit : model.sharding_units()) {
    for (const auto& p : unit->parameters(/*recurse=*/true)) {
      if (experts.count(p.unsafeGetTensorImpl()) || !counted.insert(p.unsafeGetTensorImpl()).second) continue;
      r.unit_dense += static_cast<double>(p.numel());
    }
  }
  const PipelineParallel pipeline = PipelineParallel::transport_of(context);
  r.local_stages = static_cast<std::int64_t>(pipeline.local_stages().size());
  r.first_stage = pipeline.holds_first_stage();
  r.last_stage = pipeline.holds_last_stage();
  for (const auto& stage : pipeline.local_stages()) {
    if (!stage.first) ++r.stage_boundaries_in;
    if (!stage.last) ++r.stage_boundaries_out;
  }
  r.blocks = rank_blocks(context, shape);
  return r;
}

std::vector<std::int64_t> rank_blocks(const RunContext& context, const TransformerShape& shape) {
  std::vector<std::int64_t> blocks;
  if (shape.blocks <= 0) return blocks;
  const PipelineParallel pipeline = PipelineParallel::of(context, shape.blocks);
  for (const auto& stage : pipeline.local_stages()) {
    for (std::int64_t b = stage.first_block; b < stage.end_block; ++b) blocks.push_back(b);
  }
  return blocks;
}

}  // namespace tessera::core::plan
