#include "tessera/nn/mesh_rules.hpp"

#include <string>

#include "tessera/error.hpp"

namespace tessera::nn {

void check_tensor_parallel(const TensorSplit& split, const ParallelDims& dims) {
  if (dims.tp == 1) return;
  const std::string tp = std::to_string(dims.tp);
  const auto require = [&](std::int64_t count, const std::string& field, const std::string& what) {
    if (count % dims.tp == 0) return;
    throw ConfigError(field + " (" + std::to_string(count) + ") must be divisible by parallelism.tp (" + tp +
                          "): each tensor-parallel rank holds " + field + " / tp " + what,
                      field);
  };
  require(split.heads, "n_head", "of the heads");
  if (split.kv_heads != split.heads) require(split.kv_heads, "n_kv_head", "of the key/value heads");
  if (split.mlp_units > 0) require(split.mlp_units, "intermediate_size", "of the MLP's hidden units");
  // Any vocabulary splits: the embedding and head are padded (TensorParallel::vocab_rows).
  if (split.experts && dims.sequence_parallel) {
    throw ConfigError("the experts route whole sequences, not tensor-parallel slices of them; set "
                      "parallelism.sequence_parallel: false",
                      "num_experts");
  }
}

void check_context_parallel(std::int64_t heads, double dropout, const ParallelDims& dims,
                            std::int64_t sliding_window) {
  if (dims.cp == 1) return;
  const std::string cp = std::to_string(dims.cp);
  if (sliding_window > 0) {
    throw ConfigError("sliding_window " + std::to_string(sliding_window) + " with parallelism.cp " + cp +
                          ": context-parallel attention covers the whole causal past; use cp 1 or no sliding window",
                      "sliding_window");
  }
  if (dropout > 0) {
    throw ConfigError("dropout " + std::to_string(dropout) + " with parallelism.cp " + cp +
                          ": attention across context-parallel slices has no dropout; set dropout: 0",
                      "dropout");
  }
  if (dims.cp_type == "ulysses" && (heads / dims.tp) % dims.cp != 0) {
    throw ConfigError("n_head (" + std::to_string(heads) + ") over tp " + std::to_string(dims.tp) +
                          " must be divisible by parallelism.cp (" + cp +
                          ") for ulysses attention, which splits each rank's heads over the context-parallel ranks; "
                          "use cp_type: ring",
                      "n_head");
  }
}

void check_pipeline_parallel(std::int64_t blocks, const ParallelDims& dims) {
  if (dims.pp == 1) return;
  const std::int64_t stages = dims.pp * dims.pp_stages_per_rank;
  const std::string layout =
      "pp " + std::to_string(dims.pp) + " x " + std::to_string(dims.pp_stages_per_rank) + " per rank";
  if (stages > blocks) {
    throw ConfigError(std::to_string(stages) + " pipeline stages (" + layout + ") for " + std::to_string(blocks) +
                          " blocks: every stage needs a block; lower pp or pp_stages_per_rank",
                      "n_layer");
  }
  if (!dims.pp_split_points.empty() && dims.pp_split_points.back() >= blocks) {
    throw ConfigError("parallelism.pp_split_points " + std::to_string(dims.pp_split_points.back()) +
                          " is past the last of the " + std::to_string(blocks) + " blocks",
                      "n_layer");
  }
  if (dims.pp_schedule == "interleaved_1f1b" && dims.pp_split_points.empty() && blocks % stages != 0) {
    throw ConfigError(std::to_string(blocks) + " blocks do not divide into the " + std::to_string(stages) +
                          " stages of interleaved_1f1b (" + layout + "); use a multiple of the stages, or give "
                          "pp_split_points",
                      "n_layer");
  }
}

}  // namespace tessera::nn
