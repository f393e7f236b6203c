#include "tessera/core/run/parallelism_settings.hpp"

#include <string>

#include "tessera/error.hpp"

namespace tessera::core {

void ParallelismSettings::declare(ConfigFields<ParallelismSettings>& f) {
  using P = ParallelismSettings;
  f.field("dp_replicate", &P::dp_replicate,
          "data-parallel replicas (fsdp: hybrid sharding, each replica sharded over dp_shard ranks)")
      .at_least(1);
  f.field("dp_shard", &P::dp_shard,
          "data-parallel ranks that shard (fsdp, zero) or replicate (ddp) the model; -1: the ranks the other axes "
          "leave")
      .at_least(-1);
  f.field("tp", &P::tp, "tensor-parallel ranks: attention heads, MLP units and the vocabulary split over them")
      .at_least(1);
  f.field("cp", &P::cp, "context-parallel ranks: every sequence split over them (balanced for causal attention)")
      .at_least(1);
  f.field("cp_type", &P::cp_type,
          "how attention crosses the context-parallel slices: ring (key/value blocks passed around) or ulysses "
          "(all-to-all to head slices; heads divisible by cp)")
      .one_of({"ring", "ulysses"});
  f.field("pp", &P::pp,
          "pipeline-parallel ranks: the model's blocks cut into stages on them, the step's micro-batches streamed "
          "through")
      .at_least(1);
  f.field("pp_schedule", &P::pp_schedule,
          "with pp > 1: gpipe (every forward, then every backward), 1f1b (one forward, one backward: at most pp "
          "micro-batches' activations held) or interleaved_1f1b (pp_stages_per_rank stages per rank, a smaller bubble)")
      .one_of({"gpipe", "1f1b", "interleaved_1f1b"});
  f.field("pp_stages_per_rank", &P::pp_stages_per_rank,
          "stages each pipeline rank holds (interleaved_1f1b: every pp-th stage); 0: 2 for interleaved_1f1b, else 1")
      .at_least(0);
  f.field("pp_split_points", &P::pp_split_points,
          "the block indices that begin the stages after the first (pp x stages per rank - 1 of them, increasing); "
          "absent: stages balanced by block count");
  f.field("ep", &P::ep,
          "expert-parallel ranks, borrowed from dp_shard (which it divides): each holds num_experts / ep of every MoE "
          "layer's experts")
      .at_least(1);
  f.field("sequence_parallel", &P::sequence_parallel,
          "with tp > 1: norms, dropout and residuals on sequence slices (all-gather / reduce-scatter instead of "
          "all-reduce)");
  f.check([](const P& p) {
    if (p.dp_shard == 0) throw ConfigError("must be at least 1, or -1 for the ranks the other axes leave", "dp_shard");
    if (p.pp_schedule != "interleaved_1f1b" && p.pp_stages_per_rank > 1) {
      throw ConfigError("pp_stages_per_rank " + std::to_string(p.pp_stages_per_rank) + " needs pp_schedule: "
                        "interleaved_1f1b (" + p.pp_schedule + " runs one stage per rank)",
                        "pp_stages_per_rank");
    }
    if (!p.pp_split_points.empty()) {
      const std::int64_t stages = p.pp * (p.pp_stages_per_rank > 0 ? p.pp_stages_per_rank
                                                                   : p.pp_schedule == "interleaved_1f1b" ? 2 : 1);
      if (static_cast<std::int64_t>(p.pp_split_points.size()) != stages - 1) {
        throw ConfigError(std::to_string(p.pp_split_points.size()) + " split points for " + std::to_string(stages) +
                              " stages; give " + std::to_string(stages - 1) + " (the first block of every stage but the first)",
                          "pp_split_points");
      }
      for (std::size_t i = 0; i < p.pp_split_points.size(); ++i) {
        if (p.pp_split_points[i] < 1 || (i > 0 && p.pp_split_points[i] <= p.pp_split_points[i - 1])) {
          throw ConfigError("split points are increasing block indices of at least 1 (every stage holds a block)",
                            "pp_split_points");
        }
      }
    }
    if (p.sequence_parallel && p.tp == 1) {
      throw ConfigError("needs tp > 1 (it splits the sequence over the tensor-parallel ranks); set it to false or raise tp",
                        "sequence_parallel");
    }
  });
}

ParallelDims resolve_parallel_dims(const ParallelismSettings& s, std::int64_t world_size, bool launched) {
  ParallelDims dims;
  dims.dp_replicate = s.dp_replicate;
  dims.tp = s.tp;
  dims.cp = s.cp;
  dims.pp = s.pp;
  dims.ep = s.ep;
  dims.sequence_parallel = s.sequence_parallel;
  dims.cp_type = s.cp_type;
  dims.pp_schedule = s.pp_schedule;
  dims.pp_stages_per_rank = s.pp_stages_per_rank > 0 ? s.pp_stages_per_rank : s.pp_schedule == "interleaved_1f1b" ? 2 : 1;
  dims.pp_split_points = s.pp_split_points;
  const std::int64_t others = s.dp_replicate * s.tp * s.cp * s.pp;
  if (s.dp_shard > 0) {
    dims.dp_shard = s.dp_shard;
  } else if (!launched) {
    // A spec validated alone: the smallest mesh it describes (ep borrows dp_shard's ranks).
    dims.dp_shard = s.ep;
  } else if (world_size % others != 0) {
    throw ConfigError("-1 takes the ranks the other axes leave, but their product " + std::to_string(others) +
                          " does not divide the " + std::to_string(world_size) + " ranks of this run",
                      "dp_shard");
  } else {
    dims.dp_shard = world_size / others;
  }
  if (dims.ep > 1 && dims.dp_shard % dims.ep != 0) {
    throw ConfigError("ep " + std::to_string(dims.ep) + " borrows its ranks from dp_shard (" +
                          std::to_string(dims.dp_shard) + "), which it must divide",
                      "ep");
  }
  if (dims.ep > 1 && dims.dp_replicate > 1) {
    throw ConfigError("expert parallelism with dp_replicate " + std::to_string(dims.dp_replicate) +
                          " (hybrid sharding) is not available yet; use dp_replicate: 1",
                      "ep");
  }
  if (launched && dims.world_size() != world_size) {
    throw ConfigError("the mesh " + dims.describe() + " has " + std::to_string(dims.world_size()) +
                          " ranks but this run has " + std::to_string(world_size) +
                          "; make the product of dp_replicate, dp_shard, tp, cp and pp the number of ranks",
                      s.dp_shard > 0 ? "dp_shard" : "tp");
  }
  return dims;
}

}  // namespace tessera::core
