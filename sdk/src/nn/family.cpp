// FamilyDecoder: the modules a family spec describes, and what the kit derives from it (the
// plan, the shape, the FLOPs, the routing). Its weights (init, import, export) are
// family_weights.cpp.
#include "tessera/nn/family.hpp"

#include <ATen/ops/arange.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/scalar_tensor.h>

#include <utility>

#include "tessera/error.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/parallel/device_mesh.hpp"

namespace tessera::nn {
namespace {

// What the kit derives from the spec before the blocks are built.
DecoderSpec completed(const FamilySpec& f) {
  if (f.blocks.empty() || static_cast<std::int64_t>(f.blocks.size()) != f.decoder.n_layer) {
    throw Error(f.decoder.kind + ": the family spec has " + std::to_string(f.blocks.size()) + " blocks for n_layer " +
                std::to_string(f.decoder.n_layer));
  }
  for (const BlockSpec& block : f.blocks) {
    if (!block.latent && !block.fused_qkv && !f.rotaries.empty() && block.attention.rotary >= f.rotaries.size()) {
      throw Error(f.decoder.kind + ": a block reads rotary table " + std::to_string(block.attention.rotary) + " of " +
                  std::to_string(f.rotaries.size()));
    }
  }
  DecoderSpec spec = f.decoder;
  const BlockSpec& first = f.blocks.front();
  // Scores over the query/key size, the weighted sum over the value size: W is their mean.
  spec.attention_width = first.latent ? first.latent->heads * (first.latent->qk_head_dim() + first.latent->v_head_dim) / 2
                                      : first.attention.heads * first.attention.head_dim;
  spec.tied_embedding = f.tied ? f.layout.embedding + ".weight" : "";
  return spec;
}

std::shared_ptr<FeedForward> make_feed_forward(const FeedForwardSpec& ff, std::int64_t hidden, const TensorParallel& tp,
                                               const ExpertParallel& ep) {
  if (ff.experts && ff.gated) {
    return std::make_shared<SwiGluExperts>(*ff.experts, ep, hidden, ff.expert_width, ff.expert_names, ff.shared_width, tp);
  }
  if (ff.experts) return std::make_shared<GeluExperts>(*ff.experts, ep, hidden, ff.expert_width, ff.bias, ff.dropout);
  if (ff.gated) return std::make_shared<SwiGlu>(hidden, ff.width, false, tp, ff.activation);
  return std::make_shared<GeluMlp>(hidden, ff.width, ff.bias, ff.dropout, ff.activation == "gelu_tanh" ? "tanh" : "none",
                                   tp);
}

std::shared_ptr<AttentionLayer> make_attention(const BlockSpec& s, const TensorParallel& tp, const ContextParallel& cp) {
  if (s.latent) return std::make_shared<MultiHeadLatentAttention>(*s.latent, tp, cp);
  const AttentionSpec& a = s.attention;
  if (s.fused_qkv) return std::make_shared<FusedQkvAttention>(a.hidden, a.heads, a.qkv_bias, a.dropout, tp, cp);
  return std::make_shared<GroupedQueryAttention>(a, tp, cp);
}

std::shared_ptr<Norm> make_norm(std::int64_t dim, const NormSpec& norm, const TensorParallel& tp) {
  if (norm.layer_norm) return std::make_shared<LayerNorm>(dim, norm.bias, norm.eps, tp);
  return std::make_shared<RmsNorm>(dim, norm.eps, tp, NormOver::stream, norm.weight);
}

// Block `s` over these ranks: on the meta device when deferring (tessera/nn/deferred_init.hpp).
std::shared_ptr<TransformerBlock> make_block(const BlockSpec& s, std::int64_t hidden, const TensorParallel& tp,
                                             const ContextParallel& cp, const ExpertParallel& ep) {
  BlockParts parts{{s.names.attention_norm, make_norm(hidden, s.norm, tp)},
                   {s.names.attention, make_attention(s, tp, cp)},
                   {s.sandwich ? s.names.sandwich_mlp_norm : s.names.mlp_norm, make_norm(hidden, s.norm, tp)},
                   {s.feed_forward.module, make_feed_forward(s.feed_forward, hidden, tp, ep)}};
  if (s.sandwich) {
    parts.attention_post_norm = {s.names.attention_post_norm, make_norm(hidden, s.norm, tp)};
    parts.mlp_post_norm = {s.names.mlp_post_norm, make_norm(hidden, s.norm, tp)};
  }
  return std::make_shared<TransformerBlock>(parts);
}

// Its splits, at `prefix` ("layers.3."): what each part type says of its own.
void plan_block(TensorParallelPlan& plan, const std::string& prefix, const BlockSpec& s) {
  const std::string attention = prefix + s.names.attention + ".";
  if (s.latent) {
    MultiHeadLatentAttention::plan(plan, attention, *s.latent);
  } else if (s.fused_qkv) {
    FusedQkvAttention::plan(plan, attention, s.attention.qkv_bias);
  } else {
    GroupedQueryAttention::plan(plan, attention, s.attention);
  }
  const FeedForwardSpec& ff = s.feed_forward;
  const std::string mlp = prefix + ff.module + ".";
  if (ff.experts && ff.gated) {
    SwiGluExperts::plan(plan, mlp, ff.expert_names, ff.shared_width > 0);
  } else if (ff.experts) {
    GeluExperts::plan(plan, mlp, ff.bias);
  } else if (ff.gated) {
    SwiGlu::plan(plan, mlp);
  } else {
    GeluMlp::plan(plan, mlp, ff.bias);
  }
}

}  // namespace

FamilyDecoder::FamilyDecoder(FamilySpec spec, const HfCheckpoint* hf, const std::string& init_from, TensorParallel tp,
                             ContextParallel cp, ExpertParallel ep, const RunContext& run)
    : DecoderModel(completed(spec), std::move(tp), std::move(cp), std::move(ep), run),
      family_(std::move(spec)),
      rotaries_(family_.rotaries.begin(), family_.rotaries.end()),
      routing_group_(run.mesh ? run.mesh->group_ptr({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp})
                              : run.communicator) {
  const LayoutNames& names = family_.layout;
  const std::int64_t hidden = family_.hidden, rows = tp_.vocab_rows(spec_.vocab_size, spec_.vocab_multiple);
  // The order of registration is the parameters' order (checkpoints and optimizer state keep it).
  if (pp_.holds_first_stage() || (family_.tied && pp_.holds_last_stage())) {
    embedding_ = register_module(names.embedding, std::make_shared<Embedding>(rows, hidden));
  }
  if (!names.positions.empty() && pp_.holds_first_stage()) {
    positions_ = register_module(names.positions, std::make_shared<Embedding>(spec_.max_seq_len, hidden));
  }
  layers_ = register_module(names.layers, std::make_shared<torch::nn::Module>());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(family_.blocks.size()); ++i) {
    const BlockSpec& block = family_.blocks[static_cast<std::size_t>(i)];
    plan_block(plan_, names.layers + "." + std::to_string(i) + ".", block);
    add_block(*layers_, i, [&] { return make_block(block, hidden, tp_, cp_, ep_); });
  }
  plan_[names.embedding + ".weight"] = TensorShard::vocabulary(spec_.vocab_size, spec_.vocab_multiple);
  if (!family_.tied) plan_[names.head + ".weight"] = TensorShard::vocabulary(spec_.vocab_size, spec_.vocab_multiple);
  if (pp_.holds_last_stage()) {
    final_norm_ = register_module(names.final_norm, make_norm(hidden, family_.final_norm, tp_));
    // Not adaptable: the loss reads the head's weight directly (Model::output_head).
    if (!family_.tied) head_ = register_module(names.head, std::make_shared<Linear>(hidden, rows, false, false));
  }
  load(hf, init_from);
  set_flop_parameters(flop_parameters());
  if (embedding_ && family_.embedding_scale != 1.0) {
    // Gemma rounds the scale to the weight's dtype first (sqrt(3072) is 55.5 in bf16): rounded
    // here once, on the CPU, not copied to the device every pass.
    embedding_scale_ =
        at::scalar_tensor(family_.embedding_scale, at::TensorOptions().dtype(embedding_->weight.scalar_type()))
            .item<double>();
  }
}

