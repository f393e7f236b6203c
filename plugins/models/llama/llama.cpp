// Model `llama`: the Llama decoder on the SDK's transformer kit. Pre-norm blocks of RMSNorm ->
// grouped-query causal self-attention with rotary position embeddings (Hugging Face's rotate-half
// convention, Llama 3's scaling) -> residual, RMSNorm -> SwiGLU MLP -> residual; no biases; a final
// RMSNorm and an output head, tied to the token embedding or not. Imports and exports Hugging
// Face's LlamaForCausalLM. With num_experts, Mixtral: every block's MLP is a mixture of SwiGLU
// experts (the kit's SwiGluExperts), expert-parallel over parallelism.ep; imports and exports
// MixtralForCausalLM, and reports its routing to monitors through tessera::MoeRouting. The config
// is in llama_config.hpp, the Hugging Face mapping in llama_hf_format.hpp.
// The same class builds the family's other variants, each registered under its Hugging Face
// model_type: model/qwen2 (q/k/v biases, a sliding window), model/qwen3 (per-head q/k norms,
// attention_bias) and model/qwen3_moe (Qwen3's attention, experts under `mlp` in the routed
// blocks); what differs is each block's attention spec and feed-forward choice.

#include <cmath>
#include <cstdint>
#include <tuple>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/rotary_decoder.hpp"
#include "tessera/plugin.hpp"
#include "llama_config.hpp"
#include "llama_hf_format.hpp"

namespace {

using tessera::llama::LlamaConfig;
namespace nn = tessera::nn;

nn::DecoderSpec decoder_spec(const LlamaConfig& c) {
  nn::DecoderSpec spec = nn::DecoderSpec::of(std::string("model/") + c.variant_name(), c);
  spec.attention_width = c.n_head * c.head_size();
  if (c.tie_embeddings) spec.tied_embedding = "embed_tokens.weight";
  spec.aux_loss_coef = c.aux_loss_coef;
  spec.z_loss_coef = c.z_loss_coef;
  return spec;
}

// Where a routed block's experts are, and their names: Mixtral's block_sparse_moe (gate, w1, w3,
// w2) or the Qwens' mlp (gate, gate_proj, up_proj, down_proj).
std::string moe_module(const LlamaConfig& c) {
  return c.variant == tessera::llama::Variant::llama ? "block_sparse_moe" : "mlp";
}
nn::SwiGluExpertNames expert_names(const LlamaConfig& c) {
  if (c.variant == tessera::llama::Variant::llama) return {};
  nn::SwiGluExpertNames names;
  names.gate = "gate_proj";
  names.up = "up_proj";
  names.down = "down_proj";
  return names;
}

// Block `block`'s attention: where the variants differ.
nn::AttentionSpec attention_spec(const LlamaConfig& c, std::int64_t block) {
  nn::AttentionSpec spec;
  spec.hidden = c.n_embd;
  spec.heads = c.n_head;
  spec.kv_heads = c.kv_heads();
  spec.head_dim = c.head_size();
  spec.dropout = c.dropout;
  spec.qkv_bias = c.any_qkv_bias();
  spec.output_bias = c.attention_bias;
  if (c.qk_norm) spec.qk_norm_eps = c.rms_norm_eps;
  spec.sliding_window = c.window_at(block);
  return spec;
}

nn::RotaryDecoderParts decoder_parts(const LlamaConfig& c) {
  return {c.vocab_size, c.n_embd, c.rms_norm_eps, c.tie_embeddings,
          {{c.head_size(), c.max_seq_len, c.rope_theta, c.rope_scaling, std::nullopt}}};
}

class Llama final : public nn::RotaryDecoderModel, public tessera::MoeRouting {
 public:
  // `hf`: a Hugging Face folder to take the weights from (c.init_from), already read.
  Llama(const LlamaConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp,
        tessera::ContextParallel cp, tessera::ExpertParallel ep, const tessera::RunContext& run)
      : RotaryDecoderModel(decoder_spec(c), decoder_parts(c), std::move(tp), std::move(cp), std::move(ep), run),
        config_(c) {
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const nn::AttentionSpec attention = attention_spec(c, i);
      const std::string block = "layers." + std::to_string(i) + ".";
      nn::GroupedQueryAttention::plan(plan_, block + "self_attn.", attention);
      const bool routed = c.routes(i);
      if (routed) {
        nn::SwiGluExperts::plan(plan_, block + moe_module(c) + ".", expert_names(c));
      } else {
        nn::SwiGlu::plan(plan_, block + "mlp.");
      }
      add_block(layers(), i, [&] {
        return std::make_shared<nn::TransformerBlock>(nn::BlockParts{
            {"input_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            {"self_attn", std::make_shared<nn::GroupedQueryAttention>(attention, tp_, cp_)},
            {"post_attention_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            routed ? nn::Named<nn::FeedForward>{moe_module(c),
                                                std::make_shared<nn::SwiGluExperts>(c.routing(), ep_, c.n_embd,
                                                                                    c.expert_size(), expert_names(c))}
                   : nn::Named<nn::FeedForward>{"mlp", std::make_shared<nn::SwiGlu>(c.n_embd, c.mlp_size(), false, tp_)}});
      });
    }
    finish(hf, c.init_from, tessera::llama::llama_names(), c.num_experts);
    // N counts the head (tied or not) but not a separate input embedding: a lookup costs no
    // FLOPs. Of the experts, only the k a token passes through.
    const std::int64_t idle_experts =
        c.routed_block_count() * (c.num_experts - c.top_k) * 3 * c.n_embd * c.expert_size();
    const std::int64_t whole = pp_.size() > 1 ? tessera::llama::parameter_count(c) : whole_parameters();
    set_flop_parameters(static_cast<double>(whole - (c.tie_embeddings ? 0 : c.vocab_size * c.n_embd) - idle_experts));
  }

