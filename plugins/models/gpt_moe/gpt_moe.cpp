// Model `gpt_moe`: a GPT-2 style decoder whose feed-forward layers are mixtures of experts with
// top-k routing, optional expert capacity, and the Switch load-balancing and router z-losses.
// It reports its routing to monitors through tessera::MoeRouting.
#include <ATen/ops/arange.h>
#include <ATen/ops/argsort.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/div.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/model.hpp"
#include "tessera/moe.hpp"
#include "tessera/plugin.hpp"
#include "../gpt/transformer_parts.hpp"

namespace {

struct MoeSettings {
  std::int64_t vocab_size, n_layer, n_head, n_embd, max_seq_len;
  double dropout, init_std;
  bool bias;
  std::int64_t num_experts, top_k, expert_hidden, moe_every;
  double capacity_factor;  // 0: every assignment is kept
  double aux_loss_coef, z_loss_coef;
  bool renormalize_topk;

  // Every moe_every-th block is an MoE block: with 2, blocks 1, 3, 5, ...
  bool is_moe_block(std::int64_t block) const { return (block + 1) % moe_every == 0; }
  double residual_std() const { return init_std / std::sqrt(2.0 * static_cast<double>(n_layer)); }
};

// Normal init for a weight, zero for its (optional) bias.
void init_affine(at::Tensor& weight, at::Tensor& bias, double std_dev) {
  weight.normal_(0.0, std_dev);
  if (bias.defined()) bias.zero_();
}

using tessera::gpt_parts::CausalSelfAttention;
using tessera::gpt_parts::LayerNorm;
using tessera::gpt_parts::linear_layer;
using tessera::gpt_parts::Mlp;

// Routing sums of one MoE layer since the last take (tessera::RouterStatistics).
class RoutingSums {
 public:
  void add(const at::Tensor& assignments, const at::Tensor& dropped, double tokens, const at::Tensor& entropy,
           const at::Tensor& aux, const at::Tensor& z) {
    if (!assignments_.defined()) {
      const auto options = assignments.options().dtype(at::kFloat);
      assignments_ = at::zeros(assignments.sizes(), options);
      dropped_ = at::zeros({}, options);
      tokens_ = at::zeros({}, options);
      entropy_ = at::zeros({}, options);
      aux_ = at::zeros({}, options);
      z_ = at::zeros({}, options);
    }
    assignments_.add_(assignments);
    dropped_.add_(dropped);
    tokens_.add_(tokens);
    entropy_.add_(entropy);
    aux_.add_(aux);
    z_.add_(z);
    ++forwards_;
  }

  // Hands the sums over (zeros on `options` when nothing was routed) and starts again.
  tessera::RouterStatistics take(std::int64_t experts, const at::TensorOptions& options) {
    tessera::RouterStatistics out;
    if (!assignments_.defined()) {
      out.expert_assignments = at::zeros({experts}, options);
      for (at::Tensor* sum : {&out.dropped_assignments, &out.tokens, &out.entropy_sum, &out.aux_loss_sum, &out.z_loss_sum}) {
        *sum = at::zeros({}, options);
      }
      return out;
    }
    out.expert_assignments = std::move(assignments_);
    out.dropped_assignments = std::move(dropped_);
    out.tokens = std::move(tokens_);
    out.entropy_sum = std::move(entropy_);
    out.aux_loss_sum = std::move(aux_);
    out.z_loss_sum = std::move(z_);
    out.forwards = forwards_;
    *this = RoutingSums();
    return out;
  }

 private:
  at::Tensor assignments_, dropped_, tokens_, entropy_, aux_, z_;
  std::int64_t forwards_ = 0;
};

// One linear layer per expert, stacked: weight [E, out, in], bias [E, out].
class ExpertLinear : public torch::nn::Module {
 public:
  ExpertLinear(std::int64_t experts, std::int64_t in, std::int64_t out, bool with_bias) {
    weight = register_parameter("weight", at::empty({experts, out, in}));
    if (with_bias) bias = register_parameter("bias", at::zeros({experts, out}));
  }
  // Per-expert views; unbinding once per forward keeps backward to one stack per tensor.
  std::vector<at::Tensor> weights() const { return weight.unbind(0); }
  std::vector<at::Tensor> biases() const {
    return bias.defined() ? bias.unbind(0) : std::vector<at::Tensor>(static_cast<std::size_t>(weight.size(0)));
  }

