// Model `gpt`: a GPT-2 style decoder-only transformer (gpt_family.hpp, a family spec over the
// SDK's kit): pre-norm blocks with causal attention and a 4x GELU MLP, the output head the token
// embedding again. Imports and exports Hugging Face's GPT2LMHeadModel. Splits over tensor-,
// context- and pipeline-parallel ranks as the kit's decoder does.
#include "gpt_family.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::gpt_family::GptConfig;

struct GptYaml : GptConfig {
  static void declare(tessera::ConfigFields<GptYaml>& f) {
    tessera::gpt_family::declare_gpt_fields(f, "dropout on embeddings, attention and residual branches",
                                            "biases in linear layers and layer norms");
  }
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptYaml>(
      "gpt", "GPT-2 style decoder-only transformer with tied head",
      tessera::nn::family_factory<GptYaml>(tessera::gpt_family::settled_by_init_from, &GptConfig::check_mesh,
                                           &tessera::gpt_family::family));
}

}  // namespace

TESSERA_PLUGIN("model_gpt", "0.1.0", register_components)
