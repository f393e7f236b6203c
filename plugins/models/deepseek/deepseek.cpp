// Model `deepseek_v3`: DeepSeek-V3 as a family spec over the SDK's kit (tessera/nn/family.hpp).
// Pre-norm blocks of RMSNorm -> multi-head latent attention (low-rank query and key/value
// latents, a rotated key part shared by the heads, YaRN) -> residual, RMSNorm -> the first
// first_dense_blocks blocks a dense SwiGLU, the others a mixture of SwiGLU experts routed by
// sigmoid scores within the best groups, a correction bias choosing and routed scaling weighing,
// plus shared experts -> residual; a final RMSNorm and an output head. Imports and exports
// Hugging Face's DeepseekV3ForCausalLM (multi-token-prediction layers skipped and said so), and
// with bias_update_speed balances its experts without an auxiliary loss. The config and its
// config.json table are deepseek_config.hpp.

#include <cstdint>
#include <memory>
#include <string>

#include "deepseek_config.hpp"
#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/family.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::deepseek::DeepseekConfig;
namespace nn = tessera::nn;

nn::FamilySpec family(const DeepseekConfig& c) {
  nn::FamilySpec f = nn::FamilySpec::of("model/deepseek_v3", c, c);
  f.tied = c.tie_embeddings;
  f.rotaries = {{c.qk_rope_head_dim, c.max_seq_len, c.rope_theta, std::nullopt, c.yarn()}};
  f.final_norm = {c.rms_norm_eps};
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    nn::BlockSpec block;
    block.norm = {c.rms_norm_eps};
    block.latent = c.attention();
    block.feed_forward.width = c.intermediate_size;
    if (c.routes(i)) {
      block.feed_forward.experts = c.routing_options();
      block.feed_forward.expert_width = c.expert_intermediate_size;
      block.feed_forward.expert_names = {"gate", "gate_proj", "up_proj", "down_proj", "shared_experts"};
      block.feed_forward.shared_width = c.shared_experts * c.expert_intermediate_size;
    }
    f.blocks.push_back(block);
  }
  f.bias_update_speed = c.bias_update_speed;
  // Multi-token-prediction layers (model.layers.N from num_hidden_layers on) are not built.
  f.skipped_tensors = [n_layer = c.n_layer](const std::string& name) {
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return false;
    return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size())) >= n_layer;
  };
  f.why_skipped = "multi-token-prediction layers (from n_layer on); Tessera trains the next-token head only, and its "
                  "exports hold no MTP layers";
  nn::describe_by_table(f, tessera::deepseek::hf_table(), c);
  return f;
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, DeepseekConfig>(
      "deepseek_v3",
      "DeepSeek-V3 decoder (DeepseekV3ForCausalLM): multi-head latent attention, dense first blocks, then shared and "
      "routed SwiGLU experts (sigmoid scores, grouped routing, correction bias, routed scaling, auxiliary-loss-free "
      "balancing); Hugging Face import/export",
      nn::family_factory<DeepseekConfig>(tessera::deepseek::settled_by_init_from, &DeepseekConfig::check_mesh, &family));
}

}  // namespace

TESSERA_PLUGIN("model_deepseek", "0.1.0", register_components)
