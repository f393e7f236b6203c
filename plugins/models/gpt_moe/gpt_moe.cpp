// Model `gpt_moe`: a GPT-2 style decoder whose feed-forward layers are mixtures of experts with
// top-k routing, optional expert capacity, and the Switch load-balancing and router z-losses.
// It reports its routing to monitors through tessera::MoeRouting. Splits over tensor-, context-,
// expert- and pipeline-parallel ranks.
#include <ATen/ops/arange.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../gpt/transformer_parts.hpp"
#include "gpt_moe_config.hpp"
#include "moe_feed_forward.hpp"
#include "tessera/activation_checkpoint.hpp"
#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/model.hpp"
#include "tessera/moe.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::gpt_moe::GptMoeConfig;
using tessera::gpt_moe::MoeFeedForward;
using tessera::gpt_parts::CausalSelfAttention;
using tessera::gpt_parts::Embedding;
using tessera::gpt_parts::LayerNorm;
using tessera::gpt_parts::Mlp;

// Pre-norm block: attention, then either the dense MLP or the MoE feed-forward.
class Block : public torch::nn::Module {
 public:
  // Tensor parallelism splits the attention and the dense MLP; the experts are whole on every
  // tensor-parallel rank (which routes the same tokens: no sequence parallelism here).
  Block(const GptMoeConfig& s, bool moe_block, const tessera::TensorParallel& tp, const tessera::ContextParallel& cp,
        const tessera::ExpertParallel& ep)
      : ln_1(register_module("ln_1", std::make_shared<LayerNorm>(s.n_embd, s.bias, tp))),
        attn(register_module("attn",
                             std::make_shared<CausalSelfAttention>(s.n_embd, s.n_head, s.bias, s.dropout, tp, cp))),
        ln_2(register_module("ln_2", std::make_shared<LayerNorm>(s.n_embd, s.bias, tp))) {
    if (moe_block) {
      moe = register_module("moe", std::make_shared<MoeFeedForward>(s, ep));
    } else {
      mlp = register_module("mlp", std::make_shared<Mlp>(s.n_embd, s.bias, s.dropout, "none", tp));
    }
  }

  at::Tensor forward(at::Tensor x) { return feed_forward(attend(x)); }
  at::Tensor attend(const at::Tensor& x) { return x + attn->forward(ln_1->forward(x)); }
  at::Tensor feed_forward(const at::Tensor& x) {
    const at::Tensor h = ln_2->forward(x);
    return x + (moe ? moe->forward(h) : mlp->forward(h));
  }

  // Activation checkpointing: a dense block is recomputed whole. An MoE block recomputes its
  // attention only: the router's balancing losses need their graph from the forward pass, and
  // its statistics must be counted once.
  at::Tensor forward_checkpointed(const at::Tensor& x, const std::shared_ptr<Block>& self) {
    if (!moe) return tessera::checkpoint_activations([self](const at::Tensor& h) { return self->forward(h); }, x);
    return feed_forward(tessera::checkpoint_activations([self](const at::Tensor& h) { return self->attend(h); }, x));
  }

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<Mlp> mlp;  // exactly one of mlp and moe is set
  std::shared_ptr<MoeFeedForward> moe;
};

