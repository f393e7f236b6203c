// The bytes one rank's collectives and transfers count in a step, by group, as the trainer
// measures them (communicated_bytes/GROUP; Communicator::bytes_communicated's convention). With
// b sequences of s tokens per micro-batch, m micro-batches, T = b s / cp tokens per rank, h the
// hidden width and e the compute element size (2 under bf16 autocast, 4 in fp32):
//   trainer      24 B of token counts on the data-parallel group, 8 B (loss, norm) + 16 B
//                (non-finite flags) on the world
//   ddp          the gradients once per step (reduce_dtype), a 4-byte used-flag per tensor
//   zero1        a reduce-scatter of the gradients and an all-gather of the updated parameters
//   zero2        a reduce-scatter per micro-batch, the all-gather once
//   fsdp         per micro-batch: each block's parameters gathered twice (forward, backward; the
//                root once per step under pp), the gradients reduce-scattered; hybrid adds the
//                shards' all-reduce over dp_replicate
//   tp           per block: two all-reduces of the block's output (e T h) forward and two of the
//                norms' gradients (fp32) backward (an MoE block one of each, two with shared
//                experts); with sequence parallelism an all-gather and a
//                reduce-scatter each way instead, and the all-reduce of the replicated
//                parameters' gradients (without it, of those used on each rank's heads only:
//                per-head norms, latent attention's down projections); the embedding, the head
//                and the vocabulary-parallel loss
//                (16 B per token)
//   cp           ring: K and V passed round the ring (cp - 1 steps) forward, with their fp32
//                gradients backward; ulysses: four all-to-alls each way
//   ep           per MoE block the routed tokens' dispatch and combine each way (k rows per
//                token, none dropped) and the counts (8 B per expert)
//   muon         each hidden matrix's update (fp32) sent to its owner among the strategy's W ranks
//                (zero1, zero2, fsdp) and its orthogonalised shares sent back: two all-to-alls,
//                about 2 n / W; the owner gathers its tp-split matrices on tp (tp times the part)
//   pp           each stage boundary's activation (fp32, 64-byte header) on pp, its gradient
//                on pp_gradients; a tied embedding's gradient summed over the two ends
// Checkpointed blocks run their forward collectives again in backward (MoE blocks recompute
// their attention only).
#include <algorithm>

#include "plan_parts.hpp"

