// A decoder-only language model built from the kit: the base every kit model plugin derives
// from, which owns what does not differ between families. It holds this rank's blocks
// (TransformerBlock) and runs them: the whole model (compute_hidden) or one pipeline stage
// (compute_stage: the blocks a stage holds, the embedding on the first, the final norm on the
// last), each block one of fsdp's sharding units, checkpointed as the spec says; packed documents'
// positions and masks, context-parallel slices; the vocabulary-parallel output head (tied to the
// token embedding or not, and tied across pipeline stages); the mixture-of-experts layers'
// auxiliary losses and statistics; the input checks; the FLOP count 6N + 12·L·W·T.
//
// A family says how it differs: its parameters (registered in its constructor, in its
// checkpoints' names, with add_block for the blocks), its embedding and final norm, its head's
// weight, optional rotary tables, its initialisation rule and its Hugging Face mapping.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/block.hpp"
#include "tessera/nn/decoder_fields.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"

namespace tessera::nn {

struct DecoderSpec {
  std::string kind;  // "model/gpt": what messages call the model
  std::int64_t vocab_size = 0;
  // The embedding's and head's rows per tensor-parallel rank are a multiple of it, the vocabulary
  // padded (TensorParallel::vocab_rows): pad_vocab_to_multiple_of.
  std::int64_t vocab_multiple = 1;
  std::int64_t max_seq_len = 0;
  std::int64_t n_layer = 0;
  std::int64_t attention_width = 0;  // query heads x head size: attention's FLOPs per token and key
  bool activation_checkpointing = false;
  std::int64_t activation_checkpointing_every = 1;  // checkpoint blocks 0, k, 2k, ...
  // The token embedding's parameter when it is also the output head ("wte.weight"): the first
  // and last pipeline stages both hold it (Model::pipeline_tied_parameters). Empty: untied.
  std::string tied_embedding;
  // The weights of the mixture-of-experts layers' balance and z-losses (Model::auxiliary_loss).
  double aux_loss_coef = 0.0;
  double z_loss_coef = 0.0;
  // The logits capped as cap · tanh(logits / cap) (Gemma 2's final_logit_softcapping). 0: none.
  double logit_softcap = 0.0;

  // The spec from a config's decoder fields: sizes and checkpointing; attention_width n_embd
  // (a model whose heads are not n_embd / n_head wide sets its own).
  static DecoderSpec of(const std::string& kind, const DecoderFields& fields) {
    DecoderSpec spec;
    spec.kind = kind;
    spec.vocab_size = fields.vocab_size;
    spec.vocab_multiple = fields.pad_vocab_to_multiple_of;
    spec.max_seq_len = fields.max_seq_len;
    spec.n_layer = fields.n_layer;
    spec.attention_width = fields.n_embd;
    spec.activation_checkpointing = fields.activation_checkpointing;
    spec.activation_checkpointing_every = fields.activation_checkpointing_every;
    return spec;
  }
};

// What one forward pass's embedding and blocks get of its packed documents and positions.
struct ForwardInputs {
  AttentionInputs attention;
  // This rank's global positions [batch or 1, seq / cp] where documents restart them or context
  // parallelism slices the sequence; undefined: 0 .. seq - 1.
  at::Tensor positions;
};

class TESSERA_API DecoderModel : public Model {
 public:
  TensorParallelPlan tensor_parallel_plan() const override { return plan_; }
  // fsdp gathers one block at a time; the embeddings, final norm and head for the whole pass.
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() override;
  bool has_output_head() const override { return true; }
  OutputHead output_head() override;
  std::vector<std::string> pipeline_tied_parameters() const override;
  bool masks_documents() const override { return true; }
  std::int64_t vocab_size() const override { return spec_.vocab_size; }
  std::int64_t max_seq_len() const override { return spec_.max_seq_len; }
  // 6N + 12·L·W·T (PaLM appendix B): N as the model sets it (set_flop_parameters), W the
  // attention width.
  double flops_per_token(std::int64_t seq_len) const override;
  at::Tensor auxiliary_loss() override { return aux_loss_; }
  // Every kit model decodes from a KV cache: on one rank, under tensor parallelism (each rank its
  // heads' keys and values), ddp and fsdp; not as pipeline stages or context-parallel slices.
  bool decodes() const override { return true; }
  std::int64_t decode_slots(std::int64_t n) const override;

 protected:
  // `run`: its pipeline stages (of spec.n_layer blocks); this rank holds their blocks only.
  DecoderModel(DecoderSpec spec, TensorParallel tp, ContextParallel cp, ExpertParallel ep, const RunContext& run);

  // The first stage: this rank's part of the residual stream from the token ids (the whole
  // sequence's; under context parallelism the model takes its slice, cp_.slice).
  virtual at::Tensor embed(const at::Tensor& input_ids, const ForwardInputs& inputs) = 0;
  // Adds what the model's attention needs besides documents (rotary tables, in the dtype of
  // `stream`, the residual stream entering the blocks).
  virtual void complete_inputs(ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream);
  // The last stage's final norm.
  virtual at::Tensor final_norm(const at::Tensor& x) = 0;
  // The output head's weight [this rank's vocabulary rows, hidden] (the token embedding when tied).
  virtual at::Tensor head_weight() = 0;

  // In the model's constructor: block `index` from `make`, registered in `container` under its
  // index, when this rank's stages hold it (else nothing is built).
  void add_block(torch::nn::Module& container, std::int64_t index,
                 const std::function<std::shared_ptr<TransformerBlock>()>& make);
  // The model's N for FLOPs per token: the whole model's, whatever part of it this rank holds.
  void set_flop_parameters(double n) { flop_params_ = n; }
  // The shape fields every block shares: blocks and the checkpointed ones.
  TransformerShape decoder_shape() const;
  // The router statistics of this rank's mixture-of-experts layers (MoeRouting), by block.
  std::vector<RouterStatistics> router_statistics();
  // This rank's mixture-of-experts layers, in block order.
  const std::vector<MoeLayer*>& moe_layers() const { return moe_layers_; }

  at::Tensor compute(const at::Tensor& input_ids) override;
  at::Tensor compute_hidden(const at::Tensor& input_ids) override;
  at::Tensor compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden) override;
  // Under sequence parallelism a pass is padded at its end to a multiple of the tensor-parallel
  // ranks: slots without a key, which the cache's capacity must allow for.
  at::Tensor compute_decode(const at::Tensor& tokens, const at::Tensor& positions, KvCache& cache,
                            bool last_only) override;

  const DecoderSpec spec_;
  TensorParallel tp_;
  ContextParallel cp_;
  ExpertParallel ep_;
  PipelineParallel pp_;
  TensorParallelPlan plan_;  // filled by the model as it builds its layers
  std::uint64_t init_seed_;

 private:
  void check_input(const at::Tensor& input_ids) const;
  ForwardInputs inputs_of(const at::Tensor& input_ids);
  at::Tensor run_blocks(at::Tensor x, std::int64_t first, std::int64_t end, const ForwardInputs& inputs);
  void collect_auxiliary_loss(std::int64_t first, std::int64_t end);

  std::vector<std::shared_ptr<TransformerBlock>> blocks_;  // this rank's, in order
  std::vector<std::int64_t> block_index_;                  // each one's index in the whole model
  std::vector<MoeLayer*> moe_layers_;                      // the experts of this rank's blocks
  std::vector<std::int64_t> moe_blocks_;                   // their block indices
  at::Tensor aux_loss_;
  double flop_params_ = 0;
};

}  // namespace tessera::nn
