// The GPT-2 family on the SDK's transformer kit (tessera/nn/), shared by model/gpt and
// model/gpt_moe (both built from this folder): the architecture fields, the mesh rules on them,
// and GptDecoder, the decoder they both are: learned positions, pre-norm blocks of LayerNorm ->
// fused q|k|v attention -> LayerNorm -> a feed-forward part each model chooses (a 4x GELU MLP or
// experts), a final LayerNorm and the token embedding again as the head. Parameter names are
// GPT-2's (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ..., ln_f), so Hugging Face's GPT2LMHeadModel maps
// onto them under `transformer.`.
#pragma once

#include <ATen/ops/arange.h>
#include <ATen/ops/embedding.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tessera/nn/activation_checkpoint.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/decoder.hpp"
#include "tessera/nn/decoder_fields.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/parameters.hpp"
#include "tessera/parallel/parallel_dims.hpp"

namespace tessera::gpt_family {

// The kit's decoder fields (nn::DecoderFields) and GPT-2's biases.
struct GptArchitecture : nn::DecoderFields {
  bool bias = true;

  std::int64_t head_dim() const { return n_embd / n_head; }
  double residual_std() const { return init_std / std::sqrt(2.0 * static_cast<double>(n_layer)); }
};

// The mesh rules on a model's settled sizes (some may have come from init_from). The experts of
// gpt_moe stay whole under tensor parallelism; gpt_moe checks expert parallelism.
inline void check_mesh(const GptArchitecture& c, const RunContext& run) {
  nn::check_tensor_parallel({c.n_head, c.n_head, 0, c.vocab_size}, run.parallel);
  nn::check_context_parallel(c.n_head, c.dropout, run.parallel);
  nn::check_pipeline_parallel(c.n_layer, run.parallel);
}

// What dropout and biases cover differs between the models; the docs say so.
struct ArchitectureDocs {
  const char* dropout;
  const char* bias;
};

template <class Config>
void declare_gpt_architecture(ConfigFields<Config>& f, const ArchitectureDocs& docs) {
  nn::DecoderDocs decoder;
  decoder.max_seq_len = "longest sequence (size of the position embedding)";
  decoder.dropout = docs.dropout;
  nn::declare_decoder_fields(f, decoder);
  f.field("bias", &GptArchitecture::bias, docs.bias);
  f.check([](const Config& c) {
    if (c.n_embd % c.n_head != 0) {
      throw ConfigError("n_embd (" + std::to_string(c.n_embd) + ") must be divisible by n_head (" +
                            std::to_string(c.n_head) + ")",
                        "n_embd");
    }
  });
}

// A GPT-2 model's parameters, whole, from its config (a pipeline stage holds some of them only):
// the token and position embeddings, n_layer blocks (two norms, q/k/v and output projections,
// a 4x MLP) and the final norm. `dense_mlp` false: the blocks' MLPs are not counted (the caller
// adds its own).
inline std::int64_t gpt_parameter_count(const GptArchitecture& c, bool dense_mlp = true) {
  const std::int64_t C = c.n_embd, norm = c.bias ? 2 * C : C;
  const std::int64_t attention = 4 * C * C + (c.bias ? 4 * C : 0);
  const std::int64_t mlp = dense_mlp ? 8 * C * C + (c.bias ? 5 * C : 0) : 0;
  return c.vocab_size * C + c.max_seq_len * C + c.n_layer * (2 * norm + attention + mlp) + norm;
}

// A block's feed-forward part, as the model chooses it for block `index`: its splits (for every
// block of the whole model, held or not) and the part itself with its name ("mlp", "moe"), over
// the model's tensor- and expert-parallel ranks.
struct FeedForwardChoice {
  std::function<void(TensorParallelPlan& plan, const std::string& prefix, std::int64_t index)> plan;
  std::function<nn::Named<nn::FeedForward>(std::int64_t index, const TensorParallel& tp, const ExpertParallel& ep)>
      make;
};

class GptDecoder : public nn::DecoderModel {
 public:
  // GPT-2 init: normal(0, init_std) weights and embeddings, the residual output projections
  // (every "c_proj.weight": attention, MLP, experts) normal(0, init_std / sqrt(2 n_layer)) to keep
  // the residual stream's variance flat, ones and zeros for norms and biases.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    const GptArchitecture c = architecture_;
    nn::initialize_parameters(
        *this, spec_.kind, params, init_seed_,
        [c](const std::string& name) {
          if (nn::ends_with(name, ".bias")) return nn::InitialValue::constant(0.0);
          if (name.rfind("ln_f.", 0) == 0 || name.find(".ln_") != std::string::npos) {
            return nn::InitialValue::constant(1.0);
          }
          return nn::InitialValue::normal_with_std(nn::ends_with(name, "c_proj.weight") ? c.residual_std() : c.init_std);
        },
        plan_, tp_, ep_);
  }

