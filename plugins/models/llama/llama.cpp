// Model `llama`: the Llama decoder on the SDK's transformer kit. Pre-norm blocks of RMSNorm ->
// grouped-query causal self-attention with rotary position embeddings (Hugging Face's rotate-half
// convention, Llama 3's scaling) -> residual, RMSNorm -> SwiGLU MLP -> residual; no biases; a final
// RMSNorm and an output head, tied to the token embedding or not. Imports and exports Hugging
// Face's LlamaForCausalLM. With num_experts, Mixtral: every block's MLP is a mixture of SwiGLU
// experts (the kit's SwiGluExperts), expert-parallel over parallelism.ep; imports and exports
// MixtralForCausalLM, and reports its routing to monitors through tessera::MoeRouting. The config
// and the Hugging Face mapping are in llama_config.hpp.
// The same class builds the family's other variants, each registered under its Hugging Face
// model_type: model/qwen2 (q/k/v biases, a sliding window) and model/qwen3 (per-head q/k norms,
// attention_bias); what differs is the attention spec of each block.

#include <cmath>
#include <cstdint>
#include <tuple>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/decoder.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/parameters.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/nn/weight_names.hpp"
#include "tessera/plugin.hpp"
#include "llama_config.hpp"

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

class Llama final : public nn::DecoderModel, public tessera::MoeRouting {
 public:
  // `hf`: a Hugging Face Llama folder to take the weights from (c.init_from), already read.
  // The embedding on the first pipeline stage (and on the last when tied), the final norm and
  // the head on the last.
  Llama(const LlamaConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp,
        tessera::ContextParallel cp, tessera::ExpertParallel ep, const tessera::RunContext& run)
      : DecoderModel(decoder_spec(c), std::move(tp), std::move(cp), std::move(ep), run),
        config_(c),
        rotary_({c.head_size(), c.max_seq_len, c.rope_theta, c.rope_scaling}) {
    if (pp_.holds_first_stage() || (c.tie_embeddings && pp_.holds_last_stage())) {
      embed_tokens_ = register_module("embed_tokens", std::make_shared<nn::Embedding>(tp_.local(c.vocab_size), c.n_embd));
    }
    auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const nn::AttentionSpec attention = attention_spec(c, i);
      const std::string block = "layers." + std::to_string(i) + ".";
      nn::GroupedQueryAttention::plan(plan_, block + "self_attn.", attention);
      if (c.mixture_of_experts()) {
        nn::SwiGluExperts::plan(plan_, block + "block_sparse_moe.");
      } else {
        nn::SwiGlu::plan(plan_, block + "mlp.");
      }
      add_block(*layers, i, [&] {
        return std::make_shared<nn::TransformerBlock>(nn::BlockParts{
            {"input_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            {"self_attn", std::make_shared<nn::GroupedQueryAttention>(attention, tp_, cp_)},
            {"post_attention_layernorm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_)},
            c.mixture_of_experts()
                ? nn::Named<nn::FeedForward>{"block_sparse_moe", std::make_shared<nn::SwiGluExperts>(
                                                                     c.routing(), ep_, c.n_embd, c.mlp_size())}
                : nn::Named<nn::FeedForward>{"mlp", std::make_shared<nn::SwiGlu>(c.n_embd, c.mlp_size(), false, tp_)}});
      });
    }
    plan_["embed_tokens.weight"] = tessera::TensorShard::vocabulary();
    plan_["lm_head.weight"] = tessera::TensorShard::vocabulary();
    if (pp_.holds_last_stage()) {
      norm_ = register_module("norm", std::make_shared<nn::RmsNorm>(c.n_embd, c.rms_norm_eps, tp_));
      if (!c.tie_embeddings) {
        // Not adaptable: the loss reads the head's weight directly (Model::output_head).
        lm_head_ = register_module("lm_head",
                                   std::make_shared<tessera::Linear>(c.n_embd, tp_.local(c.vocab_size), false, false));
      }
    }
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    if (hf) {
      import_weights(*hf);
      tokenizer_files_ = hf->tokenizer_files;
      special_ids_ = tessera::hf_import::special_token_ids(hf->config);
    } else if (!c.init_from.empty()) {
      tessera::hf_import::load_tessera_weights(*this, c.init_from, plan_, tp_, ep_, /*partial=*/pp_.size() > 1);
    }
    // N counts the head (tied or not) but not a separate input embedding: a lookup costs no
    // FLOPs. Of the experts, only the k a token passes through.
    const std::int64_t idle_experts =
        c.mixture_of_experts() ? c.n_layer * (c.num_experts - c.top_k) * 3 * c.n_embd * c.mlp_size() : 0;
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
    for (std::int64_t block = 0; block < config_.n_layer && config_.mixture_of_experts(); ++block) {
      shape.moe_blocks.push_back(block);
    }
    shape.experts = config_.num_experts;
    shape.experts_per_token = config_.mixture_of_experts() ? config_.top_k : 0;
    shape.expert_hidden = config_.mlp_size();
    return shape;
  }

  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    tessera::HfExport out;
    out.config_json = tessera::llama::hf_config_json(config_, special_ids_);
    out.tensors = tessera::llama::llama_names().export_tensors(state);
    out.files_to_copy = tokenizer_files_;
    return out;
  }

