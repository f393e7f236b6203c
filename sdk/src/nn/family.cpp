#include "tessera/nn/family.hpp"

#include <cmath>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {
namespace {

// What the kit derives from the spec before the blocks are built.
DecoderSpec completed(const FamilySpec& f) {
  if (f.blocks.empty() || static_cast<std::int64_t>(f.blocks.size()) != f.decoder.n_layer) {
    throw Error(f.decoder.kind + ": the family spec has " + std::to_string(f.blocks.size()) + " blocks for n_layer " +
                std::to_string(f.decoder.n_layer));
  }
  DecoderSpec spec = f.decoder;
  const BlockSpec& first = f.blocks.front();
  // Scores over the query/key size, the weighted sum over the value size: W is their mean.
  spec.attention_width = first.latent ? first.latent->heads * (first.latent->qk_head_dim() + first.latent->v_head_dim) / 2
                                      : first.attention.heads * first.attention.head_dim;
  spec.tied_embedding = f.parts.tied ? "embed_tokens.weight" : "";
  return spec;
}

std::shared_ptr<RmsNorm> rms(std::int64_t dim, const NormSpec& norm, const TensorParallel& tp) {
  return std::make_shared<RmsNorm>(dim, norm.eps, tp, NormOver::stream, norm.weight);
}

}  // namespace

std::shared_ptr<TransformerBlock> FamilyDecoder::make_block(const BlockSpec& s, std::int64_t hidden,
                                                            const TensorParallel& tp, const ContextParallel& cp,
                                                            const ExpertParallel& ep) {
  const FeedForwardSpec& ff = s.feed_forward;
  std::shared_ptr<FeedForward> mlp;
  if (ff.experts) {
    mlp = std::make_shared<SwiGluExperts>(*ff.experts, ep, hidden, ff.expert_width, ff.expert_names, ff.shared_width, tp);
  } else {
    mlp = std::make_shared<SwiGlu>(hidden, ff.width, false, tp, ff.activation);
  }
  BlockParts parts{{"input_layernorm", rms(hidden, s.norm, tp)},
                   {"self_attn", s.latent ? std::shared_ptr<AttentionLayer>(std::make_shared<MultiHeadLatentAttention>(*s.latent, tp, cp))
                                          : std::make_shared<GroupedQueryAttention>(s.attention, tp, cp)},
                   {s.sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm", rms(hidden, s.norm, tp)},
                   {ff.module, mlp}};
  if (s.sandwich) {
    parts.attention_post_norm = {"post_attention_layernorm", rms(hidden, s.norm, tp)};
    parts.mlp_post_norm = {"post_feedforward_layernorm", rms(hidden, s.norm, tp)};
  }
  return std::make_shared<TransformerBlock>(parts);
}

void FamilyDecoder::plan_block(TensorParallelPlan& plan, const std::string& prefix, const BlockSpec& s) {
  if (s.latent) {
    MultiHeadLatentAttention::plan(plan, prefix + "self_attn.", *s.latent);
  } else {
    GroupedQueryAttention::plan(plan, prefix + "self_attn.", s.attention);
  }
  if (s.feed_forward.experts) {
    SwiGluExperts::plan(plan, prefix + s.feed_forward.module + ".", s.feed_forward.expert_names,
                        s.feed_forward.shared_width > 0);
  } else {
    SwiGlu::plan(plan, prefix + s.feed_forward.module + ".");
  }
}

FamilyDecoder::FamilyDecoder(FamilySpec spec, const HfCheckpoint* hf, const std::string& init_from, TensorParallel tp,
                             ContextParallel cp, ExpertParallel ep, const RunContext& run)
    : RotaryDecoderModel(completed(spec), spec.parts, std::move(tp), std::move(cp), std::move(ep), run),
      family_(std::move(spec)),
      routing_group_(run.mesh ? run.mesh->group_ptr({MeshAxis::dp_replicate, MeshAxis::dp_shard, MeshAxis::cp})
                              : run.communicator) {
  const std::int64_t hidden = family_.parts.hidden;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(family_.blocks.size()); ++i) {
    const BlockSpec& block = family_.blocks[static_cast<std::size_t>(i)];
    plan_block(plan_, "layers." + std::to_string(i) + ".", block);
    add_block(layers(), i, [&] { return make_block(block, hidden, tp_, cp_, ep_); });
  }
  if (hf && family_.skipped_tensors) {
    std::int64_t skipped = 0;
    for (const auto& item : hf->tensors) skipped += family_.skipped_tensors(item.first) ? 1 : 0;
    if (skipped > 0) log::warn(spec_.kind, ": skipped ", skipped, " tensors of ", hf->folder, ": ", family_.why_skipped);
  }
  finish(hf, init_from, family_.names, num_experts(), family_.skipped_tensors);
  set_flop_parameters(flop_parameters());
}

double FamilyDecoder::flop_parameters() const {
  const std::int64_t hidden = family_.parts.hidden, vocab = family_.parts.vocab_size;
  // The head (tied or not) and the final norm; a separate input embedding costs no FLOPs.
  double n = static_cast<double>(vocab * hidden + hidden);
  DeferredInitScope meta;  // shapes only: nothing is allocated
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
  shape.hidden = family_.parts.hidden;
  shape.heads = first.latent ? first.latent->heads : first.attention.heads;
  shape.kv_heads = first.latent ? first.latent->heads : first.attention.kv_heads;  // latent: a key per head
  shape.head_dim = first.latent ? first.latent->qk_head_dim() : first.attention.head_dim;
  shape.mlp_hidden = first.feed_forward.width;
  shape.gated_mlp = true;
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

HfExport FamilyDecoder::hugging_face_export(const StateDict& state) const {
  return hf_export(state, family_.names, family_.hf_config_json(special_ids()));
}

void FamilyDecoder::initialize_parameters(const std::vector<at::Tensor>& params) {
  const InitSpec init = family_.init;
  const double residual_std =
      init.scaled_residual ? init.std / std::sqrt(2.0 * static_cast<double>(family_.blocks.size())) : init.std;
  // A norm starts at its identity: weight one, or zero where it scales by 1 + weight.
  const double norm_start = family_.parts.norm_weight == RmsWeight::one_plus ? 0.0 : 1.0;
  nn::initialize_parameters(
      *this, spec_.kind, params, init_seed_,
      [=](const std::string& name) {
        if (name.find("norm.") != std::string::npos) return InitialValue::constant(norm_start);
        if (ends_with(name, ".bias")) return InitialValue::constant(0.0);
        const bool residual = name.find("o_proj.") != std::string::npos ||
                              name.find("down_proj.") != std::string::npos || name.find(".w2.") != std::string::npos;
        return InitialValue::normal_with_std(residual ? residual_std : init.std);
      },
      plan_, tp_, ep_);
}

}  // namespace tessera::nn
