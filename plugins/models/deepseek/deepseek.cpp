// Model `deepseek_v3`: DeepSeek-V3 on the SDK's transformer kit. Pre-norm blocks of RMSNorm ->
// multi-head latent attention (the kit's MultiHeadLatentAttention: low-rank query and key/value
// latents, a rotated key part shared by the heads, YaRN) -> residual, RMSNorm -> the first
// first_dense_blocks blocks a dense SwiGLU, the others a mixture of SwiGLU experts routed by
// sigmoid scores within the best groups, a correction bias choosing and routed scaling weighing,
// plus shared experts -> residual; a final RMSNorm and an output head. Imports and exports
// Hugging Face's DeepseekV3ForCausalLM (multi-token-prediction layers skipped and said so), and
// with bias_update_speed balances its experts without an auxiliary loss (the correction bias moved
// after each step from the step's loads over the data- and context-parallel ranks). The config
// is in deepseek_config.hpp, the Hugging Face mapping in deepseek_hf_format.hpp.

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "deepseek_config.hpp"
#include "deepseek_hf_format.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/log.hpp"
#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/latent_attention.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/rotary_decoder.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::deepseek::DeepseekConfig;
namespace nn = tessera::nn;

nn::DecoderSpec decoder_spec(const DeepseekConfig& c) {
  nn::DecoderSpec spec = nn::DecoderSpec::of("model/deepseek_v3", c);
  // Scores over qk_head_dim, the weighted sum over v_head_dim: 12·L·W·T with W their mean.
  spec.attention_width = c.n_head * (c.qk_head_dim() + c.v_head_dim) / 2;
  if (c.tie_embeddings) spec.tied_embedding = "embed_tokens.weight";
  spec.aux_loss_coef = c.aux_loss_coef;
  spec.z_loss_coef = c.z_loss_coef;
  return spec;
}

const nn::SwiGluExpertNames kExpertNames{"gate", "gate_proj", "up_proj", "down_proj", "shared_experts"};

// The ranks whose tokens differ (data- and context-parallel): the loads are summed over them.
std::shared_ptr<tessera::Communicator> routing_group(const tessera::RunContext& run) {
  if (!run.mesh) return run.communicator;
  using tessera::MeshAxis;
  return run.mesh->group_ptr({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp});
}

nn::RotaryDecoderParts decoder_parts(const DeepseekConfig& c) {
  return {c.vocab_size, c.n_embd, c.rms_norm_eps, c.tie_embeddings,
          {{c.qk_rope_head_dim, c.max_seq_len, c.rope_theta, std::nullopt, c.yarn()}}};
}

// Multi-token-prediction layers (model.layers.N for N >= num_hidden_layers, DeepSeek-V3's
// num_nextn_predict_layers) are not built.
bool multi_token_prediction(const std::string& name, std::int64_t n_layer) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return false;
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size())) >= n_layer;
}

