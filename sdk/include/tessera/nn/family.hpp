// A decoder family as data. A family plugin states its model as a FamilySpec: the embedding (its
// names, a learned position table or rotary embeddings, a scale, tied to the head or not), the
// final norm, and per block the norms (pre-norm or Gemma's sandwich; RMSNorm scaling by `weight`
// or `1 + weight`, or LayerNorm), the attention (AttentionSpec: heads, grouping, biases, q/k
// norms, window, scale, softcap, which rotary; GPT-2's fused q|k|v; or latent attention) and the
// feed-forward part (a gated MLP with its activation, a plain GELU MLP, or experts with their
// router), the init rule, the Hugging Face weight names and its config.json writers.
// FamilyDecoder builds the blocks this rank holds from it and derives everything else: the
// tensor-parallel plan (each part type knows its split), the transformer shape `tessera plan`
// reads, the whole parameter count (counted on parts built on the meta device, never a formula),
// the FLOPs, the mixture-of-experts routing reports and balancing, import and export. A new
// family is its spec and its config table (tessera/nn/hf_fields.hpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/block.hpp"
#include "tessera/nn/decoder.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/latent_attention.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera::nn {

struct NormSpec {
  double eps = 1e-5;
  RmsWeight weight = RmsWeight::scale;
  bool layer_norm = false;  // LayerNorm (GPT-2's) instead of RMSNorm
  bool bias = false;        // the LayerNorm's
};

struct FeedForwardSpec {
  std::string module = "mlp";  // the block's name for it (Mixtral's experts: block_sparse_moe)
  std::int64_t width = 0;      // the dense MLP's hidden units
  // gated: act(gate_proj(x)) * up_proj(x) with silu (SwiGLU) or gelu_tanh (GeGLU); else GPT-2's
  // c_fc -> gelu or gelu_tanh -> c_proj.
  bool gated = true;
  std::string activation = "silu";
  bool bias = false;     // the plain MLP's and its experts' biases
  double dropout = 0.0;  // of the plain MLP's output, the residual branch's
  // Set: experts of expert_width instead of the dense MLP, routed so (SwiGLU experts when gated,
  // GELU experts otherwise).
  std::optional<ExpertRouting> experts;
  std::int64_t expert_width = 0;
  SwiGluExpertNames expert_names;
  std::int64_t shared_width = 0;  // the shared experts' units beside the routed ones (DeepSeek-V3's); 0: none
};

// A block's parts' names: Llama's, or GPT-2's ln_1 / attn / ln_2; in a sandwich Gemma's (the
// MLP's input norm is then pre_feedforward_layernorm, post_attention_layernorm the attention's
// output norm).
struct BlockNames {
  std::string attention_norm = "input_layernorm";
  std::string attention = "self_attn";
  std::string mlp_norm = "post_attention_layernorm";
  std::string sandwich_mlp_norm = "pre_feedforward_layernorm";
  std::string attention_post_norm = "post_attention_layernorm";
  std::string mlp_post_norm = "post_feedforward_layernorm";
};

struct BlockSpec {
  NormSpec norm;
  // Gemma's four norms: the branches' outputs normalised too (post_attention_layernorm,
  // post_feedforward_layernorm), the MLP's input by pre_feedforward_layernorm.
  bool sandwich = false;
  BlockNames names;
  AttentionSpec attention;
  bool fused_qkv = false;  // GPT-2's one c_attn (heads, qkv_bias and dropout from `attention`)
  // Set: multi-head latent attention (DeepSeek-V3's) instead of `attention`.
  std::optional<LatentAttentionSpec> latent;
  FeedForwardSpec feed_forward;
};

// The model's own module names (its checkpoints'; Hugging Face's through FamilySpec::names).
struct LayoutNames {
  std::string embedding = "embed_tokens";
  std::string positions;  // a learned position table (GPT-2's wpe); empty: none
  std::string layers = "layers";
  std::string final_norm = "norm";
  std::string head = "lm_head";  // an untied head's
};

// Normal(0, std) for projections and embeddings, norms at their identity, biases at zero; with
// scaled_residual the residual outputs (o_proj, down_proj, c_proj, experts' w2) at
// std / sqrt(2 · blocks) (GPT-2's and Llama's rule in Tessera).
struct InitSpec {
  double std = 0.02;
  bool scaled_residual = true;
};

struct FamilySpec {
  // The spec's decoder, width and init scale from a config's decoder fields.
  static FamilySpec of(const std::string& kind, const DecoderFields& fields) {
    FamilySpec f;
    f.decoder = DecoderSpec::of(kind, fields);
    f.hidden = fields.n_embd;
    f.init.std = fields.init_std;
    return f;
  }
  // The same for a family with experts: their losses' weights too.
  static FamilySpec of(const std::string& kind, const DecoderFields& fields, const MoeFields& routing) {
    FamilySpec f = of(kind, fields);
    f.decoder.aux_loss_coef = routing.aux_loss_coef;
    f.decoder.z_loss_coef = routing.z_loss_coef;
    return f;
  }

