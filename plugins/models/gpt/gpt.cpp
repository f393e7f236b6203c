// Model `gpt`: a GPT-2 style decoder-only transformer. Pre-norm blocks with causal
// scaled-dot-product attention and a 4x GELU MLP; the output head reuses the token embedding.
// Imports and exports Hugging Face's GPT2LMHeadModel (gpt2_format.hpp).
#include <ATen/ops/arange.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/activation_checkpoint.hpp"
#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/model.hpp"
#include "tessera/plugin.hpp"
#include "tessera/hugging_face.hpp"
#include "../document_mask.hpp"
#include "../hf_import.hpp"
#include "gpt2_format.hpp"
#include "transformer_parts.hpp"

namespace {

using tessera::gpt2_format::GptConfig;

using tessera::gpt_parts::CausalSelfAttention;
using tessera::gpt_parts::Embedding;
using tessera::gpt_parts::LayerNorm;
using tessera::gpt_parts::Mlp;

class Block : public torch::nn::Module {
 public:
  explicit Block(const GptConfig& c)
      : ln_1(register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd, c.bias))),
        attn(register_module("attn", std::make_shared<CausalSelfAttention>(c.n_embd, c.n_head, c.bias, c.dropout))),
        ln_2(register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd, c.bias))),
        mlp(register_module("mlp", std::make_shared<Mlp>(c.n_embd, c.bias, c.dropout,
                                                         c.activation == "gelu_tanh" ? "tanh" : "none"))) {}

  at::Tensor forward(at::Tensor x, const at::Tensor& mask = {}) {
    x = x + attn->forward(ln_1->forward(x), mask);
    return x + mlp->forward(ln_2->forward(x));
  }

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<Mlp> mlp;
};