class DeepseekV3 final : public nn::RotaryDecoderModel, public tessera::MoeRouting {
 public:
  DeepseekV3(const DeepseekConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp,
             tessera::ContextParallel cp, tessera::ExpertParallel ep, const tessera::RunContext& run)
      : RotaryDecoderModel(decoder_spec(c), decoder_parts(c), std::move(tp), std::move(cp), std::move(ep), run),
        config_(c),
        routing_group_(routing_group(run)) {
    const nn::LatentAttentionSpec attention = c.attention();
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const std::string block = "layers." + std::to_string(i) + ".";
      nn::MultiHeadLatentAttention::plan(plan_, block + "self_attn.", attention);
      if (c.routes(i)) {
        nn::SwiGluExperts::plan(plan_, block + "mlp.", kExpertNames, /*shared=*/c.shared_experts > 0);
      } else {
        nn::SwiGlu::plan(plan_, block + "mlp.");
      }
      add_block(layers(), i, [&]() -> std::shared_ptr<nn::TransformerBlock> {
        std::shared_ptr<nn::FeedForward> mlp;
        if (c.routes(i)) {
          mlp = std::make_shared<nn::SwiGluExperts>(c.routing_options(), ep_, c.n_embd, c.expert_intermediate_size,
                                                    kExpertNames, c.shared_experts * c.expert_intermediate_size, tp_);
        } else {
          mlp = std::make_shared<nn::SwiGlu>(c.n_embd, c.intermediate_size, false, tp_);
        }
        return std::make_shared<nn::TransformerBlock>(nn::BlockParts{
            {"input_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            {"self_attn", std::make_shared<nn::MultiHeadLatentAttention>(attention, tp_, cp_)},
            {"post_attention_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            {"mlp", mlp}});
      });
    }
    if (hf) say_skipped_multi_token_prediction(*hf);
    finish(hf, c.init_from, tessera::deepseek::deepseek_names(), c.num_experts,
           [&](const std::string& name) { return multi_token_prediction(name, c.n_layer); });
    // N counts the head (tied or not) but not a separate input embedding; of the routed experts
    // only the k a token passes through.
    const std::int64_t idle = c.routed_blocks() * (c.num_experts - c.top_k) * 3 * c.n_embd * c.expert_intermediate_size;
    const std::int64_t whole = pp_.size() > 1 ? tessera::deepseek::parameter_count(c) : whole_parameters();
    set_flop_parameters(static_cast<double>(whole - (c.tie_embeddings ? 0 : c.vocab_size * c.n_embd) - idle));
  }

  bool exports_hugging_face() const override { return true; }
  tessera::HfModuleName hugging_face_module(const std::string& module) const override {
    return tessera::deepseek::deepseek_names().module(module);
  }
  std::string architecture_json() const override { return tessera::deepseek::architecture_json(config_); }
  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape = decoder_shape();
    shape.hidden = config_.n_embd;
    shape.heads = config_.n_head;
    shape.kv_heads = config_.n_head;
    shape.head_dim = config_.qk_head_dim();
    shape.mlp_hidden = config_.intermediate_size;
    shape.gated_mlp = true;
    for (std::int64_t block = 0; block < config_.n_layer; ++block) {
      if (config_.routes(block)) shape.moe_blocks.push_back(block);
    }
    shape.experts = config_.num_experts;
    shape.experts_per_token = config_.top_k;
    shape.expert_hidden = config_.expert_intermediate_size;
    shape.shared_expert_hidden = config_.shared_experts * config_.expert_intermediate_size;
    return shape;
  }
  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    return hf_export(state, tessera::deepseek::deepseek_names(), tessera::deepseek::hf_config_json(config_, special_ids()));
  }

  std::int64_t num_experts() const override { return config_.num_experts; }
  std::int64_t experts_per_token() const override { return config_.top_k; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override { return router_statistics(); }

  // Auxiliary-loss-free balancing: each routed block's correction bias from the step's loads.
  void after_optimizer_step(bool applied) override {
    if (config_.bias_update_speed <= 0) return;
    for (nn::MoeLayer* layer : moe_layers()) {
      layer->balance_by_bias(applied ? config_.bias_update_speed : 0.0, routing_group_.get());
    }
  }

  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    initialize_llama_style(params, config_.init_std, config_.n_layer);
  }

 private:
  void say_skipped_multi_token_prediction(const tessera::HfCheckpoint& hf) const {
    std::int64_t skipped = 0;
    for (const auto& [name, tensor] : hf.tensors) skipped += multi_token_prediction(name, config_.n_layer);
    if (skipped == 0) return;
    tessera::log::warn("model/deepseek_v3: skipped ", skipped, " multi-token-prediction tensors of ", hf.folder,
                       " (layers from ", config_.n_layer,
                       " on); Tessera trains the next-token head only, and its exports hold no MTP layers");
  }

  DeepseekConfig config_;
  std::shared_ptr<tessera::Communicator> routing_group_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, DeepseekConfig>(
      "deepseek_v3",
      "DeepSeek-V3 decoder (DeepseekV3ForCausalLM): multi-head latent attention, dense first blocks, then shared and "
      "routed SwiGLU experts (sigmoid scores, grouped routing, correction bias, routed scaling, auxiliary-loss-free "
      "balancing); Hugging Face import/export",
      [](const DeepseekConfig& yaml, const tessera::RunContext& run) {
        return nn::build_decoder<DeepseekV3>(yaml, run, tessera::deepseek::settled_by_init_from,
                                             &DeepseekConfig::check_mesh);
      });
}

}  // namespace

TESSERA_PLUGIN("model_deepseek", "0.1.0", register_components)