  DecoderSpec decoder;  // kind, vocabulary, blocks, sequence, checkpointing, losses' weights
  std::int64_t hidden = 0;
  LayoutNames layout;
  bool tied = false;                // the head is the token embedding
  double embedding_scale = 1.0;     // Gemma: sqrt(hidden), rounded to the weight's dtype
  double embedding_dropout = 0.0;   // GPT-2's, on the residual stream after the embeddings
  // The rotary embeddings the blocks' attention reads (AttentionSpec::rotary indexes them).
  std::vector<RotarySpec> rotaries;
  NormSpec final_norm;
  std::vector<BlockSpec> blocks;  // every block of the whole model, in order
  InitSpec init;
  HfWeightNames names = HfWeightNames::causal_lm();
  // The names of a checkpoint's tensors where files differ (published GPT-2 files lack
  // `transformer.`); unset: `names`.
  std::function<HfWeightNames(const HfCheckpoint&)> names_in;
  // Auxiliary-loss-free balancing (DeepSeek-V3): after each applied step every routed block's
  // correction bias moves this much towards balance, the loads summed over the ranks that route
  // different tokens (data- and context-parallel). 0: frozen.
  double bias_update_speed = 0.0;
  // Tensors of a Hugging Face checkpoint that are not the model's (causal-mask buffers, DeepSeek's
  // multi-token-prediction layers): skipped, and said so with `why_skipped` where it is set.
  std::function<bool(const std::string& hf_name)> skipped_tensors;
  std::string why_skipped;
  // Model::architecture_json, and the Hugging Face export's config.json given the imported
  // checkpoint's special token ids (describe_by_table writes both from the family's table);
  // hf_config_json unset: no Hugging Face export.
  std::function<std::string()> architecture_json;
  std::function<std::string(const std::string& special_ids)> hf_config_json;
};

class TESSERA_API FamilyDecoder : public DecoderModel, public MoeRouting {
 public:
  // `hf`: init_from's Hugging Face folder, already read (null otherwise); `init_from`: a Tessera
  // export or safetensors file to load instead.
  FamilyDecoder(FamilySpec spec, const HfCheckpoint* hf, const std::string& init_from, TensorParallel tp,
                ContextParallel cp, ExpertParallel ep, const RunContext& run);

  bool exports_hugging_face() const override { return static_cast<bool>(family_.hf_config_json); }
  HfModuleName hugging_face_module(const std::string& module) const override { return family_.names.module(module); }
  std::string architecture_json() const override { return family_.architecture_json(); }
  HfExport hugging_face_export(const StateDict& state) const override;
  TransformerShape transformer_shape() const override;
  void initialize_parameters(const std::vector<at::Tensor>& params) override;

  std::int64_t num_experts() const override;
  std::int64_t experts_per_token() const override;
  std::vector<RouterStatistics> take_router_statistics() override { return router_statistics(); }
  void after_optimizer_step(bool applied) override;

 protected:
  at::Tensor embed(const at::Tensor& input_ids, const ForwardInputs& inputs) override;
  void complete_inputs(ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) override;
  at::Tensor final_norm(const at::Tensor& x) override { return final_norm_->forward(x); }
  at::Tensor head_weight() override { return family_.tied ? embedding_->weight : head_->weight; }

 private:
  // The initial weights, then `hf`'s or init_from's.
  void load(const HfCheckpoint* hf, const std::string& init_from);
  // N of 6N: the whole model's parameters counted on parts built on the meta device, less a
  // separate input embedding and a position table (lookups) and the experts a token does not
  // pass through.
  double flop_parameters() const;
  const BlockSpec* first_routed() const;

  FamilySpec family_;
  std::vector<RotaryEmbedding> rotaries_;  // derived from the spec: neither parameters nor state
  std::shared_ptr<Embedding> embedding_, positions_;
  std::shared_ptr<torch::nn::Module> layers_;
  std::shared_ptr<Norm> final_norm_;
  std::shared_ptr<Linear> head_;  // null when tied
  std::map<std::string, double> norm_start_;  // each norm parameter's identity (1, or 0 for 1 + weight; biases 0)
  std::shared_ptr<Communicator> routing_group_;  // the ranks whose tokens differ
  double embedding_scale_ = 1.0;  // the spec's, rounded to the embedding's dtype once
  std::vector<std::string> tokenizer_files_;
  std::string special_ids_;
};

}  // namespace tessera::nn