// Under context parallelism this rank's slice of every sequence; under sequence parallelism the
// residual stream is its tensor-parallel slice of that. Learned positions are looked up at this
// rank's global positions.
at::Tensor FamilyDecoder::embed(const at::Tensor& input_ids, const ForwardInputs& inputs) {
  at::Tensor x = tp_.vocab_embedding(cp_.slice(input_ids), embedding_->weight);
  if (positions_) {
    const at::Tensor at = inputs.positions.defined()
                              ? inputs.positions
                              : at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0);
    x = x + at::embedding(tp_.replicated(positions_->weight), tp_.sequence_slice(at));
  }
  if (embedding_scale_ != 1.0) x = x * embedding_scale_;
  return family_.embedding_dropout > 0 ? tp_.stream_dropout(x, family_.embedding_dropout, is_training()) : x;
}

// Every rotary embedding's tables at this rank's positions, in the compute dtype.
void FamilyDecoder::complete_inputs(ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) {
  inputs.attention.rotary.clear();
  for (RotaryEmbedding& rotary : rotaries_) {
    const auto [cos, sin] = rotary.tables_for(input_ids.size(1), inputs.positions, stream);
    inputs.attention.rotary.push_back({cos, sin});
  }
}

double FamilyDecoder::flop_parameters() const {
  const std::int64_t hidden = family_.hidden;
  DeferredInitScope meta;  // shapes only: nothing is allocated
  // The head (tied or not: its matmul), the vocabulary padded as one rank pads it, and the final
  // norm; a separate input embedding and a position table are lookups.
  double n = static_cast<double>(TensorParallel().vocab_rows(spec_.vocab_size, spec_.vocab_multiple) * hidden);
  for (const at::Tensor& p : make_norm(hidden, family_.final_norm, {})->parameters()) n += static_cast<double>(p.numel());
  for (const BlockSpec& spec : family_.blocks) {
    const std::shared_ptr<TransformerBlock> block = make_block(spec, hidden, {}, {}, {});
    for (const at::Tensor& p : block->parameters()) n += static_cast<double>(p.numel());
    if (!spec.feed_forward.experts) continue;
    // Of the stacked experts, only the k a token passes through.
    const ExpertRouting& routing = *spec.feed_forward.experts;
    const double idle = static_cast<double>(routing.num_experts - routing.top_k) / static_cast<double>(routing.num_experts);
    for (const auto& module : block->modules(/*include_self=*/false)) {
      if (!dynamic_cast<ExpertLinear*>(module.get())) continue;
      for (const at::Tensor& p : module->parameters(/*recurse=*/false)) n -= idle * static_cast<double>(p.numel());
    }
  }
  return n;
}

