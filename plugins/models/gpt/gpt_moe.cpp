// Model `gpt_moe`: the GPT-2 decoder of model/gpt (gpt_family.hpp) whose feed-forward layers are,
// every moe_every-th block, mixtures of GELU experts (the kit's GeluExperts: top-k routing,
// optional capacity, the Switch load-balancing and router z-losses). It reports its routing to
// monitors through tessera::MoeRouting. Splits over tensor-, context-, expert- and
// pipeline-parallel ranks.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/plugin.hpp"
#include "gpt_family.hpp"
#include "gpt_moe_config.hpp"

namespace {

using tessera::gpt_moe::GptMoeConfig;

class GptMoe final : public tessera::gpt_family::GptDecoder, public tessera::MoeRouting {
 public:
  // Under context parallelism this rank's router sees its slice's tokens; under expert
  // parallelism it holds num_experts / ep of every MoE layer's experts.
  GptMoe(const GptMoeConfig& s, tessera::TensorParallel tp, tessera::ContextParallel cp, tessera::ExpertParallel ep,
         const tessera::RunContext& run)
      : GptDecoder(s, spec(s), std::move(tp), std::move(cp), std::move(ep), run, feed_forward(s)),
        s_(s) {
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    // Active parameters: a token passes through k of the E experts of an MoE layer.
    const std::int64_t C = s.n_embd;
    const std::int64_t per_expert = 2 * C * s.expert_width() + (s.bias ? s.expert_width() + C : 0);
    std::int64_t moe_blocks = 0;
    for (std::int64_t i = 0; i < s.n_layer; ++i) moe_blocks += s.is_moe_block(i) ? 1 : 0;
    const std::int64_t from_config = tessera::gpt_family::gpt_parameter_count(s, /*dense_mlp=*/false) +
                                     moe_blocks * (C * s.num_experts + s.num_experts * per_expert) +
                                     (s.n_layer - moe_blocks) * (8 * C * C + (s.bias ? 5 * C : 0));
    const std::int64_t idle = moe_blocks * (s.num_experts - s.top_k) * per_expert;
    set_flop_parameters(static_cast<double>(parameters_but_positions(from_config) - idle));
  }

  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape = GptDecoder::transformer_shape();
    shape.expert_hidden = s_.expert_width();
    for (std::int64_t block = 0; block < s_.n_layer; ++block) {
      if (s_.is_moe_block(block)) shape.moe_blocks.push_back(block);
    }
    shape.experts = s_.num_experts;
    shape.experts_per_token = s_.top_k;
    return shape;
  }

  std::int64_t num_experts() const override { return s_.num_experts; }
  std::int64_t experts_per_token() const override { return s_.top_k; }
  std::vector<tessera::RouterStatistics> take_router_statistics() override { return router_statistics(); }

 private:
  // The kit's sizes come from the GPT-2 fields (GptDecoder); the losses' weights from here.
  static tessera::nn::DecoderSpec spec(const GptMoeConfig& s) {
    tessera::nn::DecoderSpec spec;
    spec.kind = "model/gpt_moe";
    spec.aux_loss_coef = s.aux_loss_coef;
    spec.z_loss_coef = s.z_loss_coef;
    return spec;
  }

  // An MoE block's experts (under "moe"), a dense block's 4x GELU MLP (under "mlp"): tensor
  // parallelism splits the dense MLP; the experts are whole on every tensor-parallel rank.
  static tessera::gpt_family::FeedForwardChoice feed_forward(const GptMoeConfig& s) {
    return {[s](tessera::TensorParallelPlan& plan, const std::string& prefix, std::int64_t i) {
              if (s.is_moe_block(i)) {
                tessera::nn::GeluExperts::plan(plan, prefix + "moe.", s.bias);
              } else {
                tessera::nn::GeluMlp::plan(plan, prefix + "mlp.", s.bias);
              }
            },
            [s](std::int64_t i, const tessera::TensorParallel& tp, const tessera::ExpertParallel& ep) {
              using Part = tessera::nn::Named<tessera::nn::FeedForward>;
              if (!s.is_moe_block(i)) {
                return Part{"mlp", std::make_shared<tessera::nn::GeluMlp>(s.n_embd, 4 * s.n_embd, s.bias, s.dropout,
                                                                          "none", tp)};
              }
              return Part{"moe", std::make_shared<tessera::nn::GeluExperts>(s.routing(), ep, s.n_embd, s.expert_width(),
                                                                            s.bias, s.dropout)};
            }};
  }

  GptMoeConfig s_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptMoeConfig>(
      "gpt_moe", "GPT-2 style decoder with top-k mixture-of-experts feed-forward layers",
      [](const GptMoeConfig& c, const tessera::RunContext& run) {
        return std::make_shared<GptMoe>(c, tessera::TensorParallel::of(run), tessera::ContextParallel::of(run),
                                        tessera::ExpertParallel::of(run), run);
      });
}

}  // namespace

TESSERA_PLUGIN("model_gpt_moe", "0.1.0", register_components)