namespace tessera::core::plan {
namespace {

bool contains(const std::vector<std::int64_t>& v, std::int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

std::string group_label(const ParallelDims& dims, const std::vector<MeshAxis>& axes, std::int64_t rank) {
  const auto members = DeviceMesh::group_members(dims, axes, rank);
  if (members.size() <= 1) return "";
  if (static_cast<std::int64_t>(members.size()) == dims.world_size()) return "world";
  return DeviceMesh::group_name(dims, axes);
}

std::map<std::string, double> plan_communication(const RankModel& model, const TransformerShape& shape,
                                                 const StepFacts& step, const ParallelDims& dims) {
  std::map<std::string, double> bytes;
  if (dims.world_size() == 1) return bytes;
  auto add = [&](const std::string& group, double b) {
    if (!group.empty() && b > 0) bytes[group] += b;
  };
  const std::int64_t rank = model.rank;
  const double m = static_cast<double>(step.micro_batches);
  const std::string strategy = resolved_strategy(step, dims);

  // The trainer's own.
  add(group_label(dims, {MeshAxis::dp_replicate, MeshAxis::dp_shard}, rank), 24);
  add("world", 8 + 16);

  // The data-parallel strategy.
  const std::vector<MeshAxis> gradient_axes = {MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp};
  const bool hybrid = strategy == "fsdp" && dims.dp_replicate > 1;
  const std::string units = hybrid ? group_label(dims, {MeshAxis::dp_shard, MeshAxis::cp}, rank)
                                   : group_label(dims, gradient_axes, rank);
  std::string expert_units = units;
  if (dims.ep > 1) {
    const auto members = DeviceMesh::expert_group_members(dims, rank, /*data=*/true);
    expert_units = members.size() <= 1 ? ""
                   : static_cast<std::int64_t>(members.size()) == dims.world_size() ? "world"
                                                                                    : "expert_dp";
  }
  const double r = static_cast<double>(step.reduce_bytes), q = static_cast<double>(step.gather_bytes), s = 4;
  // Reduced and updated: the trained parameters (a frozen base has no gradients); gathered by
  // fsdp: every parameter, its frozen units too.
  const double n = model.trained_dense(), ne = model.trained_experts();
  const double all_n = model.dense, all_ne = model.experts;
  const double flags = 4 * (model.tensors - model.frozen_tensors);
  if (strategy == "ddp") {
    add(units, n * r);
    add(expert_units, ne * r);
    add(group_label(dims, gradient_axes, rank), flags);
  } else if (strategy == "zero1" || strategy == "zero2") {
    const double reductions = strategy == "zero2" ? m : 1;
    add(units, n * (reductions * r + s));
    add(expert_units, ne * (reductions * r + s));
    add(group_label(dims, gradient_axes, rank), flags);
  } else if (strategy == "fsdp") {
    const double root = all_n - model.unit_dense;
    const double root_gathers = dims.pp > 1 ? 1 : m;
    add(units, m * r * n + q * (2 * m * model.unit_dense + root_gathers * root));
    add(expert_units, m * r * ne + q * 2 * m * all_ne);
    if (hybrid) {
      const double shards = static_cast<double>(dims.dp_shard * dims.cp);
      add(group_label(dims, {MeshAxis::dp_replicate}, rank), s * (n + ne) / shards);
    }
  }
  // Muon's matrices: each one's owner in the share group of W ranks receives the shares and
  // sends them back orthogonalised (two all-to-alls, about 2 n / W a rank), and makes its own
  // matrices whole over tp.
  const bool shares_state = strategy == "zero1" || strategy == "zero2" || strategy == "fsdp";
  const double state_group = static_cast<double>(hybrid ? dims.dp_shard * dims.cp : dims.dp_replicate * dims.dp_shard * dims.cp);
  if (step.whole_matrices && shares_state) {
    add(units, 2 * s * model.matrix_dense / state_group);
    add(expert_units, 2 * s * model.matrix_experts / (state_group / static_cast<double>(dims.ep)));
  }
  if (step.whole_matrices && dims.tp > 1) {
    add(group_label(dims, {MeshAxis::tp}, rank),
        s * static_cast<double>(dims.tp) * model.matrix_tp_split / (shares_state ? state_group : 1.0));
  }
  if (dims.pp > 1 && model.tied > 0 && (model.first_stage || model.last_stage)) {
    const bool sharded = strategy == "zero1" || strategy == "zero2" || strategy == "fsdp";
    const double shards = sharded ? static_cast<double>(hybrid ? dims.dp_shard * dims.cp
                                                               : dims.dp_replicate * dims.dp_shard * dims.cp)
                                  : 1.0;
    add(dims.pp == 2 ? group_label(dims, {MeshAxis::pp}, rank) : "pp_ends", s * model.tied / shards);
  }

  // The model-parallel axes, from the model's shape.
  if (shape.hidden <= 0) return bytes;
  const double e = step.bf16 ? 2 : 4;
  const double b = static_cast<double>(step.micro_batch), seq = static_cast<double>(step.seq_len);
  const double T = b * seq / static_cast<double>(dims.cp);
  const double h = static_cast<double>(shape.hidden);
  const double tp = static_cast<double>(dims.tp);
  if (dims.tp > 1) {
    const bool sp = dims.sequence_parallel;
    double per_micro_batch = 0;
    for (std::int64_t block : model.blocks) {
      const bool moe = contains(shape.moe_blocks, block);
      // An MoE block's routed experts are whole on every rank; its shared experts split as a
      // dense MLP, with the MLP's all-reduces.
      const double mlp_reductions = moe && shape.shared_expert_hidden == 0 ? 1 : 2;
      const double forward = moe ? mlp_reductions * e * T * h : (sp ? 2 * (4 + e) * T * h : 2 * e * T * h);
      const double backward = moe ? mlp_reductions * 4 * T * h : (sp ? 2 * (4 + e) * T * h : 8 * T * h);
      per_micro_batch += forward + backward;
      if (contains(shape.checkpointed_blocks, block)) per_micro_batch += forward;
    }
    if (model.first_stage) per_micro_batch += sp ? 8 * T * h : 4 * T * h;
    if (model.last_stage) per_micro_batch += (sp ? 8 * T * h : 4 * T * h) + 16 * T;
    // Replicated parameters' gradients: all of them under sequence parallelism, else those
    // used on each rank's heads only.
    per_micro_batch += 4 * (sp ? model.tp_replicated : model.tp_shared_by_heads);
    add(group_label(dims, {MeshAxis::tp}, rank), m * per_micro_batch);
  }
  if (dims.cp > 1) {
    const double cp = static_cast<double>(dims.cp);
    const double D = static_cast<double>(shape.head_dim);
    const double kv_heads = static_cast<double>(shape.kv_heads > 0 ? shape.kv_heads : shape.heads);
    double forward = 0, backward = 0;
    if (dims.cp_type == "ulysses") {
      const bool kv_split = (static_cast<std::int64_t>(kv_heads) / dims.tp) % dims.cp == 0;
      const double kv = kv_split ? kv_heads : static_cast<double>(shape.heads);
      forward = backward = e * b * (seq / cp) * D * (2 * static_cast<double>(shape.heads) + 2 * kv) / tp;
    } else {
      const double X = b * (seq / cp) * kv_heads * D / tp;
      forward = 4 * (cp - 1) * X * e;
      backward = 4 * (cp - 1) * X * (e + 4) + 16 * X;
    }
    double per_micro_batch = 0;
    for (std::int64_t block : model.blocks) {
      per_micro_batch += forward + backward + (contains(shape.checkpointed_blocks, block) ? forward : 0);
    }
    add(group_label(dims, {MeshAxis::cp}, rank), m * per_micro_batch);
  }
  if (dims.ep > 1) {
    const double k = static_cast<double>(shape.experts_per_token);
    double per_micro_batch = 0;
    for (std::int64_t block : model.blocks) {
      if (contains(shape.moe_blocks, block)) per_micro_batch += 4 * T * k * h * e + 8 * static_cast<double>(shape.experts);
    }
    add("ep", m * per_micro_batch);
  }
  if (dims.pp > 1) {
    const double transfer = 4 * T * h / (dims.sequence_parallel ? tp : 1) + 64;
    const double transfers = m * static_cast<double>(model.stage_boundaries_in + model.stage_boundaries_out);
    add(group_label(dims, {MeshAxis::pp}, rank), transfers * transfer);
    add("pp_gradients", transfers * transfer);
  }
  return bytes;
}

}  // namespace tessera::core::plan