  // The shape tessera plan reads (Model::transformer_shape): a GPT-2 block's attention and its
  // 4 x n_embd MLP; gpt_moe adds its experts.
  TransformerShape transformer_shape() const override {
    TransformerShape shape = decoder_shape();
    shape.hidden = architecture_.n_embd;
    shape.heads = architecture_.n_head;
    shape.kv_heads = architecture_.n_head;
    shape.head_dim = architecture_.head_dim();
    shape.mlp_hidden = 4 * architecture_.n_embd;
    return shape;
  }

 protected:
  // The token embedding on the first stage, and on the last as its output head; the position
  // embedding on the first stage; blocks h.N with `feed_forward`'s part; ln_f on the last stage.
  GptDecoder(const GptArchitecture& c, nn::DecoderSpec spec, TensorParallel tp, ContextParallel cp, ExpertParallel ep,
             const RunContext& run, const FeedForwardChoice& feed_forward)
      : nn::DecoderModel(with_gpt_fields(std::move(spec), c), std::move(tp), std::move(cp), std::move(ep), run),
        architecture_(c) {
    if (pp_.holds_first_stage() || pp_.holds_last_stage()) {
      wte_ = register_module("wte", std::make_shared<nn::Embedding>(tp_.vocab_rows(c.vocab_size, c.pad_vocab_to_multiple_of), c.n_embd));
    }
    if (pp_.holds_first_stage()) wpe_ = register_module("wpe", std::make_shared<nn::Embedding>(c.max_seq_len, c.n_embd));
    // A plain module as container names parameters h.0.attn.c_attn.weight, ... like GPT-2.
    auto layers = register_module("h", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const std::string block = "h." + std::to_string(i) + ".";
      nn::FusedQkvAttention::plan(plan_, block + "attn.", c.bias);
      feed_forward.plan(plan_, block, i);
      add_block(*layers, i, [&] {
        return std::make_shared<nn::TransformerBlock>(nn::BlockParts{
            {"ln_1", std::make_shared<nn::LayerNorm>(c.n_embd, c.bias, 1e-5, tp_)},
            {"attn", std::make_shared<nn::FusedQkvAttention>(c.n_embd, c.n_head, c.bias, c.dropout, tp_, cp_)},
            {"ln_2", std::make_shared<nn::LayerNorm>(c.n_embd, c.bias, 1e-5, tp_)},
            feed_forward.make(i, tp_, ep_)});
      });
    }
    plan_["wte.weight"] = TensorShard::vocabulary(c.vocab_size, c.pad_vocab_to_multiple_of);
    if (pp_.holds_last_stage()) {
      ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.bias, 1e-5, tp_));
    }
  }

  // Token and position embeddings: under context parallelism this rank's slice of every
  // sequence, at its global positions; under sequence parallelism the residual stream is its
  // tensor-parallel slice of that.
  at::Tensor embed(const at::Tensor& input_ids, const nn::ForwardInputs& inputs) override {
    const at::Tensor positions =
        inputs.positions.defined()
            ? inputs.positions
            : at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0);
    const at::Tensor position_embeddings = at::embedding(tp_.replicated(wpe_->weight), tp_.sequence_slice(positions));
    return tp_.stream_dropout(tp_.vocab_embedding(cp_.slice(input_ids), wte_->weight) + position_embeddings,
                              architecture_.dropout, is_training());
  }
  at::Tensor final_norm(const at::Tensor& x) override { return ln_f_->forward(x); }
  // Tied head: the token embedding matrix is the output projection, no extra parameter.
  at::Tensor head_weight() override { return wte_->weight; }

  // The whole model's parameters less the position table (a lookup costs no FLOPs); the tied
  // token embedding counts: its matmul is the output layer. `from_config` counts them on a
  // pipeline stage, which holds some blocks only.
  std::int64_t parameters_but_positions(std::int64_t from_config) const {
    const std::int64_t positions = architecture_.max_seq_len * architecture_.n_embd;
    return (pp_.size() > 1 ? from_config : whole_parameters()) - positions;
  }

  const GptArchitecture architecture_;

 private:
  static nn::DecoderSpec with_gpt_fields(const nn::DecoderSpec& spec, const GptArchitecture& c) {
    nn::DecoderSpec out = nn::DecoderSpec::of(spec.kind, c);
    out.tied_embedding = "wte.weight";
    out.aux_loss_coef = spec.aux_loss_coef;
    out.z_loss_coef = spec.z_loss_coef;
    return out;
  }

  std::shared_ptr<nn::Embedding> wte_, wpe_;  // wte: first and last stage; wpe: first stage
  std::shared_ptr<nn::LayerNorm> ln_f_;       // last stage
};

}  // namespace tessera::gpt_family
