#include "regex_splitter.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "tessera/error.hpp"

namespace tessera::bpe {

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

// One match-data block per thread and pattern, reused across calls.
struct MatchData {
  pcre2_match_data* data = nullptr;
  const void* owner = nullptr;
  ~MatchData() {
    if (data) pcre2_match_data_free(data);
  }
};

}  // namespace

RegexSplitter::RegexSplitter(const std::string& pattern) : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                  &error, &offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw Error("pre-tokenizer pattern " + pattern + ": " + reinterpret_cast<const char*>(message) + " at offset " +
                std::to_string(offset));
  }
  // JIT where the platform has it; the interpreter otherwise (same results, slower).
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  thread_local MatchData match;
  if (match.owner != this || !match.data) {
    if (match.data) pcre2_match_data_free(match.data);
    match.data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
    match.owner = this;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0, emitted = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("pre-tokenizer pattern " + pattern_ + ": matching failed (" + std::to_string(rc) + ")");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
    const std::size_t begin = ovector[0], end = ovector[1];
    if (begin > emitted) piece(text.substr(emitted, begin - emitted));  // the stretch between matches
    if (end > begin) {
      piece(text.substr(begin, end - begin));
      emitted = start = end;
    } else {
      // An empty match: step over one character (UTF-8 continuation bytes are 10xxxxxx).
      emitted = begin;
      start = begin + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  if (emitted < text.size()) piece(text.substr(emitted));
}

void check_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    std::uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2, code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, code = c & 0x07;
    } else {
      throw Error("invalid UTF-8 at byte " + std::to_string(i));
    }
    if (i + length > text.size()) throw Error("invalid UTF-8 at byte " + std::to_string(i) + " (truncated sequence)");
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) throw Error("invalid UTF-8 at byte " + std::to_string(i));
      code = (code << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    const std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < smallest[length] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
      throw Error("invalid UTF-8 at byte " + std::to_string(i));
    }
    i += length;
  }
}

}  // namespace tessera::bpe
