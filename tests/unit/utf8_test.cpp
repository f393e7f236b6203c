// tessera::text::replace_invalid_utf8 against what Python 3.11 writes for
// bytes.decode("utf-8", errors="replace") (each expected value printed by it).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tessera/text/utf8.hpp"

namespace tessera::text {
namespace {

TEST(Utf8, IllFormedBytesAreReplacedAsPythonReplacesThem) {
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"abc", "abc"},
      {"\xff", r},
      {"\xc3\xa9", "\xc3\xa9"},
      {"\xc3", r},                         // cut after the lead byte
      {"\xe2\x82", r},                     // one maximal subpart: one replacement
      {"\xe2\x82\xac", "\xe2\x82\xac"},
      {"\xe0\x80\xaf", r + r + r},         // overlong: the lead byte alone is the subpart
      {"\xed\xa0\x80", r + r + r},         // a surrogate
      {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
      {"\xf4\x90\x80\x80", r + r + r + r},  // past U+10FFFF
      {"\xc0\xaf", r + r},
      {"a\xe2\x82" "b", "a" + r + "b"},     // the byte that broke the sequence is read anew
      {"\xf0\x9f\x98", r},
      {"\x80\x80", r + r},
  };
  for (const auto& [bytes, expected] : cases) EXPECT_EQ(replace_invalid_utf8(bytes), expected) << bytes;
}

}  // namespace
}  // namespace tessera::text
