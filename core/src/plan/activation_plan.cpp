// The activations one rank keeps for backward at the step's peak: an analytic estimate in the
// manner of Korthikanti et al. (2022), from what autograd saves in a pre-norm transformer block,
// with T tokens per rank (b s / cp), e the compute element size and the residual stream in fp32:
//   norms          each norm's fp32 input, 4 T h (split over tp under sequence parallelism)
//   attention      the projection's input e T h, q, k and v, and the attention output (over tp);
//                  no s x s scores (memory-efficient attention keeps a row statistic only)
//   MLP            its input e T h, the inner projection(s) and the activation's output (over tp);
//                  an MoE block's experts see k rows per token
//   checkpointed   the block's fp32 input only, plus one block's worth while it is recomputed
// A pipeline stage keeps that for as many micro-batches as its schedule has in flight (the
// schedule's own actions, sdk/src/parallel/pipeline_schedule.cpp); without pp, one.
#include <algorithm>

#include "plan_parts.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"

namespace tessera::core::plan {
namespace {

// The most micro-batches one of the rank's stages has run forward and not yet backward.
std::int64_t micro_batches_in_flight(const ParallelDims& dims, std::int64_t pipeline_rank, std::int64_t micro_batches) {
  if (dims.pp == 1) return 1;
  std::int64_t held = 0, peak = 0;
  for (const auto& action : pipeline_schedule(dims.pp_schedule, dims.pp, dims.pp_stages_per_rank, pipeline_rank,
                                              micro_batches)) {
    held += action.kind == PipelineAction::Kind::forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  // Counted over all of the rank's stages; the bytes below are per stage.
  return std::max<std::int64_t>(1, peak);
}

}  // namespace

double plan_activations(const RankModel& model, const TransformerShape& shape, const StepFacts& step,
                        const ParallelDims& dims) {
  if (shape.hidden <= 0 || model.blocks.empty()) return 0;
  const double e = step.bf16 ? 2 : 4;
  const double T = static_cast<double>(step.micro_batch * step.seq_len) / static_cast<double>(dims.cp);
  const double h = static_cast<double>(shape.hidden);
  const double tp = static_cast<double>(dims.tp);
  const double split_norms = dims.sequence_parallel ? tp : 1;
  const double q = static_cast<double>(shape.heads * shape.head_dim);
  const double kv = static_cast<double>((shape.kv_heads > 0 ? shape.kv_heads : shape.heads) * shape.head_dim);
  const double f = static_cast<double>(shape.mlp_hidden);
  const double inner = shape.gated_mlp ? 3 : 2;  // up (and gate) outputs and the activation's
  auto block_bytes = [&](std::int64_t block) {
    const bool moe = std::find(shape.moe_blocks.begin(), shape.moe_blocks.end(), block) != shape.moe_blocks.end();
    const double k = moe ? static_cast<double>(std::max<std::int64_t>(1, shape.experts_per_token)) : 1;
    const double norms = 2 * 4 * T * h / split_norms;
    const double attention = e * T * h + e * T * (2 * q + 2 * kv) / tp;
    const double width = moe ? static_cast<double>(shape.expert_hidden) : f;
    const double mlp = k * (e * T * h + inner * e * T * width / (moe ? 1 : tp));
    return norms + attention + mlp;
  };
  double kept = 0, largest_block = 0;
  for (std::int64_t block : model.blocks) {
    const double full = block_bytes(block);
    largest_block = std::max(largest_block, full);
    const bool checkpointed = std::find(shape.checkpointed_blocks.begin(), shape.checkpointed_blocks.end(), block) !=
                              shape.checkpointed_blocks.end();
    kept += checkpointed ? 4 * T * h / split_norms : full;
  }
  if (model.first_stage) kept += 4 * T * h;  // the embeddings' output
  const std::int64_t pipeline_rank = model.rank / (dims.world_size() / dims.pp);
  const double in_flight = static_cast<double>(micro_batches_in_flight(dims, pipeline_rank, step.micro_batches));
  const double per_stage = kept / static_cast<double>(std::max<std::int64_t>(1, model.local_stages));
  const bool any_checkpointed = !shape.checkpointed_blocks.empty();
  return in_flight * per_stage + (any_checkpointed ? largest_block : 0);
}

}  // namespace tessera::core::plan
