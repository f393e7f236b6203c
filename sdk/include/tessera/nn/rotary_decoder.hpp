// The decoder of the Llama lineage (Llama, Mistral, Qwen, DeepSeek): a DecoderModel with Hugging
// Face's parts and names around the blocks a family builds: the token embedding `embed_tokens`
// (vocabulary-parallel; on the first pipeline stage, and on the last when the head is tied), the
// blocks under `layers`, a final RMSNorm `norm` and an output head `lm_head` (or the embedding,
// tied) on the last stage, and rotary tables for every pass. A family says what its blocks are,
// its weight-name table and its config.json; import, export, Llama's init and the pipeline's
// parts are here once.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/decoder.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera::nn {

struct RotaryDecoderParts {
  std::int64_t vocab_size = 0;
  std::int64_t hidden = 0;
  double norm_eps = 1e-5;  // the final norm's
  bool tied = false;       // the head is the token embedding
  // The rotary embeddings the blocks' attention reads (AttentionSpec::rotary indexes them): one,
  // or Gemma 3's two (the sliding layers' base and the global layers').
  std::vector<RotarySpec> rotaries;
  // The token embedding's output is multiplied by it (Gemma: sqrt(hidden), in the weight's dtype).
  double embedding_scale = 1.0;
  RmsWeight norm_weight = RmsWeight::scale;  // the final norm's
};

class TESSERA_API RotaryDecoderModel : public DecoderModel {
 protected:
  // Registers the embedding (where this rank's stages need it) and the `layers` container.
  RotaryDecoderModel(DecoderSpec spec, const RotaryDecoderParts& parts, TensorParallel tp, ContextParallel cp,
                     ExpertParallel ep, const RunContext& run);

  // Where the family's blocks go: add_block(layers(), i, ...).
  torch::nn::Module& layers() { return *layers_; }

  // After the blocks: the final norm and the head (last stage) and their splits; the initial
  // weights, then `hf`'s (by `names`, `num_experts` per stack; `also_ignored`: its tensors that
  // are not this model's weights) or, from `init_from` without a Hugging Face folder, a Tessera
  // export's or safetensors file's.
  void finish(const HfCheckpoint* hf, const std::string& init_from, const HfWeightNames& names,
              std::int64_t num_experts, const std::function<bool(const std::string&)>& also_ignored = {});

  // config.json, the tensors by `names` and the imported checkpoint's tokenizer files.
  HfExport hf_export(const StateDict& state, const HfWeightNames& names, std::string config_json) const;
  // The imported config.json's bos/eos/pad ids (hf_import::special_token_ids; "" when not imported).
  const std::string& special_ids() const { return special_ids_; }

  // Llama's init: normal(0, init_std) for projections and embeddings, the residual outputs
  // (o_proj, down_proj, Mixtral's w2) scaled by 1/sqrt(2 n_layer), norms at one, biases at zero;
  // each tensor from its own generator.
  void initialize_llama_style(const std::vector<at::Tensor>& params, double init_std, std::int64_t n_layer);

  at::Tensor embed(const at::Tensor& input_ids, const ForwardInputs& inputs) override;
  void complete_inputs(ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) override;
  at::Tensor final_norm(const at::Tensor& x) override;
  at::Tensor head_weight() override;

 private:
  RotaryDecoderParts parts_;
  std::vector<RotaryEmbedding> rotaries_;  // derived from the config: neither parameters nor state
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<torch::nn::Module> layers_;
  std::shared_ptr<RmsNorm> norm_;
  std::shared_ptr<Linear> lm_head_;  // null when tied
  std::vector<std::string> tokenizer_files_;
  std::string special_ids_;
};

}  // namespace tessera::nn
