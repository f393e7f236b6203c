// Model `llama`: the Llama decoder. Pre-norm blocks of RMSNorm -> grouped-query causal
// self-attention with rotary position embeddings (Hugging Face's rotate-half convention) ->
// residual, RMSNorm -> SwiGLU MLP -> residual; no biases; a final RMSNorm and an output head,
// tied to the token embedding or not. Imports and exports Hugging Face's LlamaForCausalLM.
// With num_experts, Mixtral: every block's MLP is a mixture of SwiGLU experts (top-k routing,
// tessera::ExpertRouter), expert-parallel over parallelism.ep; imports and exports Hugging Face's
// MixtralForCausalLM, and reports its routing to monitors through tessera::MoeRouting.
// Long (past 400 lines): the blocks, their tensor-, context-, expert- and pipeline-parallel
// placement and the import/export hooks all act on the same modules; the config and name mapping
// are apart in llama_config.hpp.
#include <ATen/autocast_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/where.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/activation_checkpoint.hpp"
#include "tessera/attention.hpp"
#include "tessera/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/expert_router.hpp"
#include "tessera/hugging_face.hpp"
#include "tessera/model.hpp"
#include "tessera/moe.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/plugin.hpp"
#include "../expert_linear.hpp"
#include "../gpt/transformer_parts.hpp"
#include "../document_mask.hpp"
#include "../hf_import.hpp"
#include "llama_config.hpp"

namespace {

using tessera::gpt_parts::Affine;
using tessera::gpt_parts::Embedding;
using tessera::gpt_parts::ExpertLinear;
using tessera::llama::LlamaConfig;

class RmsNorm : public torch::nn::Module {
 public:
  RmsNorm(std::int64_t dim, double eps, tessera::TensorParallel tp = {}) : dim_(dim), eps_(eps), tp_(std::move(tp)) {
    weight = register_parameter("weight", tessera::gpt_parts::parameter({dim}, 1.0));
  }
  // Normalised in float32 whatever the compute dtype, as Hugging Face's LlamaRMSNorm does, then
  // scaled in the input's dtype. Under sequence parallelism on this rank's slice of the sequence,
  // the weight's gradient summed over the ranks.
  at::Tensor forward(const at::Tensor& x) const {
    return at::rms_norm(x.to(at::kFloat), {dim_}, std::nullopt, eps_).to(x.scalar_type()) *
           tp_.replicated(weight).to(x.scalar_type());
  }

  at::Tensor weight;