  at::Tensor weight, bias;
};

// A mixture-of-experts feed-forward: a linear router (fp32 softmax) sends each token to its top-k
// experts, each a GELU MLP; their outputs are summed with the gate weights. Parameters:
// router.weight [E, C], experts.c_fc.{weight [E, H, C], bias}, experts.c_proj.{weight [E, C, H], bias}.
class MoeFeedForward : public torch::nn::Module {
 public:
  explicit MoeFeedForward(const MoeSettings& s) : s_(s) {
    router = register_module("router", linear_layer(s.n_embd, s.num_experts, false));
    auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
    up = experts->register_module("c_fc", std::make_shared<ExpertLinear>(s.num_experts, s.n_embd, s.expert_hidden, s.bias));
    down = experts->register_module("c_proj", std::make_shared<ExpertLinear>(s.num_experts, s.expert_hidden, s.n_embd, s.bias));
  }

  void init_weights() {
    init_affine(router->weight, router->bias, s_.init_std);
    init_affine(up->weight, up->bias, s_.init_std);
    init_affine(down->weight, down->bias, s_.residual_std());
  }

  at::Tensor forward(const at::Tensor& x) {
    const std::int64_t experts = s_.num_experts, k = s_.top_k;
    const at::Tensor tokens = x.reshape({-1, x.size(-1)});
    const std::int64_t n = tokens.size(0);

    // Router in fp32 whatever the model's precision: small logit differences decide the experts.
    const at::Tensor logits = at::linear(tokens.to(at::kFloat), router->weight.to(at::kFloat));
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    const at::Tensor probs = log_probs.exp();
    auto [top_probs, top_experts] = at::topk(probs, k, -1);
    const at::Tensor gates = s_.renormalize_topk ? top_probs / top_probs.sum(-1, /*keepdim=*/true) : top_probs;

    // Assignment a = token * k + slot is in token order. A stable sort by expert lists each
    // expert's assignments contiguously and still in token order, so capacity keeps a prefix.
    const at::Tensor chosen = top_experts.reshape({-1});
    const at::Tensor order = at::argsort(chosen, /*stable=*/true);
    const at::Tensor token_of = at::div(order, k, "floor");
    const at::Tensor gate_of = gates.reshape({-1}).index_select(0, order);
    const at::Tensor counts = at::bincount(chosen, {}, experts);
    const at::Tensor host_counts = counts.to(at::kCPU);  // slicing needs the counts on the host
    const auto* per_expert = host_counts.data_ptr<std::int64_t>();
    const std::int64_t capacity = capacity_per_expert(n);

    // Every expert runs, with zero rows when it got none, so each of its parameters gets a
    // gradient in every backward (ddp's buckets and fsdp's units expect that).
    const auto w_up = up->weights(), b_up = up->biases(), w_down = down->weights(), b_down = down->biases();
    at::Tensor combined = at::zeros_like(tokens);
    std::int64_t start = 0;
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t kept = std::min(per_expert[e], capacity);
      const at::Tensor rows = token_of.narrow(0, start, kept);
      at::Tensor y = at::linear(at::gelu(at::linear(tokens.index_select(0, rows), w_up[e], b_up[e])), w_down[e],
                                b_down[e]);
      y = y * gate_of.narrow(0, start, kept).unsqueeze(1).to(y.scalar_type());
      combined = combined.index_add(0, rows, y);
      start += per_expert[e];
    }

