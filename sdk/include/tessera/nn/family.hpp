// A decoder family as data. A family plugin states its model as a FamilySpec: the embedding (its
// scale, tied or not), the final norm, the rotary embeddings, and per block the norms (pre-norm or
// Gemma's sandwich; RMSNorm scaling by `weight` or `1 + weight`), the attention (AttentionSpec:
// heads, grouping, biases, q/k norms, window, scale, softcap, which rotary) and the feed-forward
// part (a gated MLP with its activation, or experts with their router), the init rule, the
// Hugging Face weight names and its config.json writers. FamilyDecoder builds the blocks this rank
// holds from it and derives everything else: the tensor-parallel plan (each part type knows its
// split), the transformer shape `tessera plan` reads, the whole parameter count (counted on blocks
// built on the meta device, never a formula), the FLOPs, the mixture-of-experts routing reports,
// import and export. A new family is its spec and its config table (tessera/nn/hf_fields.hpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/block.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/latent_attention.hpp"
#include "tessera/nn/rotary_decoder.hpp"

namespace tessera::nn {

struct NormSpec {
  double eps = 1e-5;
  RmsWeight weight = RmsWeight::scale;
};

struct FeedForwardSpec {
  std::string module = "mlp";       // the block's name for it (Mixtral's experts: block_sparse_moe)
  std::int64_t width = 0;           // the dense gated MLP's hidden units
  std::string activation = "silu";  // silu (SwiGLU) or gelu_tanh (GeGLU)
  // Set: SwiGLU experts of expert_width instead of the dense MLP, routed so.
  std::optional<ExpertRouting> experts;
  std::int64_t expert_width = 0;
  SwiGluExpertNames expert_names;
  std::int64_t shared_width = 0;  // the shared experts' units beside the routed ones (DeepSeek-V3's); 0: none
};

struct BlockSpec {
  NormSpec norm;
  // Gemma's four norms: the branches' outputs normalised too (post_attention_layernorm,
  // post_feedforward_layernorm), the MLP's input by pre_feedforward_layernorm.
  bool sandwich = false;
  AttentionSpec attention;
  // Set: multi-head latent attention (DeepSeek-V3's) instead of `attention`.
  std::optional<LatentAttentionSpec> latent;
  FeedForwardSpec feed_forward;
};

// Normal(0, std) for projections and embeddings, norms at their identity, biases at zero; with
// scaled_residual the residual outputs (o_proj, down_proj, experts' w2 / down_proj) at
// std / sqrt(2 · blocks) (Llama's rule in Tessera).
struct InitSpec {
  double std = 0.02;
  bool scaled_residual = true;
};

struct FamilySpec {
  DecoderSpec decoder;         // kind, vocabulary, blocks, sequence, checkpointing, losses' weights
  RotaryDecoderParts parts;    // embedding, final norm, tied head, rotary embeddings
  std::vector<BlockSpec> blocks;  // every block of the whole model, in order
  InitSpec init;
  HfWeightNames names;
  // Auxiliary-loss-free balancing (DeepSeek-V3): after each applied step every routed block's
  // correction bias moves this much towards balance, the loads summed over the ranks that route
  // different tokens (data- and context-parallel). 0: frozen.
  double bias_update_speed = 0.0;
  // Tensors of a Hugging Face checkpoint the model does not build (DeepSeek-V3's
  // multi-token-prediction layers): skipped, and said so with `why`.
  std::function<bool(const std::string& hf_name)> skipped_tensors;
  std::string why_skipped;
  // Model::architecture_json, and the Hugging Face export's config.json given the imported
  // checkpoint's special token ids (hf_fields.hpp writes both from the family's table).
  std::function<std::string()> architecture_json;
  std::function<std::string(const std::string& special_ids)> hf_config_json;
};

class TESSERA_API FamilyDecoder : public RotaryDecoderModel, public MoeRouting {
 public:
  // `hf`: init_from's Hugging Face folder, already read (null otherwise); `init_from`: a Tessera
  // export or safetensors file to load instead.
  FamilyDecoder(FamilySpec spec, const HfCheckpoint* hf, const std::string& init_from, TensorParallel tp,
                ContextParallel cp, ExpertParallel ep, const RunContext& run);

  // Block `spec` over these ranks: on the meta device when deferring (tessera/nn/deferred_init.hpp).
  static std::shared_ptr<TransformerBlock> make_block(const BlockSpec& spec, std::int64_t hidden,
                                                      const TensorParallel& tp, const ContextParallel& cp,
                                                      const ExpertParallel& ep);
  // Its splits, at `prefix` ("layers.3."): what each part type says of its own.
  static void plan_block(TensorParallelPlan& plan, const std::string& prefix, const BlockSpec& spec);

  bool exports_hugging_face() const override { return true; }
  HfModuleName hugging_face_module(const std::string& module) const override { return family_.names.module(module); }
  std::string architecture_json() const override { return family_.architecture_json(); }
  HfExport hugging_face_export(const StateDict& state) const override;
  TransformerShape transformer_shape() const override;
  void initialize_parameters(const std::vector<at::Tensor>& params) override;

  std::int64_t num_experts() const override;
  std::int64_t experts_per_token() const override;
  std::vector<RouterStatistics> take_router_statistics() override { return router_statistics(); }
  void after_optimizer_step(bool applied) override;

 private:
  // N of 6N: the whole model's parameters counted on blocks built on the meta device, less a
  // separate input embedding (a lookup) and the experts a token does not pass through.
  double flop_parameters() const;
  const BlockSpec* first_routed() const;

  FamilySpec family_;
  std::shared_ptr<Communicator> routing_group_;  // the ranks whose tokens differ
};

}  // namespace tessera::nn
