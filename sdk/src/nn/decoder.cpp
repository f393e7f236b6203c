#include "tessera/nn/decoder.hpp"

#include <ATen/ops/arange.h>
#include <cctype>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>

#include <algorithm>
#include <utility>

#include "tessera/nn/activation_checkpoint.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/documents.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {
namespace {

// Sequences that sequence and context parallelism split must have a length that is a multiple
// of this: 2 x cp chunks, each over the tensor-parallel ranks under sequence parallelism.
std::int64_t sequence_multiple(const TensorParallel& tp, const ContextParallel& cp) {
  return (cp.size() > 1 ? 2 * cp.size() : 1) * (tp.sequence_parallel() ? tp.size() : 1);
}

// Logits of every position for input_ids of any length (sampling grows a prompt one token at a
// time): the ids are padded at the end to the multiple the parallelism needs (causal attention:
// the padding changes no earlier position) and the padding's logits dropped. `logits_of` maps
// ids of a splittable length to their whole logits. Packed documents need splittable lengths.
template <class LogitsOf>
at::Tensor logits_of_any_length(const at::Tensor& input_ids, std::int64_t multiple, bool documents,
                                const LogitsOf& logits_of) {
  if (input_ids.dim() != 2) return logits_of(input_ids);  // the model says what is wrong with it
  const std::int64_t seq = input_ids.size(1), padded = (seq + multiple - 1) / multiple * multiple;
  if (padded == seq) return logits_of(input_ids);
  if (documents) {
    throw Error("packed documents of " + std::to_string(seq) + " positions: sequence or context parallelism needs a "
                "multiple of " + std::to_string(multiple));
  }
  const at::Tensor tail = input_ids.narrow(1, seq - 1, 1).expand({input_ids.size(0), padded - seq});
  return logits_of(at::cat({input_ids, tail}, 1)).narrow(1, 0, seq);
}

}  // namespace

namespace {

// The model's name as a class's: "model/gpt_moe" is GptMoe.
std::string module_name(const std::string& kind) {
  std::string name;
  bool upper = true;
  for (const char ch : kind.substr(kind.find('/') + 1)) {
    if (ch == '_') {
      upper = true;
      continue;
    }
    name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    upper = false;
  }
  return name;
}

}  // namespace

DecoderModel::DecoderModel(DecoderSpec spec, TensorParallel tp, ContextParallel cp, ExpertParallel ep,
                           const RunContext& run)
    : Model(module_name(spec.kind)),
      spec_(std::move(spec)),
      tp_(std::move(tp)),
      cp_(std::move(cp)),
      ep_(std::move(ep)),
      pp_(PipelineParallel::of(run, spec_.n_layer)),
      init_seed_(draw_init_seed()) {}

std::vector<std::shared_ptr<torch::nn::Module>> DecoderModel::sharding_units() {
  return {blocks_.begin(), blocks_.end()};
}

OutputHead DecoderModel::output_head() {
  OutputHead head{head_weight(), {}};
  head.vocab_size = spec_.vocab_size;  // the head's rows past it are padding (TensorParallel::vocab_rows)
  head.logit_softcap = spec_.logit_softcap;
  if (tp_.size() > 1) {
    head.vocab_group = tp_.group();
    head.vocab_start = tp_.vocab_start(spec_.vocab_size, spec_.vocab_multiple);
  }
  return head;
}

std::vector<std::string> DecoderModel::pipeline_tied_parameters() const {
  if (pp_.size() == 1 || spec_.tied_embedding.empty()) return {};
  return {spec_.tied_embedding};
}

double DecoderModel::flops_per_token(std::int64_t seq_len) const {
  return 6.0 * flop_params_ + 12.0 * static_cast<double>(spec_.n_layer) *
                                  static_cast<double>(spec_.attention_width) * static_cast<double>(seq_len);
}

void DecoderModel::complete_inputs(ForwardInputs&, const at::Tensor&, const at::Tensor&) {}

void DecoderModel::add_block(torch::nn::Module& container, std::int64_t index,
                             const std::function<std::shared_ptr<TransformerBlock>()>& make) {
  if (!pp_.holds_block(index)) return;
  blocks_.push_back(container.register_module(std::to_string(index), make()));
  block_index_.push_back(index);
  if (MoeLayer* experts = blocks_.back()->experts()) {
    moe_layers_.push_back(experts);
    moe_blocks_.push_back(index);
  }
}

