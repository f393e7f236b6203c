// Model `gpt_moe`: the GPT-2 decoder of model/gpt (gpt_family.hpp) whose feed-forward layers are,
// every moe_every-th block, mixtures of GELU experts (the kit's GeluExperts: top-k routing,
// optional capacity, the Switch load-balancing and router z-losses). It reports its routing to
// monitors through tessera::MoeRouting. Splits over tensor-, context-, expert- and
// pipeline-parallel ranks; starts from a Tessera export or safetensors file with init_from.
#include "gpt_family.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::gpt_family::GptConfig;
using tessera::gpt_family::GptMoeConfig;

struct GptMoeYaml : GptMoeConfig {
  static void declare(tessera::ConfigFields<GptMoeYaml>& f) {
    using C = GptConfig;
    tessera::gpt_family::declare_gpt_fields(f, "dropout on embeddings, attention, residual branches and expert outputs",
                                            "biases in linear layers (the router has none) and layer norms");
    tessera::nn::declare_moe_fields(f, {"experts per MoE layer (E)", /*dense_allowed=*/false, "MoE layers"});
    f.field("expert_hidden", &C::expert_hidden, "hidden width of each expert's MLP; 0 = 4 x n_embd").at_least(0);
    f.field("moe_every", &C::moe_every, "every Nth block is MoE (blocks N-1, 2N-1, ...), the others dense").at_least(1);
  }
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptMoeYaml>(
      "gpt_moe", "GPT-2 style decoder with top-k mixture-of-experts feed-forward layers",
      tessera::nn::family_factory<GptMoeYaml>(tessera::gpt_family::settled_by_init_from, &GptConfig::check_mesh,
                                              &tessera::gpt_family::family));
}

}  // namespace

TESSERA_PLUGIN("model_gpt_moe", "0.1.0", register_components)
