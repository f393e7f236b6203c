// Kind `tokenizer`: text to token ids and back. A kind defined by plugins, not by the SDK:
// tokenizer/bytes, tokenizer/bpe and tokenizer/sentencepiece provide it; callback/sample_text,
// `tessera prepare-data` and the datasets that tokenise consume it. Anything that includes this
// header can produce or consume the kind; the host only sees the kind name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::kinds {

class Tokenizer {
 public:
  static constexpr const char* kKind = "tokenizer";
  virtual ~Tokenizer() = default;

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
  // What a prepared token file records of the tokenizer that made it: its variant and a
  // checksum of its files, so a mismatch with the run's tokenizer can be told.
  virtual std::string identity() const { return "unknown"; }
};

}  // namespace tessera::kinds
