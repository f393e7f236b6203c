// Kind `tokenizer`: text to token ids and back. A kind defined by plugins, not by the SDK:
// tokenizer/bytes provides it and callback/sample_text consumes it. Anything that includes this
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

  virtual std::vector<std::int64_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
};

}  // namespace tessera::kinds