    // Switch/GShard balance: E * sum_e f_e * P_e, f_e = share of assignments (before drops),
    // P_e = mean router probability; 1 when uniform. Router z-loss: mean logsumexp(logits)^2.
    const at::Tensor assignment_share = counts.to(at::kFloat) / static_cast<double>(std::max<std::int64_t>(n * k, 1));
    last_aux_loss = static_cast<double>(experts) * (assignment_share * probs.mean(0)).sum();
    last_z_loss = at::logsumexp(logits, {-1}).pow(2).mean();

    if (is_training()) {
      c10::NoGradGuard no_grad;
      const at::Tensor dropped = (counts - capacity).clamp_min(0).sum().to(at::kFloat);
      const at::Tensor entropy = -(probs * log_probs).sum();
      sums_.add(counts.to(at::kFloat), dropped, static_cast<double>(n), entropy, last_aux_loss.detach(),
                last_z_loss.detach());
    }
    return at::dropout(combined.view(x.sizes()), s_.dropout, is_training());
  }

  // ceil(capacity_factor * tokens * k / E) assignments per expert; all of them without a factor.
  std::int64_t capacity_per_expert(std::int64_t tokens) const {
    if (s_.capacity_factor <= 0) return tokens * s_.top_k;
    return static_cast<std::int64_t>(std::ceil(s_.capacity_factor * static_cast<double>(tokens * s_.top_k) /
                                               static_cast<double>(s_.num_experts)));
  }

  tessera::RouterStatistics take_statistics() {
    return sums_.take(s_.num_experts, router->weight.options().dtype(at::kFloat));
  }

  torch::nn::Linear router{nullptr};
  std::shared_ptr<ExpertLinear> up, down;
  at::Tensor last_aux_loss, last_z_loss;  // unweighted, from the last forward (with their graph)

 private:
  MoeSettings s_;
  RoutingSums sums_;
};

// Pre-norm block: attention, then either the dense MLP or the MoE feed-forward.
class Block : public torch::nn::Module {
 public:
  Block(const MoeSettings& s, bool moe_block)
      : ln_1(register_module("ln_1", std::make_shared<LayerNorm>(s.n_embd, s.bias))),
        attn(register_module("attn", std::make_shared<CausalSelfAttention>(s.n_embd, s.n_head, s.bias, s.dropout))),
        ln_2(register_module("ln_2", std::make_shared<LayerNorm>(s.n_embd, s.bias))) {
    if (moe_block) {
      moe = register_module("moe", std::make_shared<MoeFeedForward>(s));
    } else {
      mlp = register_module("mlp", std::make_shared<Mlp>(s.n_embd, s.bias, s.dropout));
    }
  }

  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    const at::Tensor h = ln_2->forward(x);
    return x + (moe ? moe->forward(h) : mlp->forward(h));
  }

  std::shared_ptr<LayerNorm> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<LayerNorm> ln_2;
  std::shared_ptr<Mlp> mlp;  // exactly one of mlp and moe is set
  std::shared_ptr<MoeFeedForward> moe;
};