const BlockSpec* FamilyDecoder::first_routed() const {
  for (const BlockSpec& block : family_.blocks) {
    if (block.feed_forward.experts) return &block;
  }
  return nullptr;
}

std::int64_t FamilyDecoder::num_experts() const {
  const BlockSpec* routed = first_routed();
  return routed ? routed->feed_forward.experts->num_experts : 0;
}

std::int64_t FamilyDecoder::experts_per_token() const {
  const BlockSpec* routed = first_routed();
  return routed ? routed->feed_forward.experts->top_k : 0;
}

void FamilyDecoder::after_optimizer_step(bool applied) {
  if (family_.bias_update_speed <= 0) return;
  for (MoeLayer* layer : moe_layers()) layer->balance_by_bias(applied ? family_.bias_update_speed : 0.0, routing_group_.get());
}

TransformerShape FamilyDecoder::transformer_shape() const {
  TransformerShape shape = decoder_shape();
  const BlockSpec& first = family_.blocks.front();
  shape.hidden = family_.hidden;
  shape.heads = first.latent ? first.latent->heads : first.attention.heads;
  // Latent and fused attention have a key/value head per query head.
  shape.kv_heads = first.latent || first.fused_qkv ? shape.heads : first.attention.kv_heads;
  shape.head_dim = first.latent ? first.latent->qk_head_dim() : first.attention.head_dim;
  shape.mlp_hidden = first.feed_forward.width;
  shape.gated_mlp = first.feed_forward.gated;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(family_.blocks.size()); ++i) {
    if (family_.blocks[static_cast<std::size_t>(i)].feed_forward.experts) shape.moe_blocks.push_back(i);
  }
  if (const BlockSpec* routed = first_routed()) {
    shape.experts = routed->feed_forward.experts->num_experts;
    shape.experts_per_token = routed->feed_forward.experts->top_k;
    shape.expert_hidden = routed->feed_forward.expert_width;
    shape.shared_expert_hidden = routed->feed_forward.shared_width;
  }
  return shape;
}

}  // namespace tessera::nn
