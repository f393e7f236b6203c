// The config of model/gpt_moe, declared once: the GPT-2 architecture fields it shares with
// model/gpt, then the mixture-of-experts fields and the rules between them.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "../gpt/gpt_architecture.hpp"
#include "tessera/config_fields.hpp"
#include "tessera/error.hpp"

namespace tessera::gpt_moe {

struct GptMoeConfig : gpt_parts::GptArchitecture {
  std::int64_t num_experts = 8;
  std::int64_t top_k = 2;
  std::int64_t expert_hidden = 0;  // 0: 4 x n_embd
  std::int64_t moe_every = 1;
  double capacity_factor = 0.0;  // 0: every assignment is kept
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.0;
  bool renormalize_topk = true;

  std::int64_t expert_width() const { return expert_hidden > 0 ? expert_hidden : 4 * n_embd; }
  // Every moe_every-th block is an MoE block: with 2, blocks 1, 3, 5, ...
  bool is_moe_block(std::int64_t block) const { return (block + 1) % moe_every == 0; }
  double residual_std() const { return init_std / std::sqrt(2.0 * static_cast<double>(n_layer)); }

  static void declare(ConfigFields<GptMoeConfig>& f) {
    using C = GptMoeConfig;
    gpt_parts::declare_gpt_architecture(f, {"dropout on embeddings, attention, residual branches and expert outputs",
                                            "biases in linear layers (the router has none) and layer norms"});
    f.field("num_experts", &C::num_experts, "experts per MoE layer (E)").at_least(1);
    f.field("top_k", &C::top_k, "experts each token is routed to (k, at most num_experts)").at_least(1);
    f.field("expert_hidden", &C::expert_hidden, "hidden width of each expert's MLP; 0 = 4 x n_embd").at_least(0);
    f.field("moe_every", &C::moe_every, "every Nth block is MoE (blocks N-1, 2N-1, ...), the others dense").at_least(1);
    f.field("capacity_factor", &C::capacity_factor,
            "per-expert capacity ceil(factor x tokens x k / E) per forward, later assignments dropped; 0 = no limit")
        .at_least(0);
    f.field("aux_loss_coef", &C::aux_loss_coef,
            "weight of the load-balancing loss E x sum_e f_e P_e, summed over MoE layers")
        .at_least(0);
    f.field("z_loss_coef", &C::z_loss_coef,
            "weight of the router z-loss mean(logsumexp(logits)^2), summed over MoE layers")
        .at_least(0);
    f.field("renormalize_topk", &C::renormalize_topk, "divide the k gate probabilities by their sum");
    f.splits_experts();
    f.check_in_run([](const C& c, const RunContext& run) {
      gpt_parts::check_mesh(c, run);
      if (c.num_experts % run.parallel.ep != 0) {
        throw ConfigError("num_experts (" + std::to_string(c.num_experts) + ") must be divisible by parallelism.ep (" +
                              std::to_string(run.parallel.ep) + "): each expert-parallel rank holds num_experts / ep",
                          "num_experts");
      }
    });
    f.check([](const C& c) {
      if (c.top_k > c.num_experts) {
        throw ConfigError("top_k (" + std::to_string(c.top_k) + ") must not exceed num_experts (" +
                              std::to_string(c.num_experts) + ")",
                          "top_k");
      }
      if (c.moe_every > c.n_layer) {
        throw ConfigError("moe_every (" + std::to_string(c.moe_every) + ") exceeds n_layer (" +
                              std::to_string(c.n_layer) + "): no block would be a mixture of experts",
                          "moe_every");
      }
    });
  }
};

}  // namespace tessera::gpt_moe