 private:
  std::int64_t dim_;
  double eps_;
  tessera::TensorParallel tp_;
};

// A row-parallel projection without bias: this rank's input units times its columns of the
// weight, summed over the tensor-parallel ranks (scattered onto sequence slices under sequence
// parallelism).
at::Tensor row_parallel(const tessera::TensorParallel& tp, const Affine& layer, const at::Tensor& x) {
  return tp.size() == 1 ? layer.forward(x) : tp.row_output(at::linear(x, layer.weight));
}

// The rotary tables: cos and sin of position x frequency, [max_seq_len, head_dim], float32.
// Frequencies 1 / theta^(2i / d) for i < d/2, scaled Llama-3-style when asked, each used twice
// (for both halves of a head, the rotate-half layout).
std::pair<at::Tensor, at::Tensor> rotary_tables(const LlamaConfig& c) {
  c10::NoGradGuard no_grad;
  const std::int64_t d = c.head_size();
  at::Tensor inv_freq =
      1.0 / at::pow(c.rope_theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  if (c.rope_scaling) {
    const double factor = (*c.rope_scaling)[0], low = (*c.rope_scaling)[1], high = (*c.rope_scaling)[2];
    const double original = (*c.rope_scaling)[3];
    const double low_wavelen = original / low, high_wavelen = original / high;
    const at::Tensor wavelen = 2.0 * M_PI / inv_freq;
    // Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
    const at::Tensor smooth = (original / wavelen - low) / (high - low);
    const at::Tensor blended = (1 - smooth) * scaled / factor + smooth * scaled;
    const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = at::where(medium, blended, scaled);
  }
  const at::Tensor freqs = at::outer(at::arange(c.max_seq_len, at::kLong).to(at::kFloat), inv_freq);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {at::cos(angles), at::sin(angles)};
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for x = [x1, x2] along the last dim.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

class Attention : public torch::nn::Module {
 public:
  // Under tensor parallelism this rank computes its n_head / tp query heads and n_kv_head / tp
  // key/value heads (grouped-query attention stays grouped within a rank).
  // Under context parallelism (`cp`) the input is this rank's slice of the sequence and
  // attention crosses the slices.
  Attention(const LlamaConfig& c, tessera::TensorParallel tp, tessera::ContextParallel cp)
      : n_head_(tp.local(c.n_head)),
        n_kv_head_(tp.local(c.kv_heads())),
        head_dim_(c.head_size()),
        dropout_(c.dropout),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        q_(register_module("q_proj", std::make_shared<Affine>(c.n_embd, n_head_ * c.head_size(), false))),
        k_(register_module("k_proj", std::make_shared<Affine>(c.n_embd, n_kv_head_ * c.head_size(), false))),
        v_(register_module("v_proj", std::make_shared<Affine>(c.n_embd, n_kv_head_ * c.head_size(), false))),
        o_(register_module("o_proj", std::make_shared<Affine>(n_head_ * c.head_size(), c.n_embd, false))) {}

  // cos, sin: [seq, head_dim] (or [batch, 1, seq, head_dim] for packed documents) in x's compute
  // dtype; `mask` (optional, [batch, 1, seq, seq] bool): which keys each query may see; under
  // context parallelism `documents` (optional, [batch, whole seq]) instead.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     const at::Tensor& documents) {
    const at::Tensor x = tp_.column_input(input);  // the whole sequence
    const std::int64_t batch = x.size(0), seq = x.size(1);
    // [B, T, H·D] -> [B, H, T, D]
    auto heads = [&](const at::Tensor& t, std::int64_t n) { return t.view({batch, seq, n, head_dim_}).transpose(1, 2); };
    const at::Tensor q = apply_rotary(heads(q_->forward(x), n_head_), cos, sin);
    const at::Tensor k = apply_rotary(heads(k_->forward(x), n_kv_head_), cos, sin);
    const at::Tensor v = heads(v_->forward(x), n_kv_head_);
    const double dropout = is_training() ? dropout_ : 0.0;
    const bool gqa = n_kv_head_ != n_head_;
    at::Tensor y;
    {
      // Attention dropout on this rank's own heads: masks of its own.
      std::optional<tessera::ShardedRandomness> own;
      if (dropout > 0) own.emplace(tp_, q.device());
      if (cp_.size() > 1) {
        y = cp_.attend(q, k, v, documents);
      } else {
        y = mask.defined()
                ? at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/false, std::nullopt, gqa)
                : tessera::causal_attention(q, k, v, dropout);
      }
    }
    return row_parallel(tp_, *o_, y.transpose(1, 2).reshape({batch, seq, n_head_ * head_dim_}));
  }

 private:
  std::int64_t n_head_, n_kv_head_, head_dim_;  // this rank's heads
  double dropout_;
  tessera::TensorParallel tp_;
  tessera::ContextParallel cp_;
  std::shared_ptr<Affine> q_, k_, v_, o_;
};

// down(silu(gate(x)) * up(x))
class SwiGlu : public torch::nn::Module {
 public:
  // Under tensor parallelism this rank computes intermediate_size / tp hidden units.
  SwiGlu(const LlamaConfig& c, tessera::TensorParallel tp)
      : tp_(std::move(tp)),
        gate_(register_module("gate_proj", std::make_shared<Affine>(c.n_embd, tp_.local(c.mlp_size()), false))),
        up_(register_module("up_proj", std::make_shared<Affine>(c.n_embd, tp_.local(c.mlp_size()), false))),
        down_(register_module("down_proj", std::make_shared<Affine>(tp_.local(c.mlp_size()), c.n_embd, false))) {}

