#include "tessera/nn/rotary_decoder.hpp"

#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {

RotaryDecoderModel::RotaryDecoderModel(DecoderSpec spec, const RotaryDecoderParts& parts, TensorParallel tp,
                                       ContextParallel cp, ExpertParallel ep, const RunContext& run)
    : DecoderModel(std::move(spec), std::move(tp), std::move(cp), std::move(ep), run),
      parts_(parts),
      rotaries_(parts.rotaries.begin(), parts.rotaries.end()) {
  if (pp_.holds_first_stage() || (parts.tied && pp_.holds_last_stage())) {
    embed_tokens_ =
        register_module("embed_tokens", std::make_shared<Embedding>(tp_.vocab_rows(parts.vocab_size, spec_.vocab_multiple), parts.hidden));
  }
  layers_ = register_module("layers", std::make_shared<torch::nn::Module>());
}

void RotaryDecoderModel::finish(const HfCheckpoint* hf, const std::string& init_from, const HfWeightNames& names,
                                std::int64_t num_experts, const std::function<bool(const std::string&)>& also_ignored) {
  plan_["embed_tokens.weight"] = TensorShard::vocabulary(parts_.vocab_size, spec_.vocab_multiple);
  plan_["lm_head.weight"] = TensorShard::vocabulary(parts_.vocab_size, spec_.vocab_multiple);
  if (pp_.holds_last_stage()) {
    norm_ = register_module(
        "norm", std::make_shared<RmsNorm>(parts_.hidden, parts_.norm_eps, tp_, NormOver::stream, parts_.norm_weight));
    if (!parts_.tied) {
      // Not adaptable: the loss reads the head's weight directly (Model::output_head).
      lm_head_ = register_module(
          "lm_head", std::make_shared<Linear>(parts_.hidden, tp_.vocab_rows(parts_.vocab_size, spec_.vocab_multiple), false, false));
    }
  }
  if (!has_deferred_parameters()) initialize_parameters(parameters());
  if (hf) {
    // A tied checkpoint may still store the head; it must be the embedding. Rotary tables some
    // converters store with every layer are derived, not weights.
    const bool tied = parts_.tied;
    if (tied) {
      check_tied_head(*hf, names.hf_name("lm_head.weight"), names.hf_name("embed_tokens.weight"),
                      ", but the model ties them (tie_embeddings)");
    }
    const std::string head = names.hf_name("lm_head.weight");
    import_hf_weights(*hf, *this, names, plan_, tp_, ep_, num_experts, /*partial=*/pp_.size() > 1,
                      [&](const std::string& name) {
                        return (tied && name == head) || name.find("rotary_emb.inv_freq") != std::string::npos ||
                               (also_ignored && also_ignored(name));
                      });
    tokenizer_files_ = hf->tokenizer_files;
    special_ids_ = hf_import::special_token_ids(hf->config);
  } else if (!init_from.empty()) {
    hf_import::load_tessera_weights(*this, init_from, plan_, tp_, ep_, /*partial=*/pp_.size() > 1);
  }
}

HfExport RotaryDecoderModel::hf_export(const StateDict& state, const HfWeightNames& names,
                                       std::string config_json) const {
  HfExport out;
  out.config_json = std::move(config_json);
  out.tensors = names.export_tensors(state);
  out.files_to_copy = tokenizer_files_;
  return out;
}

void RotaryDecoderModel::initialize_llama_style(const std::vector<at::Tensor>& params, double init_std,
                                                std::int64_t n_layer) {
  const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(n_layer));
  nn::initialize_parameters(
      *this, spec_.kind, params, init_seed_,
      [=](const std::string& name) {
        if (name.find("norm.") != std::string::npos) return InitialValue::constant(1.0);
        if (ends_with(name, ".bias")) return InitialValue::constant(0.0);
        const bool residual = name.find("o_proj.") != std::string::npos ||
                              name.find("down_proj.") != std::string::npos || name.find(".w2.") != std::string::npos;
        return InitialValue::normal_with_std(residual ? residual_std : init_std);
      },
      plan_, tp_, ep_);
}

// The token embedding: under context parallelism this rank's slice of every sequence; under
// sequence parallelism the residual stream is its tensor-parallel slice of that.
at::Tensor RotaryDecoderModel::embed(const at::Tensor& input_ids, const ForwardInputs&) {
  const at::Tensor x = tp_.vocab_embedding(cp_.slice(input_ids), embed_tokens_->weight);
  if (parts_.embedding_scale == 1.0) return x;
  // Gemma rounds the scale to the weight's dtype first (sqrt(3072) is 55.5 in bf16).
  return x * at::scalar_tensor(parts_.embedding_scale, at::TensorOptions().dtype(embed_tokens_->weight.scalar_type()))
                 .to(x.device(), x.scalar_type());
}

// The rotary tables at this rank's positions, in the compute dtype.
void RotaryDecoderModel::complete_inputs(ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) {
  inputs.attention.rotary.clear();
  for (RotaryEmbedding& rotary : rotaries_) {
    const auto [cos, sin] = rotary.tables_for(input_ids.size(1), inputs.positions, stream);
    inputs.attention.rotary.push_back({cos, sin});
  }
}

at::Tensor RotaryDecoderModel::final_norm(const at::Tensor& x) { return norm_->forward(x); }

at::Tensor RotaryDecoderModel::head_weight() { return parts_.tied ? embed_tokens_->weight : lm_head_->weight; }

}  // namespace tessera::nn
