// Kind `tokenizer`: text to token ids and back. tokenizer/bytes, tokenizer/bpe and
// tokenizer/sentencepiece provide it; callback/sample_text, `tessera prepare-data` and the
// datasets that tokenise consume it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

class TESSERA_API Tokenizer {
 public:
  static constexpr const char* kKind = "tokenizer";
  virtual ~Tokenizer();

  // Text (UTF-8) to ids; tessera::Error for text the tokenizer cannot take (invalid UTF-8).
  // BOS and EOS only where the tokenizer's config says to add them; otherwise the caller places
  // them (bos_id(), eos_id()), as `tessera prepare-data` places EOS between documents.
  virtual std::vector<std::int64_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;

  // The id of a token given by its text (a special token such as <|endoftext|>); -1 if none.
  virtual std::int64_t token_id(const std::string& /*token*/) const { return -1; }
  // The end-of-document and beginning-of-document ids; -1 when the tokenizer has none.
  virtual std::int64_t eos_id() const { return -1; }
  virtual std::int64_t bos_id() const { return -1; }
  // encode(text), and for each id the bytes [begin, end) of `text` it stands for (a BOS or EOS the
  // tokenizer adds: an empty range at the start or the end). Datasets mark targets by text
  // position with it (a chat template's assistant turns). The default decodes the ids one by one,
  // which holds where every token decodes to its own bytes (byte-level BPE, bytes); it throws
  // std::runtime_error where the pieces do not add up to the text.
  virtual std::vector<std::int64_t> encode_with_offsets(const std::string& text,
                                                        std::vector<std::pair<std::size_t, std::size_t>>& offsets) const {
    std::vector<std::int64_t> ids = encode(text);
    offsets.clear();
    std::size_t at = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::string piece = decode({ids[i]});
      if (text.compare(at, piece.size(), piece) == 0) {
        offsets.emplace_back(at, at + piece.size());
        at += piece.size();
      } else if ((i == 0 && ids[i] == bos_id()) || (i + 1 == ids.size() && ids[i] == eos_id())) {
        offsets.emplace_back(at, at);  // added by encode(), not in the text
      } else {
        throw std::runtime_error("the tokenizer's token " + std::to_string(i) + " does not spell the text back, so " +
                                 "it cannot tell which bytes each token covers");
      }
    }
    if (at != text.size()) throw std::runtime_error("the tokenizer's tokens do not spell the whole text back");
    return ids;
  }
  // The folder holding the tokenizer's files (tokenizer.json, tokenizer_config.json, a
  // chat_template.jinja), where datasets look for the model's chat template; empty if none.
  virtual std::string folder() const { return {}; }

  // What a prepared token file records of the tokenizer that made it: its variant and a
  // checksum of its files, so a mismatch with the run's tokenizer can be told.
  virtual std::string identity() const { return "unknown"; }
};

// Text that writes its own special tokens (a rendered chat template: its BOS, its turn markers)
// to ids, as transformers' apply_chat_template(tokenize=True) encodes it (add_special_tokens off):
// what encode() adds beyond the text (a BOS or EOS covering no bytes) is left out. `offsets`, when
// given, gets each kept id's bytes of `text`. Throws std::runtime_error as encode_with_offsets does.
TESSERA_API std::vector<std::int64_t> encode_written_text(const Tokenizer& tokenizer, const std::string& text,
                                                          std::vector<std::pair<std::size_t, std::size_t>>* offsets = nullptr);

}  // namespace tessera