  at::Tensor forward(const at::Tensor& input) {
    const at::Tensor x = tp_.column_input(input);
    return row_parallel(tp_, *down_, at::silu(gate_->forward(x)) * up_->forward(x));
  }

 private:
  tessera::TensorParallel tp_;
  std::shared_ptr<Affine> gate_, up_, down_;
};

// Mixtral's sparse MLP: a router (`gate`, [E, C]) and SwiGLU experts stacked one tensor per weight,
// w1 (gate) and w3 (up) [E, I, C], w2 (down) [E, C, I]: expert e computes w2[e](silu(w1[e] x) *
// w3[e] x). Under expert parallelism this rank holds experts [first, first + E / ep) of the stacks;
// under tensor parallelism every rank holds them whole and routes the same tokens.
class SparseMoe : public torch::nn::Module {
 public:
  SparseMoe(const LlamaConfig& c, tessera::ExpertParallel ep)
      : router_({c.num_experts, c.top_k, c.capacity_factor, /*renormalize_topk=*/true}, std::move(ep)) {
    // Not adaptable: the routing reads its weight directly.
    gate = register_module("gate", std::make_shared<Affine>(c.n_embd, c.num_experts, false, false));
    auto experts = register_module("experts", std::make_shared<torch::nn::Module>());
    const std::int64_t mine = router_.local_experts();
    w1 = experts->register_module("w1", std::make_shared<ExpertLinear>(mine, c.n_embd, c.mlp_size(), false));
    w2 = experts->register_module("w2", std::make_shared<ExpertLinear>(mine, c.mlp_size(), c.n_embd, false));
    w3 = experts->register_module("w3", std::make_shared<ExpertLinear>(mine, c.n_embd, c.mlp_size(), false));
  }

  at::Tensor forward(const at::Tensor& x) {
    const auto gates = w1->weights(), downs = w2->weights(), ups = w3->weights();
    const at::Tensor y = router_.route(
        x.reshape({-1, x.size(-1)}), gate->weight,
        [&](std::int64_t e, const at::Tensor& rows) {
          const auto i = static_cast<std::size_t>(e);
          return at::linear(at::silu(at::linear(rows, gates[i])) * at::linear(rows, ups[i]), downs[i]);
        },
        is_training());
    return y.view(x.sizes());
  }

  tessera::ExpertRouter& router() { return router_; }

  std::shared_ptr<Affine> gate;
  std::shared_ptr<ExpertLinear> w1, w2, w3;

 private:
  tessera::ExpertRouter router_;
};

class Block : public torch::nn::Module {
 public:
  Block(const LlamaConfig& c, const tessera::TensorParallel& tp, const tessera::ContextParallel& cp,
        const tessera::ExpertParallel& ep)
      : input_layernorm(register_module("input_layernorm", std::make_shared<RmsNorm>(c.n_embd, c.rms_norm_eps, tp))),
        self_attn(register_module("self_attn", std::make_shared<Attention>(c, tp, cp))),
        post_attention_layernorm(
            register_module("post_attention_layernorm", std::make_shared<RmsNorm>(c.n_embd, c.rms_norm_eps, tp))) {
    if (c.mixture_of_experts()) {
      block_sparse_moe = register_module("block_sparse_moe", std::make_shared<SparseMoe>(c, ep));
    } else {
      mlp = register_module("mlp", std::make_shared<SwiGlu>(c, tp));
    }
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                     const at::Tensor& documents) {
    return feed_forward(attend(x, cos, sin, mask, documents));
  }
  at::Tensor attend(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                    const at::Tensor& documents) {
    return x + self_attn->forward(input_layernorm->forward(x), cos, sin, mask, documents);
  }
  at::Tensor feed_forward(const at::Tensor& x) {
    const at::Tensor h = post_attention_layernorm->forward(x);
    return x + (block_sparse_moe ? block_sparse_moe->forward(h) : mlp->forward(h));
  }

