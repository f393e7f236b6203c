// Model `gpt`: a GPT-2 style decoder-only transformer (gpt_family.hpp, on the SDK's transformer
// kit): pre-norm blocks with causal attention and a 4x GELU MLP, the output head the token
// embedding again. Imports and exports Hugging Face's GPT2LMHeadModel (gpt2_format.hpp). Splits
// over tensor-, context- and pipeline-parallel ranks as the kit's DecoderModel does.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/nn/deferred_init.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/components/model.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/mlp.hpp"
#include "tessera/plugin.hpp"
#include "gpt2_format.hpp"
#include "gpt_family.hpp"

namespace {

using tessera::gpt2_format::GptConfig;

class Gpt final : public tessera::gpt_family::GptDecoder {
 public:
  // `hf`: a Hugging Face GPT-2 folder to take the weights from (c.init_from), already read.
  Gpt(const GptConfig& c, const tessera::HfCheckpoint* hf, tessera::TensorParallel tp, tessera::ContextParallel cp,
      const tessera::RunContext& run)
      : GptDecoder(c, {"model/gpt"}, std::move(tp), std::move(cp), {}, run, dense_mlp(c)), config_(c) {
    // Deferred (built by the host for a run): the parameters are shapes on the meta device until
    // the trainer or fsdp gives them storage and asks initialize_parameters for their values.
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    if (hf) {
      tessera::gpt2_format::import_weights(*hf, *this, plan_, tp_, /*partial=*/pp_.size() > 1);
      tokenizer_files_ = hf->tokenizer_files;
      special_ids_ = tessera::hf_import::special_token_ids(hf->config);
    } else if (!c.init_from.empty()) {
      tessera::hf_import::load_tessera_weights(*this, c.init_from, plan_, tp_, {}, /*partial=*/pp_.size() > 1);
    }
    set_flop_parameters(static_cast<double>(parameters_but_positions(tessera::gpt_family::gpt_parameter_count(c))));
  }

  // GPT2LMHeadModel has biases throughout.
  bool exports_hugging_face() const override { return config_.bias; }
  // GPT2LMHeadModel's: the blocks under transformer., their projections Conv1D ([in, out]).
  tessera::HfModuleName hugging_face_module(const std::string& module) const override {
    return tessera::gpt2_format::gpt2_names().module(module);
  }
  std::string architecture_json() const override { return tessera::gpt2_format::architecture_json(config_); }
  tessera::HfExport hugging_face_export(const tessera::StateDict& state) const override {
    tessera::HfExport out = tessera::gpt2_format::export_folder(config_, state, special_ids_);
    out.files_to_copy = tokenizer_files_;
    return out;
  }

 private:
  // Every block's MLP: 4 x n_embd GELU units (the tanh approximation with gelu_tanh).
  static tessera::gpt_family::FeedForwardChoice dense_mlp(const GptConfig& c) {
    return {[bias = c.bias](tessera::TensorParallelPlan& plan, const std::string& prefix, std::int64_t) {
              tessera::nn::GeluMlp::plan(plan, prefix + "mlp.", bias);
            },
            [c](std::int64_t, const tessera::TensorParallel& tp, const tessera::ExpertParallel&) {
              return tessera::nn::Named<tessera::nn::FeedForward>{
                  "mlp", std::make_shared<tessera::nn::GeluMlp>(c.n_embd, 4 * c.n_embd, c.bias, c.dropout,
                                                                c.activation == "gelu_tanh" ? "tanh" : "none",
                                                                tp)};
            }};
  }

  GptConfig config_;
  std::vector<std::string> tokenizer_files_;  // of an imported Hugging Face folder, carried into hf exports
  std::string special_ids_;  // the imported config.json's bos/eos/pad ids, carried into hf exports
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, GptConfig>(
      "gpt", "GPT-2 style decoder-only transformer with tied head",
      [](const GptConfig& yaml, const tessera::RunContext& run) {
        const tessera::TensorParallel tp = tessera::TensorParallel::of(run);
        const tessera::ContextParallel cp = tessera::ContextParallel::of(run);
        // What init_from's config.json settles, checked against the mesh as validate checked it.
        const GptConfig c = tessera::gpt2_format::settled_by_init_from(yaml);
        tessera::gpt_family::check_mesh(c, run);
        // Weights read from a file at construction: built whole.
        std::optional<tessera::DeferredInitSuspension> whole;
        if (!yaml.init_from.empty()) whole.emplace();
        if (!tessera::is_hf_checkpoint(yaml.init_from)) return std::make_shared<Gpt>(c, nullptr, tp, cp, run);
        const tessera::HfCheckpoint hf =
            tessera::hf_import::at_init_from([&] { return tessera::read_hf_checkpoint(yaml.init_from); });
        return std::make_shared<Gpt>(c, &hf, tp, cp, run);
      });
}

}  // namespace

TESSERA_PLUGIN("model_gpt", "0.1.0", register_components)