class Gpt final : public tessera::Model {
 public:
  // `hf`: a Hugging Face GPT-2 folder to take the weights from (c.init_from), already read.
  Gpt(const GptConfig& c, const tessera::HfCheckpoint* hf)
      : config_(c),
        init_seed_(tessera::draw_init_seed()),
        wte_(register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd))),
        wpe_(register_module("wpe", std::make_shared<Embedding>(c.max_seq_len, c.n_embd))) {
    // A plain module as container names parameters h.0.attn.c_attn.weight, ... like GPT-2.
    auto layers = register_module("h", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<Block>(c)));
    }
    ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, c.bias));
    // Deferred (built by the host for a run): the parameters are shapes on the meta device until
    // the trainer or fsdp gives them storage and asks initialize_parameters for their values.
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    if (hf) {
      tessera::gpt2_format::import_weights(*hf, *this);
      tokenizer_files_ = hf->tokenizer_files;
      special_ids_ = tessera::hf_import::special_token_ids(hf->config);
    } else if (!c.init_from.empty()) {
      tessera::hf_import::load_tessera_weights(*this, c.init_from);
    }
    // 6N + 12·L·C·T (PaLM appendix B). N counts the tied token embedding, whose matmul is the
    // output layer, but not the position embedding: a lookup costs no FLOPs.
    flop_params_ = static_cast<double>(num_parameters() - wpe_->weight.numel());
  }

  // fsdp gathers one block at a time; embeddings and the final norm are gathered for the whole pass.
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override {
    return {blocks_.begin(), blocks_.end()};
  }

  // The tied head: a chunked loss gets the final norm's output and the token embedding matrix.
  bool has_output_head() const override { return true; }
  tessera::OutputHead output_head() override { return {wte_->weight, {}}; }

  // GPT2LMHeadModel has biases throughout.
  bool exports_hugging_face() const override { return config_.bias; }
  std::string architecture_json() const override { return tessera::gpt2_format::architecture_json(config_); }

  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    tessera::HfExport out = tessera::gpt2_format::export_folder(config_, state, special_ids_);
    out.files_to_copy = tokenizer_files_;
    return out;
  }

  bool masks_documents() const override { return true; }

  std::int64_t vocab_size() const override { return config_.vocab_size; }
  std::int64_t max_seq_len() const override { return config_.max_seq_len; }
  double flops_per_token(std::int64_t seq_len) const override {
    return 6.0 * flop_params_ + 12.0 * static_cast<double>(config_.n_layer) *
                                    static_cast<double>(config_.n_embd) *
                                    static_cast<double>(seq_len);
  }

 protected:
  at::Tensor compute(const at::Tensor& input_ids) override {
    // Tied head: the token embedding matrix is the output projection, no extra parameter.
    return at::linear(compute_hidden(input_ids), wte_->weight);
  }

  at::Tensor compute_hidden(const at::Tensor& input_ids) override {
    if (input_ids.dim() != 2) {
      throw tessera::Error("model/gpt: input_ids must be [batch, seq], got " +
                           std::to_string(input_ids.dim()) + " dimensions");
    }
    const std::int64_t seq = input_ids.size(1);
    if (seq > config_.max_seq_len) {
      throw tessera::Error("model/gpt: sequence length " + std::to_string(seq) +
                           " exceeds max_seq_len " + std::to_string(config_.max_seq_len) +
                           "; raise max_seq_len or shorten the data's seq_len");
    }
    // Packed documents: positions restart at each, attention stays within each.
    tessera::documents::Layout docs;
    if (document_ids().defined()) docs = tessera::documents::layout(document_ids(), input_ids);
    const at::Tensor positions =
        docs.positions.defined() ? docs.positions : at::arange(seq, input_ids.options().dtype(at::kLong));
    at::Tensor x = at::dropout(wte_->forward(input_ids) + wpe_->forward(positions), config_.dropout,
                               is_training());
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      // The body outlives this call when checkpointed (backward runs it again): it owns the block
      // and the mask.
      tessera::BlockBody body = [block = blocks_[i], mask = docs.attention_mask](const at::Tensor& h) {
        return block->forward(h, mask);
      };
      const bool checkpointed = tessera::checkpoints_block(
          config_.activation_checkpointing, config_.activation_checkpointing_every, static_cast<std::int64_t>(i));
      x = run_unit(i, x, [&](const at::Tensor& h) {
        return checkpointed ? tessera::checkpoint_activations(body, h) : body(h);
      });
    }
    return ln_f_->forward(x);
  }

 public:
  // GPT-2 init (gpt_parts::initialize_gpt2_parameters): any subset, in any order, gets the values
  // the model built whole has.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    tessera::gpt_parts::initialize_gpt2_parameters(
        *this, "model/gpt", params, init_seed_, config_.init_std,
        config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.n_layer)));
  }

 private:
  GptConfig config_;
  std::uint64_t init_seed_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  double flop_params_ = 0;
  std::vector<std::string> tokenizer_files_;  // of an imported Hugging Face folder, carried into hf exports
  std::string special_ids_;  // the imported config.json's bos/eos/pad ids, carried into hf exports
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptConfig>("gpt", "GPT-2 style decoder-only transformer with tied head",
                                           [](const GptConfig& yaml) {
                                             // Weights read from a file at construction: built whole.
                                             std::optional<tessera::DeferredInitSuspension> whole;
                                             if (!yaml.init_from.empty()) whole.emplace();
                                             if (!tessera::is_hf_checkpoint(yaml.init_from)) {
                                               // A Tessera export folder: its config.json settles what the YAML left out.
                                               const auto exported = tessera::hf_import::tessera_export_config(yaml.init_from, "gpt");
                                               return std::make_shared<Gpt>(
                                                   exported ? tessera::gpt2_format::settle_export(yaml, *exported) : yaml, nullptr);
                                             }
                                             // A Hugging Face folder: config.json settles what the YAML left out.
                                             const tessera::HfCheckpoint hf = tessera::hf_import::at_init_from(
                                                 [&] { return tessera::read_hf_checkpoint(yaml.init_from); });
                                             return std::make_shared<Gpt>(tessera::gpt2_format::settle_config(yaml, hf.config), &hf);
                                           });
}

}  // namespace

TESSERA_PLUGIN("model_gpt", "0.1.0", register_components)