  bool exports_hugging_face() const override { return true; }
  // LlamaForCausalLM's (and Mixtral's): everything under model. but the output head.
  tessera::HfModuleName hugging_face_module(const std::string& module) const override {
    return tessera::llama::llama_names().module(module);
  }
  std::string architecture_json() const override { return tessera::llama::architecture_json(config_); }
  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape = decoder_shape();
    shape.hidden = config_.n_embd;
    shape.heads = config_.n_head;
    shape.kv_heads = config_.kv_heads();
    shape.head_dim = config_.head_size();
    shape.mlp_hidden = config_.mlp_size();
    shape.gated_mlp = true;
    for (std::int64_t block = 0; block < config_.n_layer; ++block) {
      if (config_.routes(block)) shape.moe_blocks.push_back(block);
    }
    shape.experts = config_.num_experts;
    shape.experts_per_token = config_.mixture_of_experts() ? config_.top_k : 0;
    shape.expert_hidden = config_.expert_size();
    return shape;
  }

  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    return hf_export(state, tessera::llama::llama_names(), tessera::llama::hf_config_json(config_, special_ids()));
  }

  std::int64_t num_experts() const override { return config_.num_experts; }
  std::int64_t experts_per_token() const override { return config_.mixture_of_experts() ? config_.top_k : 0; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override { return router_statistics(); }

  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    initialize_llama_style(params, config_.init_std, config_.n_layer);
  }

 private:
  LlamaConfig config_;
};

// The factory of every variant: `yaml` is the variant's config.
std::shared_ptr<tessera::Model> build(const LlamaConfig& yaml, const tessera::RunContext& run) {
  return nn::build_decoder<Llama>(yaml, run, tessera::llama::settled_by_init_from, &LlamaConfig::check_mesh);
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, LlamaConfig>(
      "llama",
      "Llama decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU (or, with num_experts, Mixtral's "
      "mixture of SwiGLU experts); Hugging Face import/export",
      [](const LlamaConfig& yaml, const tessera::RunContext& run) { return build(yaml, run); });
  registrar.add<tessera::Model, tessera::llama::Qwen2Config>(
      "qwen2",
      "Qwen2 / Qwen2.5 decoder (Qwen2ForCausalLM): Llama's blocks with q/k/v biases and an optional sliding window; "
      "Hugging Face import/export",
      [](const tessera::llama::Qwen2Config& yaml, const tessera::RunContext& run) { return build(yaml, run); });
  registrar.add<tessera::Model, tessera::llama::Qwen3MoeConfig>(
      "qwen3_moe",
      "Qwen3-MoE decoder (Qwen3MoeForCausalLM): Qwen3's attention, SwiGLU experts in the routed blocks (moe_every, "
      "dense_blocks) with gates normalised or not; expert-parallel; Hugging Face import/export",
      [](const tessera::llama::Qwen3MoeConfig& yaml, const tessera::RunContext& run) { return build(yaml, run); });
  registrar.add<tessera::Model, tessera::llama::Qwen3Config>(
      "qwen3",
      "Qwen3 decoder (Qwen3ForCausalLM): Llama's blocks with RMSNorm on every query and key head, head_dim apart from "
      "n_embd / n_head, optional attention biases and sliding window; Hugging Face import/export",
      [](const tessera::llama::Qwen3Config& yaml, const tessera::RunContext& run) { return build(yaml, run); });
}

}  // namespace

TESSERA_PLUGIN("model_llama", "0.1.0", register_components)
