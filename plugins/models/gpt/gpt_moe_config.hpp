// The config of model/gpt_moe, declared once: the GPT-2 architecture fields it shares with
// model/gpt, the kit's mixture-of-experts fields (tessera/nn/experts.hpp), its own two (the
// experts' width and which blocks have them) and the rules between them.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/experts.hpp"
#include "gpt_family.hpp"

namespace tessera::gpt_moe {

struct GptMoeConfig : gpt_family::GptArchitecture, nn::MoeFields {
  std::int64_t expert_hidden = 0;  // 0: 4 x n_embd
  std::int64_t moe_every = 1;

  std::int64_t expert_width() const { return expert_hidden > 0 ? expert_hidden : 4 * n_embd; }
  // Every moe_every-th block is an MoE block: with 2, blocks 1, 3, 5, ...
  bool is_moe_block(std::int64_t block) const { return (block + 1) % moe_every == 0; }

  static void declare(ConfigFields<GptMoeConfig>& f) {
    using C = GptMoeConfig;
    gpt_family::declare_gpt_architecture(f, {"dropout on embeddings, attention, residual branches and expert outputs",
                                             "biases in linear layers (the router has none) and layer norms"});
    nn::declare_moe_fields(f, {"experts per MoE layer (E)", /*dense_allowed=*/false, "MoE layers"});
    f.field("expert_hidden", &C::expert_hidden, "hidden width of each expert's MLP; 0 = 4 x n_embd").at_least(0);
    f.field("moe_every", &C::moe_every, "every Nth block is MoE (blocks N-1, 2N-1, ...), the others dense").at_least(1);
    f.check_in_run([](const C& c, const RunContext& run) {
      gpt_family::check_mesh(c, run);
      nn::check_expert_parallel(c, run.parallel);
    });
    f.check([](const C& c) {
      if (c.moe_every > c.n_layer) {
        throw ConfigError("moe_every (" + std::to_string(c.moe_every) + ") exceeds n_layer (" +
                              std::to_string(c.n_layer) + "): no block would be a mixture of experts",
                          "moe_every");
      }
    });
  }
};

}  // namespace tessera::gpt_moe
