// tokenizer/bytes through the real loader, and the plugin-defined kind `tokenizer` as another
// plugin (callback/sample_text) consumes it.
#include <gtest/gtest.h>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/components/tokenizer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace bytes_test {

TEST(TokenizerBytes, RoundTripsBytesAndMarksLargeIds) {
  auto b = testing::build_components("tok: {component_key: tokenizer, variant_key: bytes}\n");
  auto tokenizer = testing::built<Tokenizer>(b, "tok");
  const std::string text = "Hé\n\x01";
  const auto ids = tokenizer->encode(text);
  EXPECT_EQ(ids, (std::vector<std::int64_t>{72, 195, 169, 10, 1}));
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_EQ(tokenizer->decode({65, 300, -1}), "A<300><-1>");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
}

TEST(TokenizerBytes, IsAKindTheHostKnowsOnlyByName) {
  const ComponentInfo* info = testing::bundled_plugins().registry().find("tokenizer", "bytes");
  ASSERT_NE(info, nullptr);
  EXPECT_NE(info->origin.find("libtessera_tokenizer_bytes.so"), std::string::npos);
}

TEST(TokenizerBytes, ConsumerRejectsAComponentOfAnotherKind) {
  const std::string error = testing::validation_error(
      "loss: {component_key: loss, variant_key: cross_entropy}\n"
      "s: {component_key: callback, variant_key: sample_text, config: {tokenizer: {instance_key: loss}}}\n");
  EXPECT_NE(error.find("expected a component of kind tokenizer, but components.loss is a loss"), std::string::npos)
      << error;
  EXPECT_NE(testing::validation_error("s: {component_key: callback, variant_key: sample_text}\n")
                .find("s.config.tokenizer: required component (kind tokenizer) is missing"),
            std::string::npos);
}

}  // namespace bytes_test
}  // namespace tessera