TransformerShape DecoderModel::decoder_shape() const {
  TransformerShape shape;
  shape.blocks = spec_.n_layer;
  for (std::int64_t block = 0; block < spec_.n_layer; ++block) {
    if (checkpoints_block(spec_.activation_checkpointing, spec_.activation_checkpointing_every, block)) {
      shape.checkpointed_blocks.push_back(block);
    }
  }
  return shape;
}

std::vector<RouterStatistics> DecoderModel::router_statistics() {
  std::vector<RouterStatistics> out;
  for (std::size_t i = 0; i < moe_layers_.size(); ++i) {
    out.push_back(moe_layers_[i]->take_statistics());
    out.back().layer = moe_blocks_[i];
  }
  return out;
}

at::Tensor DecoderModel::compute(const at::Tensor& input_ids) {
  // Split over tensor-parallel ranks, each computes its vocabulary's logits, gathered whole here
  // (the loss never asks for them: it takes the hidden states and the head).
  return logits_of_any_length(input_ids, sequence_multiple(tp_, cp_), document_ids().defined(),
                              [&](const at::Tensor& ids) {
                                const at::Tensor logits = at::linear(compute_hidden(ids), head_weight());
                                return softcapped(cp_.gather(tp_.gather_vocabulary(logits, spec_.vocab_size)),
                                                  spec_.logit_softcap);
                              });
}

at::Tensor DecoderModel::compute_hidden(const at::Tensor& input_ids) {
  if (pp_.size() > 1) {
    throw Error(spec_.kind + ": compute_hidden runs the whole model, but under pipeline parallelism this rank holds "
                "some blocks only (Model::forward_stage runs them)");
  }
  check_input(input_ids);
  ForwardInputs inputs = inputs_of(input_ids);
  at::Tensor x = embed(input_ids, inputs);
  complete_inputs(inputs, input_ids, x);
  x = run_blocks(x, 0, spec_.n_layer, inputs);
  collect_auxiliary_loss(0, spec_.n_layer);
  // The whole sequence, replicated (its gradient summed over the ranks): every tensor-parallel
  // rank computes its vocabulary's logits of every token.
  return tp_.column_input(final_norm(x));
}

at::Tensor DecoderModel::compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden) {
  const PipelineStage& stage = pp_.local_stages().at(local_stage);
  check_input(input_ids);
  ForwardInputs inputs = inputs_of(input_ids);
  at::Tensor x = stage.first ? embed(input_ids, inputs) : hidden;
  complete_inputs(inputs, input_ids, x);
  x = run_blocks(x, stage.first_block, stage.end_block, inputs);
  collect_auxiliary_loss(stage.first_block, stage.end_block);
  return stage.last ? tp_.column_input(final_norm(x)) : x;
}

std::int64_t DecoderModel::decode_slots(std::int64_t n) const {
  const std::int64_t multiple = sequence_multiple(tp_, cp_);
  return (n + multiple - 1) / multiple * multiple;
}