  std::shared_ptr<RmsNorm> input_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<RmsNorm> post_attention_layernorm;
  std::shared_ptr<SwiGlu> mlp;                   // exactly one of mlp and block_sparse_moe is set
  std::shared_ptr<SparseMoe> block_sparse_moe;
};

class Llama final : public tessera::Model, public tessera::MoeRouting {
 public:
  // `hf`: a Hugging Face Llama folder to take the weights from (c.init_from), already read.
  // `tp`: the run's tensor-parallel ranks; this rank holds its part of the split parameters.
  // `cp`: the run's context-parallel ranks; this rank computes its slice of every sequence.
  // `ep`: the run's expert-parallel ranks; this rank holds num_experts / ep of every block's experts.
  // `run`: its pipeline stages; this rank holds their blocks only (the embedding on the
  // first stage, the final norm and the head on the last; a tied head is the embedding again).
  Llama(const LlamaConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp,
        tessera::ContextParallel cp, tessera::ExpertParallel ep, const tessera::RunContext& run)
      : config_(c),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        ep_(std::move(ep)),
        pp_(tessera::PipelineParallel::of(run, c.n_layer)),
        init_seed_(tessera::draw_init_seed()) {
    if (pp_.holds_first_stage() || (c.tie_embeddings && pp_.holds_last_stage())) {
      embed_tokens_ = register_module("embed_tokens", std::make_shared<Embedding>(tp_.local(c.vocab_size), c.n_embd));
    }
    auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      const std::string block = "layers." + std::to_string(i) + ".";
      for (const char* column : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}) {
        plan_[block + column + ".weight"] = tessera::TensorShard::columns();
      }
      plan_[block + "self_attn.o_proj.weight"] = tessera::TensorShard::rows();
      if (c.mixture_of_experts()) {
        for (const char* stack : {"w1", "w2", "w3"}) {
          plan_[block + "block_sparse_moe.experts." + stack + ".weight"] = tessera::TensorShard::expert_stack();
        }
      } else {
        plan_[block + "mlp.gate_proj.weight"] = tessera::TensorShard::columns();
        plan_[block + "mlp.up_proj.weight"] = tessera::TensorShard::columns();
        plan_[block + "mlp.down_proj.weight"] = tessera::TensorShard::rows();
      }
      if (!pp_.holds_block(i)) continue;
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<Block>(c, tp_, cp_, ep_)));
      block_index_.push_back(i);
      if (blocks_.back()->block_sparse_moe) {
        moe_layers_.push_back(blocks_.back()->block_sparse_moe);
        moe_blocks_.push_back(i);
      }
    }
    plan_["embed_tokens.weight"] = tessera::TensorShard::vocabulary();
    plan_["lm_head.weight"] = tessera::TensorShard::vocabulary();
    if (pp_.holds_last_stage()) {
      norm_ = register_module("norm", std::make_shared<RmsNorm>(c.n_embd, c.rms_norm_eps, tp_));
      if (!c.tie_embeddings) {
        // Not adaptable: the loss reads the head's weight directly (Model::output_head).
        lm_head_ = register_module("lm_head",
                                   std::make_shared<Affine>(c.n_embd, tp_.local(c.vocab_size), false, false));
      }
    }
    // Derived from the config, not learned: neither parameters nor state (an import or a
    // checkpoint never carries them).
    std::tie(cos_, sin_) = rotary_tables(c);
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    if (hf) {
      import_weights(*hf);
      tokenizer_files_ = hf->tokenizer_files;
      special_ids_ = tessera::hf_import::special_token_ids(hf->config);
    } else if (!c.init_from.empty()) {
      tessera::hf_import::load_tessera_weights(*this, c.init_from, plan_, tp_, ep_, /*partial=*/pp_.size() > 1);
    }
    // 6N + 12·L·H·D·T (PaLM appendix B). N counts the head (tied or not) but not a separate
    // input embedding: a lookup costs no FLOPs. The whole model's N, whatever part of it this
    // rank holds (a pipeline stage counts it from the config); of the experts, only the k a
    // token passes through.
    const std::int64_t idle_experts =
        c.mixture_of_experts() ? c.n_layer * (c.num_experts - c.top_k) * 3 * c.n_embd * c.mlp_size() : 0;
    const std::int64_t whole = pp_.size() > 1 ? tessera::llama::parameter_count(c)
                                              : tessera::gpt_parts::whole_parameter_count(*this, plan_, tp_, ep_.size());
    flop_params_ = static_cast<double>(whole - (c.tie_embeddings ? 0 : c.vocab_size * c.n_embd) - idle_experts);
  }

  tessera::TensorParallelPlan tensor_parallel_plan() const override { return plan_; }

  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override { return {blocks_.begin(), blocks_.end()}; }

  bool has_output_head() const override { return true; }
  tessera::OutputHead output_head() override {
    tessera::OutputHead head{config_.tie_embeddings ? embed_tokens_->weight : lm_head_->weight, {}};
    if (tp_.size() > 1) {
      head.vocab_group = tp_.group();
      head.vocab_start = tp_.vocab_start(config_.vocab_size);
      head.vocab_size = config_.vocab_size;
    }
    return head;
  }

  bool masks_documents() const override { return true; }
  bool exports_hugging_face() const override { return true; }
  // LlamaForCausalLM's (and Mixtral's): everything under model. but the output head.
  tessera::HfModuleName hugging_face_module(const std::string& module) const override {
    return {module == "lm_head" ? module : "model." + module, false};
  }
  std::string architecture_json() const override { return tessera::llama::architecture_json(config_); }
  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape;
    shape.hidden = config_.n_embd;
    shape.blocks = config_.n_layer;
    shape.heads = config_.n_head;
    shape.kv_heads = config_.kv_heads();
    shape.head_dim = config_.head_size();
    shape.mlp_hidden = config_.mlp_size();
    shape.gated_mlp = true;
    for (std::int64_t block = 0; block < config_.n_layer; ++block) {
      if (config_.mixture_of_experts()) shape.moe_blocks.push_back(block);
      if (tessera::checkpoints_block(config_.activation_checkpointing, config_.activation_checkpointing_every, block)) {
        shape.checkpointed_blocks.push_back(block);
      }
    }
    shape.experts = config_.num_experts;
    shape.experts_per_token = config_.mixture_of_experts() ? config_.top_k : 0;
    shape.expert_hidden = config_.mlp_size();
    return shape;
  }

  std::vector<std::string> pipeline_tied_parameters() const override {
    return pp_.size() > 1 && config_.tie_embeddings ? std::vector<std::string>{"embed_tokens.weight"}
                                                   : std::vector<std::string>{};
  }

  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    tessera::HfExport out;
    out.config_json = tessera::llama::hf_config_json(config_, special_ids_);
    for (const auto& [name, tensor] : state) {
      if (!tessera::llama::is_expert_stack(name)) {
        out.tensors[tessera::llama::hf_name(name)] = tensor;
        continue;
      }
      // Mixtral's files hold one tensor per expert.
      for (std::int64_t e = 0; e < tensor.size(0); ++e) {
        out.tensors[tessera::llama::hf_expert_name(name, e)] = tensor[e].contiguous();
      }
    }
    out.files_to_copy = tokenizer_files_;
    return out;
  }

  at::Tensor auxiliary_loss() override { return aux_loss_; }
  std::int64_t num_experts() const override { return config_.num_experts; }
  std::int64_t experts_per_token() const override { return config_.mixture_of_experts() ? config_.top_k : 0; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override {
    std::vector<tessera::RouterStatistics> out;
    for (std::size_t i = 0; i < moe_layers_.size(); ++i) {
      out.push_back(moe_layers_[i]->router().take_statistics(moe_layers_[i]->gate->weight.options().dtype(at::kFloat)));
      out.back().layer = moe_blocks_[i];
    }
    return out;
  }

  std::int64_t vocab_size() const override { return config_.vocab_size; }
  std::int64_t max_seq_len() const override { return config_.max_seq_len; }
  double flops_per_token(std::int64_t seq_len) const override {
    return 6.0 * flop_params_ + 12.0 * static_cast<double>(config_.n_layer) *
                                    static_cast<double>(config_.n_head * config_.head_size()) *
                                    static_cast<double>(seq_len);
  }

  // Llama init, parameter by parameter: normal(0, init_std) for projections and embeddings,
  // the residual outputs (o_proj, down_proj) scaled by 1/sqrt(2 n_layer), ones for the norms.
  // Each tensor from its own generator (the model's init seed and its name): the same values for
  // any subset, in any order, on any device.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    c10::NoGradGuard no_grad;
    const tessera::gpt_parts::ParameterNames names(*this);
    const double residual_std = config_.init_std / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
    for (const at::Tensor& p : params) {
      const std::string& name = names.of(p, "model/llama");
      if (name.find("norm.") != std::string::npos) {
        p.fill_(1.0);
        continue;
      }
      const bool residual = name.find("o_proj.") != std::string::npos || name.find("down_proj.") != std::string::npos ||
                            name.find(".w2.") != std::string::npos;
      // The whole tensor's values, cut to this rank's part: the same model whatever the ranks.
      const tessera::TensorShard shard = tessera::shard_in(plan_, name);
      const tessera::ShardRanks ranks = tessera::ranks_of(shard, tp_, ep_);
      at::Tensor values = at::empty(tessera::whole_shape(p.sizes(), shard, ranks), at::kFloat);
      values.normal_(0.0, residual ? residual_std : config_.init_std, tessera::init_generator(init_seed_, name));
      p.copy_(tessera::part_of(values, shard, ranks));
    }
  }

 protected:
  at::Tensor compute(const at::Tensor& input_ids) override {
    // Split over tensor-parallel ranks, each computes its vocabulary's logits, gathered whole here
    // (the loss never asks for them: it takes the hidden states and the head).
    return tessera::gpt_parts::logits_of_any_length(
        input_ids, tessera::gpt_parts::sequence_multiple(tp_, cp_), document_ids().defined(), [&](const at::Tensor& ids) {
          return cp_.gather(tp_.gather_vocabulary(at::linear(compute_hidden(ids), output_head().weight)));
        });
  }

  at::Tensor compute_hidden(const at::Tensor& input_ids) override {
    if (pp_.size() > 1) {
      throw tessera::Error("model/llama: compute_hidden runs the whole model, but under pipeline parallelism this rank "
                           "holds some blocks only (Model::forward_stage runs them)");
    }
    check_input(input_ids);
    at::Tensor x = embed(input_ids);
    const Context context = context_of(input_ids, x.scalar_type());
    x = run_blocks(x, 0, config_.n_layer, context);
    collect_auxiliary_loss(0, config_.n_layer);
    return finish(x);
  }

  at::Tensor compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden) override {
    const tessera::PipelineStage& stage = pp_.local_stages().at(local_stage);
    check_input(input_ids);
    at::Tensor x = stage.first ? embed(input_ids) : hidden;
    const Context context = context_of(input_ids, x.scalar_type());
    x = run_blocks(x, stage.first_block, stage.end_block, context);
    collect_auxiliary_loss(stage.first_block, stage.end_block);
    return stage.last ? finish(x) : x;
  }

 private:
  // What every block needs of the forward pass: the rotary tables at this rank's positions, and
  // packed documents' mask (or, under context parallelism, their ids).
  struct Context {
    at::Tensor cos, sin, mask, documents;
  };

  void check_input(const at::Tensor& input_ids) const {
    if (input_ids.dim() != 2) {
      throw tessera::Error("model/llama: input_ids must be [batch, seq], got " + std::to_string(input_ids.dim()) +
                           " dimensions");
    }
    const std::int64_t seq = input_ids.size(1);
    if (seq > config_.max_seq_len) {
      throw tessera::Error("model/llama: sequence length " + std::to_string(seq) + " exceeds max_seq_len " +
                           std::to_string(config_.max_seq_len) + "; raise max_seq_len or shorten the data's seq_len");
    }
  }

  // The first stage: the token embedding. Under context parallelism this rank's slice of every
  // sequence; under sequence parallelism the residual stream is its tensor-parallel slice of that.
  at::Tensor embed(const at::Tensor& input_ids) {
    return tp_.vocab_embedding(cp_.slice(input_ids), embed_tokens_->weight);
  }

  // `stream`: the residual stream's dtype (the tables' without autocast).
  Context context_of(const at::Tensor& input_ids, at::ScalarType stream) {
    const std::int64_t seq = input_ids.size(1);
    // The tables in the compute dtype (as Hugging Face casts them), on the input's device: under
    // autocast the projections they multiply come out in the autocast dtype.
    const at::ScalarType dtype = at::autocast::is_autocast_enabled(input_ids.device().type())
                                     ? at::autocast::get_autocast_dtype(input_ids.device().type())
                                     : stream;
    // Copied to the device and dtype once, not at every forward pass.
    if (!cos_on_.defined() || cos_on_.device() != input_ids.device() || cos_on_.scalar_type() != dtype) {
      cos_on_ = cos_.to(input_ids.device(), dtype);
      sin_on_ = sin_.to(input_ids.device(), dtype);
    }
    Context context{cos_on_.narrow(0, 0, seq), sin_on_.narrow(0, 0, seq), at::Tensor(), at::Tensor()};
    // Packed documents: rotary angles restart at each, attention stays within each
    // (context-parallel attention masks them from the document ids themselves).
    const bool sliced = cp_.size() > 1;
    tessera::documents::Layout docs;
    if (document_ids().defined()) docs = tessera::documents::layout(document_ids(), input_ids, !sliced);
    if (docs.positions.defined() || sliced) {
      // The angles of this rank's positions (global ones under context parallelism).
      const at::Tensor positions =
          cp_.slice(docs.positions.defined() ? docs.positions : at::arange(seq, input_ids.options()).unsqueeze(0));
      const at::Tensor flat = positions.flatten();
      context.cos = cos_on_.index_select(0, flat).view({positions.size(0), 1, positions.size(1), -1});
      context.sin = sin_on_.index_select(0, flat).view({positions.size(0), 1, positions.size(1), -1});
    }
    context.mask = docs.attention_mask;
    if (sliced && document_ids().defined()) context.documents = document_ids().to(input_ids.device(), at::kLong);
    return context;
  }

  // Blocks [first, end) (this rank holds them), each one of fsdp's units.
  at::Tensor run_blocks(at::Tensor x, std::int64_t first, std::int64_t end, const Context& c) {
    for (std::int64_t b = first; b < end; ++b) {
      const std::shared_ptr<Block>& block = blocks_[tessera::gpt_parts::local_position(block_index_, b)];
      const bool checkpointed =
          tessera::checkpoints_block(config_.activation_checkpointing, config_.activation_checkpointing_every, b);
      x = run_unit(tessera::gpt_parts::local_position(block_index_, b), x, [&](const at::Tensor& h) {
        if (!checkpointed) return block->forward(h, c.cos, c.sin, c.mask, c.documents);
        // A dense block is recomputed whole; a mixture-of-experts block its attention only: the
        // router's losses need their graph from the forward pass, its statistics are counted once,
        // and the experts' all-to-alls stay out of backward's recomputation.
        tessera::BlockBody attention = [block, c](const at::Tensor& in) {
          return block->attend(in, c.cos, c.sin, c.mask, c.documents);
        };
        if (block->block_sparse_moe) return block->feed_forward(tessera::checkpoint_activations(attention, h));
        tessera::BlockBody body = [block, c](const at::Tensor& in) {
          return block->forward(in, c.cos, c.sin, c.mask, c.documents);
        };
        return tessera::checkpoint_activations(body, h);
      });
    }
    return x;
  }

  // The last stage: the final norm. The whole sequence, replicated (its gradient summed over the
  // ranks): every tensor-parallel rank computes its vocabulary's logits of every token.
  at::Tensor finish(const at::Tensor& x) { return tp_.column_input(norm_->forward(x)); }

  // The weighted sum of this forward's balance and z-losses over the Mixtral blocks of
  // [first, end) (a pipeline stage's own).
  void collect_auxiliary_loss(std::int64_t first, std::int64_t end) {
    aux_loss_ = at::Tensor();
    if (config_.aux_loss_coef <= 0 && config_.z_loss_coef <= 0) return;
    for (std::size_t l = 0; l < moe_layers_.size(); ++l) {
      if (moe_blocks_[l] < first || moe_blocks_[l] >= end) continue;
      const auto& layer = moe_layers_[l];
      at::Tensor term = layer->router().last_aux_loss() * config_.aux_loss_coef +
                        layer->router().last_z_loss() * config_.z_loss_coef;
      aux_loss_ = aux_loss_.defined() ? aux_loss_ + term : term;
    }
  }

  void import_weights(const tessera::HfCheckpoint& hf) {
    tessera::hf_import::WeightImport weights(hf);
    for (const auto& item : named_parameters()) {
      const tessera::TensorShard shard = tessera::shard_in(plan_, item.key());
      const tessera::ShardRanks ranks = tessera::ranks_of(shard, tp_, ep_);
      if (!tessera::llama::is_expert_stack(item.key())) {
        weights.copy(tessera::llama::hf_name(item.key()), item.value(), false, shard, ranks);
        continue;
      }
      // Mixtral's one tensor per expert, stacked.
      std::vector<at::Tensor> experts;
      for (std::int64_t e = 0; e < config_.num_experts; ++e) {
        experts.push_back(weights.tensor(tessera::llama::hf_expert_name(item.key(), e)));
      }
      weights.copy_from(tessera::llama::hf_expert_name(item.key(), 0), at::stack(experts), item.value(), false, shard, ranks);
    }
    if (config_.tie_embeddings && weights.has("lm_head.weight")) {
      // A tied checkpoint may still store the head; it must be the embedding.
      if (!at::equal(weights.tensor("lm_head.weight"), weights.tensor("model.embed_tokens.weight"))) {
        throw tessera::ConfigError(hf.folder + ": lm_head.weight differs from model.embed_tokens.weight, but the "
                                   "model ties them (tie_embeddings)",
                                   "init_from");
      }
    }
    // Rotary tables some converters store with every layer: derived, not weights.
    weights.ignore([](const std::string& name) { return name.find("rotary_emb.inv_freq") != std::string::npos; });
    weights.finish(/*partial=*/pp_.size() > 1);
  }

  LlamaConfig config_;
  tessera::TensorParallel tp_;
  tessera::ContextParallel cp_;
  tessera::ExpertParallel ep_;
  tessera::PipelineParallel pp_;
  tessera::TensorParallelPlan plan_;  // filled as the layers are built
  std::uint64_t init_seed_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::vector<std::shared_ptr<Block>> blocks_;  // this rank's blocks, in order
  std::vector<std::int64_t> block_index_;       // each one's index in the whole model
  std::vector<std::shared_ptr<SparseMoe>> moe_layers_;  // Mixtral: every block's (this rank's)
  std::vector<std::int64_t> moe_blocks_;                // their block indices
  at::Tensor aux_loss_;
  std::shared_ptr<RmsNorm> norm_;
  std::shared_ptr<Affine> lm_head_;  // null when tied
  at::Tensor cos_, sin_;        // float32 on the CPU, as computed
  at::Tensor cos_on_, sin_on_;  // the same on the device and in the dtype of the last forward
  double flop_params_ = 0;
  std::vector<std::string> tokenizer_files_;
  std::string special_ids_;  // the imported config.json's bos/eos/pad ids, for the export
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, LlamaConfig>(
      "llama",
      "Llama decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU (or, with num_experts, Mixtral's "
      "mixture of SwiGLU experts); Hugging Face import/export",
      [](const LlamaConfig& yaml, const tessera::RunContext& run) {
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
      });
}

}  // namespace

TESSERA_PLUGIN("model_llama", "0.1.0", register_components)
