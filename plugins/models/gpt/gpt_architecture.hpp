// The architecture fields model/gpt and model/gpt_moe share, declared once for both (header
// only, included by relative path): sizes, dropout, biases and the init scale of a GPT-2 style
// decoder. Each model's config derives from GptArchitecture and adds its own fields.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config_fields.hpp"
#include "tessera/activation_checkpoint.hpp"
#include "tessera/model.hpp"
#include "tessera/error.hpp"
#include "tessera/parallel/parallel_dims.hpp"

namespace tessera::gpt_parts {

struct GptArchitecture {
  std::int64_t vocab_size = 256;
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  std::int64_t max_seq_len = 256;
  double dropout = 0.0;
  bool bias = true;
  double init_std = 0.02;
  // Blocks recompute their activations in backward instead of keeping them: every
  // activation_checkpointing_every-th block (0, k, 2k, ...) when on.
  bool activation_checkpointing = false;
  std::int64_t activation_checkpointing_every = 1;

  std::int64_t head_dim() const { return n_embd / n_head; }
};

// What tensor parallelism needs of the sizes: heads and vocabulary rows divide over the ranks
// (the MLP's 4 x n_embd units then do too). Checked at validation and again once init_from has
// settled the sizes.
// `from_checkpoint`: the sizes came from init_from's weights, whose vocabulary cannot be padded.
inline void check_tensor_parallel(const GptArchitecture& c, const ParallelDims& dims, bool from_checkpoint = false) {
  if (dims.tp == 1) return;
  const std::string tp = std::to_string(dims.tp);
  if (c.n_head % dims.tp != 0) {
    throw ConfigError("n_head (" + std::to_string(c.n_head) + ") must be divisible by parallelism.tp (" + tp +
                          "): each tensor-parallel rank computes n_head / tp of the heads",
                      "n_head");
  }
  if (c.vocab_size % dims.tp != 0) {
    const std::int64_t padded = (c.vocab_size + dims.tp - 1) / dims.tp * dims.tp;
    throw ConfigError("vocab_size (" + std::to_string(c.vocab_size) + ") must be divisible by parallelism.tp (" + tp +
                          "): each tensor-parallel rank holds vocab_size / tp rows of the embedding and the head; " +
                          (from_checkpoint ? std::string("init_from's weights have that many rows; use a tp that divides it")
                                           : "pad it (vocab_size: " + std::to_string(padded) + ")"),
                      "vocab_size");
  }
}

// What context parallelism needs: no dropout (attention across slices has none), and with
// Ulysses the heads of a tensor-parallel rank divide over the context-parallel ranks.
inline void check_context_parallel(std::int64_t heads, std::int64_t kv_heads, double dropout, const ParallelDims& dims) {
  if (dims.cp == 1) return;
  const std::string cp = std::to_string(dims.cp);
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
  (void)kv_heads;  // too few key/value heads are replicated for the exchange, and the log says so
}

// What pipeline parallelism needs of the blocks: every stage holds one (or the split points fall
// inside the model), and an interleaved schedule's stages share the blocks evenly.
inline void check_pipeline_parallel(std::int64_t blocks, const ParallelDims& dims) {
  if (dims.pp == 1) return;
  const std::int64_t stages = dims.pp * dims.pp_stages_per_rank;
  if (stages > blocks) {
    throw ConfigError(std::to_string(stages) + " pipeline stages (pp " + std::to_string(dims.pp) + " x " +
                          std::to_string(dims.pp_stages_per_rank) + " per rank) for " + std::to_string(blocks) +
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
                          " stages of interleaved_1f1b (pp " + std::to_string(dims.pp) + " x " +
                          std::to_string(dims.pp_stages_per_rank) +
                          " per rank); use a multiple of the stages, or give pp_split_points",
                      "n_layer");
  }
}

// The mesh rules on a model's settled sizes (`from_checkpoint`: some came from init_from).
template <class Config>
void check_mesh(const Config& c, const RunContext& run, bool from_checkpoint = false) {
  check_tensor_parallel(c, run.parallel, from_checkpoint);
  check_context_parallel(c.n_head, c.n_head, c.dropout, run.parallel);
  check_pipeline_parallel(c.n_layer, run.parallel);
}

// What dropout and biases cover differs between the models; the docs say so.
struct ArchitectureDocs {
  const char* dropout;
  const char* bias;
};

template <class Config>
void declare_gpt_architecture(ConfigFields<Config>& f, const ArchitectureDocs& docs) {
  using A = GptArchitecture;
  f.field("vocab_size", &A::vocab_size, "number of token ids").at_least(1);
  f.field("n_layer", &A::n_layer, "transformer blocks").at_least(1);
  f.field("n_head", &A::n_head, "attention heads per block").at_least(1);
  f.field("n_embd", &A::n_embd, "width of the residual stream (divisible by n_head)").at_least(1);
  f.field("max_seq_len", &A::max_seq_len, "longest sequence (size of the position embedding)").at_least(1);
  f.field("dropout", &A::dropout, docs.dropout).at_least(0).less_than(1);
  f.field("bias", &A::bias, docs.bias);
  f.field("init_std", &A::init_std, "standard deviation of the normal weight init").greater_than(0);
  f.field("activation_checkpointing", &A::activation_checkpointing,
          "recompute block activations in backward instead of keeping them (less memory, about a third more compute)");
  f.field("activation_checkpointing_every", &A::activation_checkpointing_every,
          "with activation_checkpointing: checkpoint blocks 0, k, 2k, ... (1: every block)")
      .at_least(1);
  f.splits_over(MeshAxis::tp);
  f.splits_over(MeshAxis::cp);
  f.splits_over(MeshAxis::pp);
  f.check([](const Config& c) {
    if (c.n_embd % c.n_head != 0) {
      throw ConfigError("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
                            std::to_string(c.n_head) + ")",
                        "n_embd");
    }
  });
}

// The shape tessera plan reads (Model::transformer_shape): a GPT-2 block's attention and its
// 4 x n_embd MLP; gpt_moe adds its experts.
inline TransformerShape transformer_shape(const GptArchitecture& c) {
  TransformerShape shape;
  shape.hidden = c.n_embd;
  shape.blocks = c.n_layer;
  shape.heads = c.n_head;
  shape.kv_heads = c.n_head;
  shape.head_dim = c.head_dim();
  shape.mlp_hidden = 4 * c.n_embd;
  for (std::int64_t block = 0; block < c.n_layer; ++block) {
    if (checkpoints_block(c.activation_checkpointing, c.activation_checkpointing_every, block)) {
      shape.checkpointed_blocks.push_back(block);
    }
  }
  return shape;
}

}  // namespace tessera::gpt_parts