class GptMoe final : public tessera::Model, public tessera::MoeRouting {
 public:
  explicit GptMoe(const MoeSettings& s)
      : s_(s),
        wte_(register_module("wte", torch::nn::Embedding(s.vocab_size, s.n_embd))),
        wpe_(register_module("wpe", torch::nn::Embedding(s.max_seq_len, s.n_embd))) {
    auto stack = register_module("h", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < s.n_layer; ++i) {
      blocks_.push_back(stack->register_module(std::to_string(i), std::make_shared<Block>(s, s.is_moe_block(i))));
      if (blocks_.back()->moe) {
        moe_layers_.push_back(blocks_.back()->moe);
        moe_blocks_.push_back(static_cast<std::int64_t>(blocks_.size()) - 1);
      }
    }
    ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(s.n_embd, s.bias));
    init_weights();
    // Active parameters: a token passes through k of the E experts of an MoE layer. The position
    // table is a lookup (no FLOPs); the tied token embedding is the output matmul.
    const std::int64_t per_expert = 2 * s.n_embd * s.expert_hidden + (s.bias ? s.expert_hidden + s.n_embd : 0);
    const auto idle = static_cast<std::int64_t>(moe_layers_.size()) * (s.num_experts - s.top_k) * per_expert;
    active_params_ = static_cast<double>(num_parameters() - wpe_->weight.numel() - idle);
  }

  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override {
    return {blocks_.begin(), blocks_.end()};
  }
  std::int64_t vocab_size() const override { return s_.vocab_size; }
  std::int64_t max_seq_len() const override { return s_.max_seq_len; }
  // 6 N_active + 12 L C T, the dense GPT's count (PaLM appendix B) with only the routed experts.
  double flops_per_token(std::int64_t seq_len) const override {
    return 6.0 * active_params_ +
           12.0 * static_cast<double>(s_.n_layer * s_.n_embd) * static_cast<double>(seq_len);
  }
  at::Tensor auxiliary_loss() override { return aux_loss_; }

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
    if (input_ids.dim() != 2) {
      throw tessera::Error("model/gpt_moe: input_ids must be [batch, seq], got " + std::to_string(input_ids.dim()) +
                           " dimensions");
    }
    const std::int64_t seq = input_ids.size(1);
    if (seq > s_.max_seq_len) {
      throw tessera::Error("model/gpt_moe: sequence length " + std::to_string(seq) + " exceeds max_seq_len " +
                           std::to_string(s_.max_seq_len) + "; raise max_seq_len or shorten the data's seq_len");
    }
    const at::Tensor positions = at::arange(seq, input_ids.options().dtype(at::kLong));
    at::Tensor x = at::dropout(wte_->forward(input_ids) + wpe_->forward(positions), s_.dropout, is_training());
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      x = run_unit(i, x, [&](const at::Tensor& h) { return blocks_[i]->forward(h); });
    }
    collect_auxiliary_loss();
    return at::linear(ln_f_->forward(x), wte_->weight);
  }

 private:
  // The weighted sum over MoE layers of this forward's balance and z-losses.
  void collect_auxiliary_loss() {
    aux_loss_ = at::Tensor();
    if (s_.aux_loss_coef <= 0 && s_.z_loss_coef <= 0) return;
    for (const auto& layer : moe_layers_) {
      at::Tensor term = layer->last_aux_loss * s_.aux_loss_coef + layer->last_z_loss * s_.z_loss_coef;
      aux_loss_ = aux_loss_.defined() ? aux_loss_ + term : term;
    }
  }

  // GPT-2 init from the global generator (the run seed fixes it); residual output projections
  // (attention, dense and expert c_proj) scaled by 1/sqrt(2 n_layer).
  void init_weights() {
    c10::NoGradGuard no_grad;
    wte_->weight.normal_(0.0, s_.init_std);
    wpe_->weight.normal_(0.0, s_.init_std);
    for (const auto& block : blocks_) {
      init_affine(block->attn->qkv_proj()->weight, block->attn->qkv_proj()->bias, s_.init_std);
      init_affine(block->attn->out_proj()->weight, block->attn->out_proj()->bias, s_.residual_std());
      if (block->moe) {
        block->moe->init_weights();
      } else {
        init_affine(block->mlp->up_proj()->weight, block->mlp->up_proj()->bias, s_.init_std);
        init_affine(block->mlp->down_proj()->weight, block->mlp->down_proj()->bias, s_.residual_std());
      }
    }
  }

  MoeSettings s_;
  torch::nn::Embedding wte_, wpe_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<std::shared_ptr<MoeFeedForward>> moe_layers_;
  std::vector<std::int64_t> moe_blocks_;  // the block index of each MoE layer
  std::shared_ptr<LayerNorm> ln_f_;
  at::Tensor aux_loss_;
  double active_params_ = 0;
};