at::Tensor DecoderModel::compute_decode(const at::Tensor& tokens, const at::Tensor& positions, KvCache& cache,
                                       bool last_only) {
  if (pp_.size() > 1 || cp_.size() > 1) {
    throw Error(spec_.kind + ": generation runs the whole model on each rank's whole sequences; set parallelism.pp "
                "and parallelism.cp to 1 to generate");
  }
  if (tokens.dim() != 2 || positions.sizes() != tokens.sizes()) {
    throw Error(spec_.kind + ": decode takes tokens and positions of one shape [batch, n]");
  }
  if (positions.device().is_cpu() && positions.numel() > 0 && positions.max().item<std::int64_t>() >= spec_.max_seq_len) {
    throw Error(spec_.kind + ": position " + std::to_string(positions.max().item<std::int64_t>()) +
                " is past max_seq_len " + std::to_string(spec_.max_seq_len));
  }
  // Sequence parallelism splits the pass over the ranks: padded at its end with slots of no key.
  const std::int64_t n = tokens.size(1), multiple = sequence_multiple(tp_, cp_);
  const std::int64_t padded = (n + multiple - 1) / multiple * multiple;
  at::Tensor ids = tokens, where = positions;
  if (padded != n) {
    ids = at::cat({tokens, tokens.narrow(1, n - 1, 1).expand({tokens.size(0), padded - n})}, 1);
    where = at::cat({positions, at::full({positions.size(0), padded - n}, -1, positions.options())}, 1);
  }
  cache.begin_pass(where);
  try {
    ForwardInputs inputs;
    inputs.positions = cache.pass_positions();
    at::Tensor x = embed(ids, inputs);
    complete_inputs(inputs, ids, x);
    inputs.attention.cache = &cache;
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      AttentionInputs layer = inputs.attention;
      layer.cache_layer = static_cast<std::size_t>(block_index_[i]);
      x = run_unit(i, x, [&](const at::Tensor& h) { return blocks_[i]->forward(h, layer); });
    }
    at::Tensor hidden = tp_.column_input(final_norm(x)).narrow(1, last_only ? n - 1 : 0, last_only ? 1 : n);
    const at::Tensor logits = tp_.gather_vocabulary(at::linear(hidden, head_weight()), spec_.vocab_size);
    cache.end_pass();
    return softcapped(logits, spec_.logit_softcap);
  } catch (...) {
    cache.abandon_pass();
    throw;
  }
}

void DecoderModel::check_input(const at::Tensor& input_ids) const {
  if (input_ids.dim() != 2) {
    throw Error(spec_.kind + ": input_ids must be [batch, seq], got " + std::to_string(input_ids.dim()) + " dimensions");
  }
  const std::int64_t seq = input_ids.size(1);
  if (seq > spec_.max_seq_len) {
    throw Error(spec_.kind + ": sequence length " + std::to_string(seq) + " exceeds max_seq_len " +
                std::to_string(spec_.max_seq_len) + "; raise max_seq_len or shorten the data's seq_len");
  }
}

ForwardInputs DecoderModel::inputs_of(const at::Tensor& input_ids) {
  // Packed documents: positions restart at each, attention stays within each (context-parallel
  // attention masks them from the document ids themselves, chunk by chunk).
  const bool sliced = cp_.size() > 1;
  ForwardInputs inputs;
  documents::Layout docs;
  if (document_ids().defined()) {
    docs = documents::layout(document_ids(), input_ids, !sliced);
    inputs.attention.mask = docs.attention_mask;
    if (sliced) inputs.attention.documents = document_ids().to(input_ids.device(), at::kLong);
  }
  if (docs.positions.defined() || sliced) {
    inputs.positions = cp_.slice(docs.positions.defined()
                                     ? docs.positions
                                     : at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0));
  }
  return inputs;
}

at::Tensor DecoderModel::run_blocks(at::Tensor x, std::int64_t first, std::int64_t end, const ForwardInputs& inputs) {
  for (std::int64_t b = first; b < end; ++b) {
    const auto it = std::lower_bound(block_index_.begin(), block_index_.end(), b);
    if (it == block_index_.end() || *it != b) {
      throw Error(spec_.kind + ": block " + std::to_string(b) + " is not on this pipeline stage");
    }
    const auto i = static_cast<std::size_t>(it - block_index_.begin());
    const std::shared_ptr<TransformerBlock>& block = blocks_[i];
    const bool checkpointed = checkpoints_block(spec_.activation_checkpointing, spec_.activation_checkpointing_every, b);
    x = run_unit(i, x, [&](const at::Tensor& h) {
      return checkpointed ? TransformerBlock::checkpointed(block, h, inputs.attention)
                          : block->forward(h, inputs.attention);
    });
  }
  return x;
}

void DecoderModel::collect_auxiliary_loss(std::int64_t first, std::int64_t end) {
  aux_loss_ = at::Tensor();
  if (spec_.aux_loss_coef <= 0 && spec_.z_loss_coef <= 0) return;
  for (std::size_t l = 0; l < moe_layers_.size(); ++l) {
    if (moe_blocks_[l] < first || moe_blocks_[l] >= end) continue;
    const at::Tensor term =
        moe_layers_[l]->last_aux_loss() * spec_.aux_loss_coef + moe_layers_[l]->last_z_loss() * spec_.z_loss_coef;
    aux_loss_ = aux_loss_.defined() ? aux_loss_ + term : term;
  }
}

}  // namespace tessera::nn
