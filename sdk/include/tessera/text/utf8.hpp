// Text that must be valid UTF-8 (what rewards read, JSON written): bytes a byte-level tokenizer
// decoded may cut a character or be no UTF-8 at all.
#pragma once

#include <string>
#include <string_view>

#include "tessera/export.hpp"

namespace tessera::text {

// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD, as Python's
// bytes.decode("utf-8", errors="replace") and Hugging Face tokenizers' decode write it.
TESSERA_API std::string replace_invalid_utf8(std::string_view bytes);

}  // namespace tessera::text
