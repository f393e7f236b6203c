// Pre-tokenisation by a regular expression, as Hugging Face's Split pre-tokenizer with the
// Isolated behaviour does it: every match is a piece, and so is every stretch between matches.
// PCRE2 (UTF-8, Unicode properties, JIT-compiled) does the matching, so \p{L}, \p{N}, \s and
// lookaheads mean what they mean to the Rust library's Oniguruma.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace tessera::bpe {

class RegexSplitter {
 public:
  // Throws tessera::Error naming the pattern when PCRE2 cannot compile it.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls `piece` for each piece of `text`, in order; together they are exactly `text`. `text`
  // must be valid UTF-8 (callers check: tessera::bpe::check_utf8). Thread-safe.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

// Throws tessera::Error("invalid UTF-8 at byte N ...") unless `text` is valid UTF-8.
void check_utf8(std::string_view text);

// GPT-2's pre-tokenizer pattern (Hugging Face's ByteLevel with use_regex).
inline const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace tessera::bpe
