// The YAML fields every decoder-only transformer has, declared once for every kit model: the
// vocabulary, blocks, heads, width, longest sequence, dropout, the init scale and activation
// checkpointing. A model's config derives from DecoderFields (and nn::MoeFields for experts) and
// adds what its family has besides; YAML keys, defaults, docs and limits are then the same in
// every model.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/run/parallel_dims.hpp"
#include "tessera/run/context.hpp"

namespace tessera::nn {

struct DecoderFields {
  std::int64_t vocab_size = 256;
  // The embedding and head hold the vocabulary padded: to a multiple of this × tp (Megatron-LM's
  // make-vocab-size-divisible-by), at least to a multiple of tp. The padding is never saved.
  std::int64_t pad_vocab_to_multiple_of = 1;
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  std::int64_t max_seq_len = 256;
  double dropout = 0.0;
  double init_std = 0.02;
  // Blocks recompute their activations in backward instead of keeping them: every
  // activation_checkpointing_every-th block (0, k, 2k, ...) when on.
  bool activation_checkpointing = false;
  std::int64_t activation_checkpointing_every = 1;
};

// Heads n_embd / n_head wide unless head_dim says otherwise (0: derived), query heads grouped
// over key/value heads, each head's size even for the rotation: the checks of grouped-query
// attention with rotary positions.
inline void check_grouped_heads(std::int64_t n_embd, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                std::int64_t head_size) {
  if (head_dim == 0 && n_embd % heads != 0) {
    throw ConfigError("n_embd (" + std::to_string(n_embd) + ") must be divisible by n_head (" + std::to_string(heads) +
                          "), or set head_dim",
                      "n_embd");
  }
  if (kv_heads < 1 || heads % kv_heads != 0) {
    throw ConfigError("n_head (" + std::to_string(heads) + ") must be a multiple of n_kv_head (" +
                          std::to_string(kv_heads) + ")",
                      "n_kv_head");
  }
  if (head_size % 2 != 0) throw ConfigError("the head size must be even for rotary embeddings", "head_dim");
}

// What the fields mean differs a little between families; the docs say so.
struct DecoderDocs {
  const char* n_head = "attention heads per block";
  const char* n_embd = "width of the residual stream (divisible by n_head)";
  const char* max_seq_len = "longest sequence";
  const char* dropout = "dropout";

  // A decoder with rotary positions (the Llama lineage): its sequence length sizes the tables.
  static DecoderDocs rotary(const char* heads, const char* attention_dropout) {
    DecoderDocs docs;
    docs.n_head = heads;
    docs.n_embd = "width of the residual stream";
    docs.max_seq_len = "longest sequence (rotary tables are built for it)";
    docs.dropout = attention_dropout;
    return docs;
  }
};

// Declares the fields, and that the model splits over tensor-, context- and pipeline-parallel
// ranks (the kit's DecoderModel does).
template <class Config>
void declare_decoder_fields(ConfigFields<Config>& f, const DecoderDocs& docs) {
  using D = DecoderFields;
  f.field("vocab_size", &D::vocab_size, "number of token ids").at_least(1);
  f.field("pad_vocab_to_multiple_of", &D::pad_vocab_to_multiple_of,
          "the embedding's and head's rows on each tensor-parallel rank are a multiple of it (64: GPT-2's 50257 as 50304 "
          "on one rank, kernel-friendly); the padded rows take no probability and are never saved")
      .at_least(1);
  f.field("n_layer", &D::n_layer, "transformer blocks").at_least(1);
  f.field("n_head", &D::n_head, docs.n_head).at_least(1);
  f.field("n_embd", &D::n_embd, docs.n_embd).at_least(1);
  f.field("max_seq_len", &D::max_seq_len, docs.max_seq_len).at_least(1);
  f.field("dropout", &D::dropout, docs.dropout).at_least(0).less_than(1);
  f.field("init_std", &D::init_std, "standard deviation of the normal weight init").greater_than(0);
  f.field("activation_checkpointing", &D::activation_checkpointing,
          "recompute block activations in backward instead of keeping them (less memory, about a third more compute)");
  f.field("activation_checkpointing_every", &D::activation_checkpointing_every,
          "with activation_checkpointing: checkpoint blocks 0, k, 2k, ... (1: every block)")
      .at_least(1);
  f.splits_over(MeshAxis::tp);
  f.splits_over(MeshAxis::cp);
  f.splits_over(MeshAxis::pp);
}

// The tail of a kit model's declaration: `init_from` (documented by `doc`), the record of the
// fields the YAML gave, the config's own `check`, the sequence-parallel split, and the mesh rules
// (`check_mesh(settled, run, yaml)`) on the sizes `settle` takes from init_from's config.json,
// so that `tessera validate` refuses what the factory will. `Base` holds init_from and given.
// `sequence_slices`: the model's layers run on sequence parallelism's slices (experts that route
// whole sequences do not).
template <class Base, class Config, class Check, class Settle, class CheckMesh>
void declare_init_from(ConfigFields<Config>& f, const std::string& doc, Check check, Settle settle,
                       CheckMesh check_mesh, bool sequence_slices = true) {
  f.field("init_from", &Base::init_from, doc).existing_path();
  f.record_given(&Base::given);
  f.check(check);
  if (sequence_slices) f.splits_sequence();
  f.check_in_run([=](const Base& c, const RunContext& run) { check_mesh(settle(c), run, c); });
}

}  // namespace tessera::nn
