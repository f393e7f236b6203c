// Model `llama`: the Llama decoder as a family spec over the SDK's kit (tessera/nn/family.hpp):
// pre-norm blocks of RMSNorm -> grouped-query causal self-attention with rotary position
// embeddings (Hugging Face's rotate-half convention, Llama 3's scaling) -> residual, RMSNorm ->
// SwiGLU MLP -> residual; no biases; a final RMSNorm and an output head, tied to the token
// embedding or not. Imports and exports Hugging Face's LlamaForCausalLM. With num_experts,
// Mixtral: every block's MLP is a mixture of SwiGLU experts, expert-parallel over
// parallelism.ep; imports and exports MixtralForCausalLM. The same spec builds the family's other
// variants, each registered under its Hugging Face model_type: model/qwen2 (q/k/v biases, a
// sliding window), model/qwen3 (per-head q/k norms, attention_bias) and model/qwen3_moe (Qwen3's
// attention, experts under `mlp` in the routed blocks). The config and its config.json table are
// llama_config.hpp.

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/family.hpp"
#include "tessera/plugin.hpp"
#include "llama_config.hpp"

namespace {

using tessera::llama::LlamaConfig;
namespace nn = tessera::nn;

nn::FamilySpec family(const LlamaConfig& c) {
  nn::FamilySpec f = nn::FamilySpec::of(std::string("model/") + c.variant_name(), c, c);
  f.tied = c.tie_embeddings;
  f.rotaries = {{c.head_size(), c.max_seq_len, c.rope_theta, c.rope_scaling, std::nullopt}};
  f.final_norm = {c.rms_norm_eps};
  const tessera::llama::VariantFacts& facts = tessera::llama::facts_of(c.variant);
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    nn::BlockSpec block;
    block.norm = {c.rms_norm_eps};
    block.attention = {c.n_embd, c.n_head, c.kv_heads(), c.head_size(), c.any_qkv_bias(), c.attention_bias, c.dropout};
    if (c.qk_norm) block.attention.qk_norm_eps = c.rms_norm_eps;
    block.attention.sliding_window = c.window_at(i);
    block.feed_forward.width = c.mlp_size();
    if (c.routes(i)) {
      block.feed_forward.module = facts.experts_module;
      block.feed_forward.experts = c.routing();
      block.feed_forward.expert_width = c.expert_size();
      block.feed_forward.expert_names = facts.expert_names;
    }
    f.blocks.push_back(block);
  }
  nn::describe_by_table(f, tessera::llama::hf_table(), c);
  return f;
}

// The factory of every variant: `yaml` is the variant's config.
std::shared_ptr<tessera::Model> build(const LlamaConfig& yaml, const tessera::RunContext& run) {
  return nn::build_family(yaml, run, tessera::llama::settled_by_init_from, &LlamaConfig::check_mesh, &family);
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
