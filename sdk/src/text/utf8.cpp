// U+FFFD for ill-formed UTF-8 (tessera/text/utf8.hpp), by Unicode's "maximal subpart" rule.
#include "tessera/text/utf8.hpp"

#include <cstdint>

namespace tessera::text {

std::string replace_invalid_utf8(std::string_view bytes) {
  static constexpr const char* kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<std::uint8_t>(bytes[i]);
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    // The sequence's length and the range its second byte must lie in (the others: 80..BF).
    std::size_t length = 0;
    std::uint8_t low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;   // no overlong forms
      if (lead == 0xED) high = 0x9F;  // no surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
    }
    // `end`: one past the bytes that continue the sequence well.
    std::size_t end = i + 1;
    while (length > 0 && end < i + length && end < bytes.size()) {
      const auto b = static_cast<std::uint8_t>(bytes[end]);
      if (b < (end == i + 1 ? low : 0x80) || b > (end == i + 1 ? high : 0xBF)) break;
      ++end;
    }
    const bool whole = length > 0 && end == i + length;
    if (whole) {
      out.append(bytes.substr(i, length));
      i += length;
    } else {
      out += kReplacement;  // the bytes read so far; the one that broke the sequence starts anew
      i = length > 0 ? end : i + 1;
    }
  }
  return out;
}

}  // namespace tessera::text