class GptMoe final : public tessera::Model, public tessera::MoeRouting {
 public:
  // Under context parallelism (`cp`) this rank computes its slice of every sequence; the router
  // sees that slice's tokens.
  // Under expert parallelism (`ep`) this rank holds num_experts / ep of every MoE layer's experts.
  // Under pipeline parallelism (`pp`) it holds the blocks of its own stages only.
  GptMoe(const GptMoeConfig& s, tessera::TensorParallel tp, tessera::ContextParallel cp, tessera::ExpertParallel ep,
         tessera::PipelineParallel pp)
      : s_(s),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        ep_(std::move(ep)),
        pp_(std::move(pp)),
        init_seed_(tessera::draw_init_seed()) {
    // The token embedding on the first stage, and on the last as its output head.
    if (pp_.holds_first_stage() || pp_.holds_last_stage()) {
      wte_ = register_module("wte", std::make_shared<Embedding>(tp_.local(s.vocab_size), s.n_embd));
    }
    if (pp_.holds_first_stage()) wpe_ = register_module("wpe", std::make_shared<Embedding>(s.max_seq_len, s.n_embd));
    auto stack = register_module("h", std::make_shared<torch::nn::Module>());
    std::int64_t moe_blocks = 0;
    for (std::int64_t i = 0; i < s.n_layer; ++i) {
      const std::string block = "h." + std::to_string(i) + ".";
      tessera::gpt_parts::attention_plan(plan_, block + "attn.", s.bias);
      if (s.is_moe_block(i)) {
        ++moe_blocks;
        for (const char* tensor : {"c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"}) {
          if (!s.bias && std::string(tensor).find("bias") != std::string::npos) continue;
          plan_[block + "moe.experts." + tensor] = tessera::TensorShard::expert_stack();
        }
      } else {
        tessera::gpt_parts::mlp_plan(plan_, block + "mlp.", s.bias);
      }
      if (!pp_.holds_block(i)) continue;
      blocks_.push_back(stack->register_module(std::to_string(i), std::make_shared<Block>(s, s.is_moe_block(i), tp_, cp_, ep_)));
      block_index_.push_back(i);
      if (blocks_.back()->moe) {
        moe_layers_.push_back(blocks_.back()->moe);
        moe_blocks_.push_back(i);
      }
    }
    plan_["wte.weight"] = tessera::TensorShard::vocabulary();
    if (pp_.holds_last_stage()) ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(s.n_embd, s.bias, tp_));
    // Deferred (built by the host for a run): the parameters are shapes on the meta device until
    // the trainer or fsdp gives them storage and asks initialize_parameters for their values.
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    // Active parameters: a token passes through k of the E experts of an MoE layer. The position
    // table is a lookup (no FLOPs); the tied token embedding is the output matmul. The whole
    // model's, counted from the config on a pipeline stage (which holds some blocks only).
    const std::int64_t C = s.n_embd;
    const std::int64_t per_expert = 2 * C * s.expert_width() + (s.bias ? s.expert_width() + C : 0);
    const std::int64_t idle = moe_blocks * (s.num_experts - s.top_k) * per_expert;
    const std::int64_t whole =
        pp_.size() > 1 ? tessera::gpt_parts::gpt_parameter_count(s, /*dense_mlp=*/false) +
                             moe_blocks * (C * s.num_experts + s.num_experts * per_expert) +
                             (s.n_layer - moe_blocks) * (8 * C * C + (s.bias ? 5 * C : 0))
                       : tessera::gpt_parts::whole_parameter_count(*this, plan_, tp_, ep_.size());
    active_params_ = static_cast<double>(whole - s.max_seq_len * C - idle);
  }

  tessera::TensorParallelPlan tensor_parallel_plan() const override { return plan_; }

  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override {
    return {blocks_.begin(), blocks_.end()};
  }
  // The tied head (as gpt's): a chunked loss gets the final norm's output and the embedding.
  bool has_output_head() const override { return true; }
  tessera::OutputHead output_head() override {
    tessera::OutputHead head{wte_->weight, {}};
    if (tp_.size() > 1) {
      head.vocab_group = tp_.group();
      head.vocab_start = tp_.vocab_start(s_.vocab_size);
      head.vocab_size = s_.vocab_size;
    }
    return head;
  }

  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape = tessera::gpt_parts::transformer_shape(s_);
    shape.expert_hidden = s_.expert_width();
    for (std::int64_t block = 0; block < s_.n_layer; ++block) {
      if (s_.is_moe_block(block)) shape.moe_blocks.push_back(block);
    }
    shape.experts = s_.num_experts;
    shape.experts_per_token = s_.top_k;
    return shape;
  }
  std::int64_t vocab_size() const override { return s_.vocab_size; }
  std::int64_t max_seq_len() const override { return s_.max_seq_len; }
  // 6 N_active + 12 L C T, the dense GPT's count (PaLM appendix B) with only the routed experts.
  double flops_per_token(std::int64_t seq_len) const override {
    return 6.0 * active_params_ +
           12.0 * static_cast<double>(s_.n_layer * s_.n_embd) * static_cast<double>(seq_len);
  }
  at::Tensor auxiliary_loss() override { return aux_loss_; }
  std::vector<std::string> pipeline_tied_parameters() const override {
    return pp_.size() > 1 ? std::vector<std::string>{"wte.weight"} : std::vector<std::string>{};
  }

  std::int64_t num_experts() const override { return s_.num_experts; }
  std::int64_t experts_per_token() const override { return s_.top_k; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override {
    std::vector<tessera::RouterStatistics> out;
    for (std::size_t i = 0; i < moe_layers_.size(); ++i) {
      out.push_back(moe_layers_[i]->take_statistics());
      out.back().layer = moe_blocks_[i];
    }
    return out;
  }

 protected:
  at::Tensor compute(const at::Tensor& input_ids) override {
    return tessera::gpt_parts::logits_of_any_length(
        input_ids, tessera::gpt_parts::sequence_multiple(tp_, cp_), document_ids().defined(), [&](const at::Tensor& ids) {
          return cp_.gather(tp_.gather_vocabulary(at::linear(compute_hidden(ids), wte_->weight)));
        });
  }

  at::Tensor compute_hidden(const at::Tensor& input_ids) override {
    if (pp_.size() > 1) {
      throw tessera::Error("model/gpt_moe: compute_hidden runs the whole model, but under pipeline parallelism this "
                           "rank holds some blocks only (Model::forward_stage runs them)");
    }
    check_input(input_ids);
    const at::Tensor x = run_blocks(embed(input_ids), 0, s_.n_layer);
    collect_auxiliary_loss(0, s_.n_layer);
    return finish(x);
  }

  at::Tensor compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden) override {
    const tessera::PipelineStage& stage = pp_.local_stages().at(local_stage);
    check_input(input_ids);
    const at::Tensor x = run_blocks(stage.first ? embed(input_ids) : hidden, stage.first_block, stage.end_block);
    collect_auxiliary_loss(stage.first_block, stage.end_block);
    return stage.last ? finish(x) : x;
  }

 private:
  void check_input(const at::Tensor& input_ids) const {
    if (input_ids.dim() != 2) {
      throw tessera::Error("model/gpt_moe: input_ids must be [batch, seq], got " + std::to_string(input_ids.dim()) +
                           " dimensions");
    }
    const std::int64_t seq = input_ids.size(1);
    if (seq > s_.max_seq_len) {
      throw tessera::Error("model/gpt_moe: sequence length " + std::to_string(seq) + " exceeds max_seq_len " +
                           std::to_string(s_.max_seq_len) + "; raise max_seq_len or shorten the data's seq_len");
    }
  }

  // The first stage: token and position embeddings; this rank's slice of every sequence under
  // context parallelism, at its global positions.
  at::Tensor embed(const at::Tensor& input_ids) {
    const at::Tensor positions = cp_.positions(input_ids.size(1), input_ids.device());
    return at::dropout(tp_.vocab_embedding(cp_.slice(input_ids), wte_->weight) + wpe_->forward(positions), s_.dropout,
                       is_training());
  }

  // Blocks [first, end) (this rank holds them), each one of fsdp's units.
  at::Tensor run_blocks(at::Tensor x, std::int64_t first, std::int64_t end) {
    for (std::int64_t b = first; b < end; ++b) {
      const std::size_t i = tessera::gpt_parts::local_position(block_index_, b);
      const std::shared_ptr<Block>& block = blocks_[i];
      const bool checkpointed =
          tessera::checkpoints_block(s_.activation_checkpointing, s_.activation_checkpointing_every, b);
      x = run_unit(i, x, [&](const at::Tensor& h) {
        return checkpointed ? block->forward_checkpointed(h, block) : block->forward(h);
      });
    }
    return x;
  }

  // The last stage: the final norm, the whole sequence replicated over tensor-parallel ranks.
  at::Tensor finish(const at::Tensor& x) { return tp_.column_input(ln_f_->forward(x)); }

  // The weighted sum of this forward's balance and z-losses over the MoE layers of blocks
  // [first, end) (a pipeline stage's own).
  void collect_auxiliary_loss(std::int64_t first, std::int64_t end) {
    aux_loss_ = at::Tensor();
    if (s_.aux_loss_coef <= 0 && s_.z_loss_coef <= 0) return;
    for (std::size_t l = 0; l < moe_layers_.size(); ++l) {
      if (moe_blocks_[l] < first || moe_blocks_[l] >= end) continue;
      const auto& layer = moe_layers_[l];
      at::Tensor term = layer->last_aux_loss() * s_.aux_loss_coef + layer->last_z_loss() * s_.z_loss_coef;
      aux_loss_ = aux_loss_.defined() ? aux_loss_ + term : term;
    }
  }

 public:
  // GPT-2 init (gpt_parts::initialize_gpt2_parameters; the router and the experts' c_fc as
  // weights, the experts' c_proj as residual projections): any subset, in any order, gets the
  // values the model built whole has.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    tessera::gpt_parts::initialize_gpt2_parameters(*this, "model/gpt_moe", params, init_seed_, s_.init_std,
                                                   s_.residual_std(), plan_, tp_, {ep_.rank(), ep_.size()});
  }

 private:
  GptMoeConfig s_;
  tessera::TensorParallel tp_;
  tessera::ContextParallel cp_;
  tessera::ExpertParallel ep_;
  tessera::PipelineParallel pp_;
  tessera::TensorParallelPlan plan_;  // filled as the layers are built
  std::uint64_t init_seed_;
  std::shared_ptr<Embedding> wte_, wpe_;       // wte: first and last stage; wpe: first stage
  std::vector<std::shared_ptr<Block>> blocks_;  // this rank's blocks, in order
  std::vector<std::int64_t> block_index_;       // each one's index in the whole model
  std::vector<std::shared_ptr<MoeFeedForward>> moe_layers_;
  std::vector<std::int64_t> moe_blocks_;  // the block index of each MoE layer
  std::shared_ptr<LayerNorm> ln_f_;       // last stage
  at::Tensor aux_loss_;
  double active_params_ = 0;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptMoeConfig>(
      "gpt_moe", "GPT-2 style decoder with top-k mixture-of-experts feed-forward layers",
      [](const GptMoeConfig& c, const tessera::RunContext& run) {
        return std::make_shared<GptMoe>(c, tessera::TensorParallel::of(run), tessera::ContextParallel::of(run),
                                        tessera::ExpertParallel::of(run), tessera::PipelineParallel::of(run, c.n_layer));
      });
}

}  // namespace

TESSERA_PLUGIN("model_gpt_moe", "0.1.0", register_components)