  std::int64_t num_experts() const override { return config_.num_experts; }
  std::int64_t experts_per_token() const override { return config_.mixture_of_experts() ? config_.top_k : 0; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override { return router_statistics(); }

  // Llama init: normal(0, init_std) for projections and embeddings, the residual outputs (o_proj,
  // down_proj, the experts' w2) scaled by 1/sqrt(2 n_layer), ones for the norms.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    const double init_std = config_.init_std;
    const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
    nn::initialize_parameters(
        *this, spec_.kind, params, init_seed_,
        [=](const std::string& name) {
          if (name.find("norm.") != std::string::npos) return nn::InitialValue::constant(1.0);
          if (nn::ends_with(name, ".bias")) return nn::InitialValue::constant(0.0);
          const bool residual = name.find("o_proj.") != std::string::npos ||
                                name.find("down_proj.") != std::string::npos || name.find(".w2.") != std::string::npos;
          return nn::InitialValue::normal_with_std(residual ? residual_std : init_std);
        },
        plan_, tp_, ep_);
  }

 protected:
  // The token embedding: under context parallelism this rank's slice of every sequence; under
  // sequence parallelism the residual stream is its tensor-parallel slice of that.
  at::Tensor embed(const at::Tensor& input_ids, const nn::ForwardInputs&) override {
    return tp_.vocab_embedding(cp_.slice(input_ids), embed_tokens_->weight);
  }

  // The rotary tables at this rank's positions, in the compute dtype.
  void complete_inputs(nn::ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) override {
    std::tie(inputs.attention.cos, inputs.attention.sin) = rotary_.tables_for(input_ids.size(1), inputs.positions, stream);
  }

  at::Tensor final_norm(const at::Tensor& x) override { return norm_->forward(x); }
  at::Tensor head_weight() override { return config_.tie_embeddings ? embed_tokens_->weight : lm_head_->weight; }

 private:
  // A tied checkpoint may still store the head; it must be the embedding. Rotary tables some
  // converters store with every layer are derived, not weights.
  void import_weights(const tessera::HfCheckpoint& hf) {
    const bool tied = config_.tie_embeddings;
    if (tied) {
      nn::check_tied_head(hf, "lm_head.weight", "model.embed_tokens.weight", ", but the model ties them (tie_embeddings)");
    }
    nn::import_hf_weights(hf, *this, tessera::llama::llama_names(), plan_, tp_, ep_, config_.num_experts,
                          /*partial=*/pp_.size() > 1, [tied](const std::string& name) {
                            return (tied && name == "lm_head.weight") ||
                                   name.find("rotary_emb.inv_freq") != std::string::npos;
                          });
  }

  LlamaConfig config_;
  nn::RotaryEmbedding rotary_;  // derived from the config: neither parameters nor state
  std::shared_ptr<nn::Embedding> embed_tokens_;
  std::shared_ptr<nn::RmsNorm> norm_;
  std::shared_ptr<tessera::Linear> lm_head_;  // null when tied
  std::vector<std::string> tokenizer_files_;
  std::string special_ids_;  // the imported config.json's bos/eos/pad ids, for the export
};

// The factory of every variant: `yaml` is the variant's config.
std::shared_ptr<tessera::Model> build(const LlamaConfig& yaml, const tessera::RunContext& run) {
  const tessera::TensorParallel tp = tessera::TensorParallel::of(run);
  const tessera::ContextParallel cp = tessera::ContextParallel::of(run);
  const tessera::ExpertParallel ep = tessera::ExpertParallel::of(run);
  // What init_from's config.json settles, checked against the mesh as validate checked it.
  const LlamaConfig c = tessera::llama::settled_by_init_from(yaml);
  LlamaConfig::check_mesh(c, run, yaml);
  // Weights read from files at construction: built whole.
  std::optional<tessera::DeferredInitSuspension> whole;
  if (!yaml.init_from.empty()) whole.emplace();
  if (!tessera::is_hf_checkpoint(yaml.init_from)) return std::make_shared<Llama>(c, nullptr, tp, cp, ep, run);
  const tessera::HfCheckpoint hf =
      tessera::hf_import::at_init_from([&] { return tessera::read_hf_checkpoint(yaml.init_from); });
  return std::make_shared<Llama>(c, &hf, tp, cp, ep, run);
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
  registrar.add<tessera::Model, tessera::llama::Qwen3Config>(
      "qwen3",
      "Qwen3 decoder (Qwen3ForCausalLM): Llama's blocks with RMSNorm on every query and key head, head_dim apart from "
      "n_embd / n_head, optional attention biases and sliding window; Hugging Face import/export",
      [](const tessera::llama::Qwen3Config& yaml, const tessera::RunContext& run) { return build(yaml, run); });
}

}  // namespace

TESSERA_PLUGIN("model_llama", "0.1.0", register_components)
