// Model `gpt`: a GPT-2 style decoder-only transformer. Pre-norm blocks with causal
// scaled-dot-product attention and a 4x GELU MLP; the output head reuses the token embedding.
// Imports and exports Hugging Face's GPT2LMHeadModel (gpt2_format.hpp). Splits over tensor-,
// context- and pipeline-parallel ranks (a pipeline stage holds its blocks, the first stage the
// embeddings, the last the final norm and the tied embedding again as its head).
#include <ATen/ops/arange.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/embedding.h>
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
#include "tessera/parallel/pipeline_parallel.hpp"
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
  Block(const GptConfig& c, const tessera::TensorParallel& tp, const tessera::ContextParallel& cp)
      : ln_1(register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd, c.bias, tp))),
        attn(register_module("attn",
                             std::make_shared<CausalSelfAttention>(c.n_embd, c.n_head, c.bias, c.dropout, tp, cp))),
        ln_2(register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd, c.bias, tp))),
        mlp(register_module("mlp", std::make_shared<Mlp>(c.n_embd, c.bias, c.dropout,
                                                         c.activation == "gelu_tanh" ? "tanh" : "none", tp))) {}

  at::Tensor forward(at::Tensor x, const at::Tensor& mask = {}, const at::Tensor& documents = {}) {
    x = x + attn->forward(ln_1->forward(x), mask, documents);
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
  // `tp`: the run's tensor-parallel ranks; this rank holds its part of the split parameters.
  // `cp`: the run's context-parallel ranks; this rank computes its slice of every sequence.
  // `run`: its pipeline stages (of the settled n_layer); this rank holds their blocks only.
  Gpt(const GptConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp, tessera::ContextParallel cp,
      const tessera::RunContext& run)
      : config_(c),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        pp_(tessera::PipelineParallel::of(run, c.n_layer)),
        init_seed_(tessera::draw_init_seed()) {
    // The token embedding on the first stage, and on the last as its output head.
    if (pp_.holds_first_stage() || pp_.holds_last_stage()) {
      wte_ = register_module("wte", std::make_shared<Embedding>(tp_.local(c.vocab_size), c.n_embd));
    }
    if (pp_.holds_first_stage()) wpe_ = register_module("wpe", std::make_shared<Embedding>(c.max_seq_len, c.n_embd));
    // A plain module as container names parameters h.0.attn.c_attn.weight, ... like GPT-2.
    auto layers = register_module("h", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const std::string block = "h." + std::to_string(i) + ".";
      tessera::gpt_parts::attention_plan(plan_, block + "attn.", c.bias);
      tessera::gpt_parts::mlp_plan(plan_, block + "mlp.", c.bias);
      if (!pp_.holds_block(i)) continue;
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<Block>(c, tp_, cp_)));
      block_index_.push_back(i);
    }
    plan_["wte.weight"] = tessera::TensorShard::vocabulary();
    if (pp_.holds_last_stage()) ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(c.n_embd, c.bias, tp_));
    // Deferred (built by the host for a run): the parameters are shapes on the meta device until
    // the trainer or fsdp gives them storage and asks initialize_parameters for their values.
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    if (hf) {
      tessera::gpt2_format::import_weights(*hf, *this, plan_, tp_, /*partial=*/pp_.size() > 1);
      tokenizer_files_ = hf->tokenizer_files;
      special_ids_ = tessera::hf_import::special_token_ids(hf->config);
    } else if (!c.init_from.empty()) {
      tessera::hf_import::load_tessera_weights(*this, c.init_from, plan_, tp_, {}, /*partial=*/pp_.size() > 1);
    }
    // 6N + 12·L·C·T (PaLM appendix B). N counts the tied token embedding, whose matmul is the
    // output layer, but not the position embedding: a lookup costs no FLOPs. The whole model's
    // N, whatever part of it this rank holds (a pipeline stage counts it from the config).
    flop_params_ = pp_.size() > 1 ? static_cast<double>(tessera::gpt_parts::gpt_parameter_count(c) -
                                                        c.max_seq_len * c.n_embd)
                                  : static_cast<double>(tessera::gpt_parts::whole_parameter_count(*this, plan_, tp_) -
                                                        wpe_->weight.numel());
  }

  tessera::TensorParallelPlan tensor_parallel_plan() const override { return plan_; }

  // fsdp gathers one block at a time; embeddings and the final norm are gathered for the whole pass.
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override {
    return {blocks_.begin(), blocks_.end()};
  }

  // The tied head: a chunked loss gets the final norm's output and the token embedding matrix.
  bool has_output_head() const override { return true; }
  tessera::OutputHead output_head() override {
    tessera::OutputHead head{wte_->weight, {}};
    if (tp_.size() > 1) {
      head.vocab_group = tp_.group();
      head.vocab_start = tp_.vocab_start(config_.vocab_size);
      head.vocab_size = config_.vocab_size;
    }
    return head;
  }

  // GPT2LMHeadModel has biases throughout.
  bool exports_hugging_face() const override { return config_.bias; }
  // GPT2LMHeadModel's: the blocks under transformer., their projections Conv1D ([in, out]).
  tessera::HfModuleName hugging_face_module(const std::string& module) const override {
    return {"transformer." + module, true};
  }
  std::string architecture_json() const override { return tessera::gpt2_format::architecture_json(config_); }
  tessera::TransformerShape transformer_shape() const override { return tessera::gpt_parts::transformer_shape(config_); }

  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    tessera::HfExport out = tessera::gpt2_format::export_folder(config_, state, special_ids_);
    out.files_to_copy = tokenizer_files_;
    return out;
  }

  bool masks_documents() const override { return true; }

  std::vector<std::string> pipeline_tied_parameters() const override {
    return pp_.size() > 1 ? std::vector<std::string>{"wte.weight"} : std::vector<std::string>{};
  }

  std::int64_t vocab_size() const override { return config_.vocab_size; }
  std::int64_t max_seq_len() const override { return config_.max_seq_len; }
  double flops_per_token(std::int64_t seq_len) const override {
    return 6.0 * flop_params_ + 12.0 * static_cast<double>(config_.n_layer) *
                                    static_cast<double>(config_.n_embd) *
                                    static_cast<double>(seq_len);
  }

 protected:
  at::Tensor compute(const at::Tensor& input_ids) override {
    // Tied head: the token embedding matrix is the output projection, no extra parameter. Split
    // over tensor-parallel ranks, each computes its vocabulary's logits, gathered whole here (the
    // loss never asks for them: it takes the hidden states and the head).
    return tessera::gpt_parts::logits_of_any_length(
        input_ids, tessera::gpt_parts::sequence_multiple(tp_, cp_), document_ids().defined(), [&](const at::Tensor& ids) {
          return cp_.gather(tp_.gather_vocabulary(at::linear(compute_hidden(ids), wte_->weight)));
        });
  }

  at::Tensor compute_hidden(const at::Tensor& input_ids) override {
    whole_model("compute_hidden");
    check_input(input_ids);
    const Context context = context_of(input_ids);
    return finish(run_blocks(embed(input_ids, context), 0, config_.n_layer, context));
  }

  at::Tensor compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden) override {
    const tessera::PipelineStage& stage = pp_.local_stages().at(local_stage);
    check_input(input_ids);
    const Context context = context_of(input_ids);
    at::Tensor x = stage.first ? embed(input_ids, context) : hidden;
    x = run_blocks(x, stage.first_block, stage.end_block, context);
    return stage.last ? finish(x) : x;
  }

 private:
  // What the embeddings and blocks need of packed documents: positions within each, the mask
  // that keeps attention inside each (or, under context parallelism, their ids).
  struct Context {
    tessera::documents::Layout docs;
    at::Tensor documents;
  };

  void whole_model(const char* what) const {
    if (pp_.size() > 1) {
      throw tessera::Error(std::string("model/gpt: ") + what + " runs the whole model, but under pipeline parallelism "
                           "this rank holds some blocks only (Model::forward_stage runs them)");
    }
  }

  void check_input(const at::Tensor& input_ids) const {
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
  }

  Context context_of(const at::Tensor& ids) const {
    // Packed documents: positions restart at each, attention stays within each (context-parallel
    // attention masks them from the document ids themselves).
    const bool sliced = cp_.size() > 1;
    Context context;
    if (document_ids().defined()) {
      context.docs = tessera::documents::layout(document_ids(), ids, !sliced);
      if (sliced) context.documents = document_ids().to(ids.device(), at::kLong);
    }
    return context;
  }

  // The first stage: token and position embeddings. Under context parallelism this rank's slice
  // of every sequence, at its global positions; under sequence parallelism the residual stream
  // is its tensor-parallel slice of that.
  at::Tensor embed(const at::Tensor& input_ids, const Context& context) {
    const std::int64_t seq = input_ids.size(1);
    const at::Tensor positions =
        cp_.slice(context.docs.positions.defined() ? context.docs.positions
                                                   : at::arange(seq, input_ids.options().dtype(at::kLong)).unsqueeze(0));
    const at::Tensor position_embeddings = at::embedding(tp_.replicated(wpe_->weight), tp_.sequence_slice(positions));
    return tp_.stream_dropout(tp_.vocab_embedding(cp_.slice(input_ids), wte_->weight) + position_embeddings,
                              config_.dropout, is_training());
  }

  // Blocks [first, end) (this rank holds them), each one of fsdp's units.
  at::Tensor run_blocks(at::Tensor x, std::int64_t first, std::int64_t end, const Context& context) {
    for (std::int64_t b = first; b < end; ++b) {
      const std::size_t i = tessera::gpt_parts::local_position(block_index_, b);
      // The body outlives this call when checkpointed (backward runs it again): it owns the block
      // and the mask.
      tessera::BlockBody body = [block = blocks_[i], mask = context.docs.attention_mask,
                                 documents = context.documents](const at::Tensor& h) {
        return block->forward(h, mask, documents);
      };
      const bool checkpointed =
          tessera::checkpoints_block(config_.activation_checkpointing, config_.activation_checkpointing_every, b);
      x = run_unit(i, x, [&](const at::Tensor& h) {
        return checkpointed ? tessera::checkpoint_activations(body, h) : body(h);
      });
    }
    return x;
  }

  // The last stage: the final norm. The whole sequence, replicated (its gradient summed over the
  // ranks): every tensor-parallel rank computes its vocabulary's logits of every token.
  at::Tensor finish(const at::Tensor& x) { return tp_.column_input(ln_f_->forward(x)); }

 public:
  // GPT-2 init (gpt_parts::initialize_gpt2_parameters): any subset, in any order, gets the values
  // the model built whole has.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    tessera::gpt_parts::initialize_gpt2_parameters(
        *this, "model/gpt", params, init_seed_, config_.init_std,
        config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.n_layer)), plan_, tp_);
  }

 private:
  GptConfig config_;
  tessera::TensorParallel tp_;
  tessera::ContextParallel cp_;
  tessera::PipelineParallel pp_;
  tessera::TensorParallelPlan plan_;  // filled as the layers are built
  std::uint64_t init_seed_;
  std::shared_ptr<Embedding> wte_, wpe_;       // wte: first and last stage; wpe: first stage
  std::vector<std::shared_ptr<Block>> blocks_;  // this rank's blocks, in order
  std::vector<std::int64_t> block_index_;       // each one's index in the whole model
  std::shared_ptr<LayerNorm> ln_f_;             // last stage
  double flop_params_ = 0;
  std::vector<std::string> tokenizer_files_;  // of an imported Hugging Face folder, carried into hf exports
  std::string special_ids_;  // the imported config.json's bos/eos/pad ids, carried into hf exports
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptConfig>(
      "gpt", "GPT-2 style decoder-only transformer with tied head",
      [](const GptConfig& yaml, const tessera::RunContext& run) {
        const tessera::TensorParallel tp = tessera::TensorParallel::of(run);
        const tessera::ContextParallel cp = tessera::ContextParallel::of(run);
        // What init_from's config.json settles, checked against the mesh as validate checked it.
        const GptConfig c = tessera::gpt2_format::settled_by_init_from(yaml);
        tessera::gpt_parts::check_mesh(c, run, !yaml.init_from.empty());
        // Weights read from a file at construction: built whole.
        std::optional<tessera::DeferredInitSuspension> whole;
        if (!yaml.init_from.empty()) whole.emplace();
        if (!tessera::is_hf_checkpoint(yaml.init_from)) return std::make_shared<Gpt>(c, nullptr, tp, cp, run);
        const tessera::HfCheckpoint hf =
            tessera::hf_import::at_init_from([&] { return tessera::read_hf_checkpoint(yaml.init_from); });
        return std::make_shared<Gpt>(c, &hf, tp, cp, run);
      });
}

}  // namespace

TESSERA_PLUGIN("model_gpt", "0.1.0", register_components)