std::shared_ptr<tessera::Model> make_gpt_moe(const tessera::ComponentConfig& config) {
  MoeSettings s;
  s.vocab_size = config.integer("vocab_size");
  s.n_layer = config.integer("n_layer");
  s.n_head = config.integer("n_head");
  s.n_embd = config.integer("n_embd");
  s.max_seq_len = config.integer("max_seq_len");
  s.dropout = config.number("dropout");
  s.bias = config.boolean("bias");
  s.init_std = config.number("init_std");
  s.num_experts = config.integer("num_experts");
  s.top_k = config.integer("top_k");
  s.expert_hidden = config.integer("expert_hidden");
  if (s.expert_hidden == 0) s.expert_hidden = 4 * s.n_embd;
  s.moe_every = config.integer("moe_every");
  s.capacity_factor = config.number("capacity_factor");
  s.aux_loss_coef = config.number("aux_loss_coef");
  s.z_loss_coef = config.number("z_loss_coef");
  s.renormalize_topk = config.boolean("renormalize_topk");
  if (s.n_embd % s.n_head != 0) {
    throw tessera::ConfigError("n_embd (" + std::to_string(s.n_embd) + ") must be divisible by n_head (" +
                                   std::to_string(s.n_head) + ")",
                               "n_embd");
  }
  if (s.top_k > s.num_experts) {
    throw tessera::ConfigError("top_k (" + std::to_string(s.top_k) + ") must not exceed num_experts (" +
                                   std::to_string(s.num_experts) + ")",
                               "top_k");
  }
  if (s.moe_every > s.n_layer) {
    throw tessera::ConfigError("moe_every (" + std::to_string(s.moe_every) + ") exceeds n_layer (" +
                                   std::to_string(s.n_layer) + "): no block would be a mixture of experts",
                               "moe_every");
  }
  return std::make_shared<GptMoe>(s);
}

void register_components(tessera::Registrar& registrar) {
  tessera::Schema schema;
  schema.integer("vocab_size", "number of token ids").default_to(256).at_least(1);
  schema.integer("n_layer", "transformer blocks").default_to(4).at_least(1);
  schema.integer("n_head", "attention heads per block").default_to(4).at_least(1);
  schema.integer("n_embd", "width of the residual stream (divisible by n_head)").default_to(128).at_least(1);
  schema.integer("max_seq_len", "longest sequence (size of the position embedding)").default_to(256).at_least(1);
  schema.number("dropout", "dropout on embeddings, attention, residual branches and expert outputs")
      .default_to(0.0)
      .at_least(0)
      .less_than(1);
  schema.boolean("bias", "biases in linear layers (the router has none) and layer norms").default_to(true);
  schema.number("init_std", "standard deviation of the normal weight init").default_to(0.02).greater_than(0);
  schema.integer("num_experts", "experts per MoE layer (E)").default_to(8).at_least(1);
  schema.integer("top_k", "experts each token is routed to (k, at most num_experts)").default_to(2).at_least(1);
  schema.integer("expert_hidden", "hidden width of each expert's MLP; 0 = 4 x n_embd").default_to(0).at_least(0);
  schema.integer("moe_every", "every Nth block is MoE (blocks N-1, 2N-1, ...), the others dense").default_to(1).at_least(1);
  schema.number("capacity_factor",
                "per-expert capacity ceil(factor x tokens x k / E) per forward, later assignments dropped; 0 = no limit")
      .default_to(0.0)
      .at_least(0);
  schema.number("aux_loss_coef", "weight of the load-balancing loss E x sum_e f_e P_e, summed over MoE layers")
      .default_to(0.01)
      .at_least(0);
  schema.number("z_loss_coef", "weight of the router z-loss mean(logsumexp(logits)^2), summed over MoE layers")
      .default_to(0.0)
      .at_least(0);
  schema.boolean("renormalize_topk", "divide the k gate probabilities by their sum").default_to(true);
  registrar.add<tessera::Model>("gpt_moe", "GPT-2 style decoder with top-k mixture-of-experts feed-forward layers",
                                schema, make_gpt_moe);
}

}  // namespace

TESSERA_PLUGIN("model_gpt_moe", "0.1.0", register_components)
