// tokenizer/bpe without Python: GPT-2's pre-tokenizer pattern through PCRE2, UTF-8 checking, the
// merge order on a hand-made tokenizer.json, added tokens, decoding, and the files it refuses.
// (Equality with Python's `tokenizers` on a varied corpus: tests/integration/tokenizer_interop_test.cpp.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "bpe_model.hpp"
#include "regex_splitter.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace bpe_test {

std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  std::vector<std::string> out;
  bpe::RegexSplitter(pattern).split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(BpeRegexSplitter, Gpt2PatternSplitsLikeGpt2) {
  EXPECT_EQ(pieces(bpe::kGpt2Pattern, "Hello world's  123 ünïcödé!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 123", " ünïcödé", "!!", "\n"}));
  // Whitespace before a word stays with the word except one space; CJK letters are \p{L}.
  EXPECT_EQ(pieces(bpe::kGpt2Pattern, "a   b 日本"), (std::vector<std::string>{"a", "  ", " b", " 日本"}));
  // Isolated: text between matches is a piece of its own.
  EXPECT_EQ(pieces("[0-9]+", "ab12cd3"), (std::vector<std::string>{"ab", "12", "cd", "3"}));
  EXPECT_THROW(bpe::RegexSplitter("(unclosed"), Error);
}

TEST(BpeUtf8, RefusesWhatIsNotUtf8) {
  EXPECT_NO_THROW(bpe::check_utf8("plain, ünïcödé, 日本, 🙂"));
  for (const std::string bad : {std::string("\xff"), std::string("a\xc3"), std::string("\xc0\xaf"),
                                std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80")}) {
    EXPECT_THROW(bpe::check_utf8(bad), Error) << nlohmann::json::binary({bad.begin(), bad.end()}).dump();
  }
}

// A tokenizer.json with the byte stand-ins of "a", "b", " " and the merges a+b, then " "+ab.
std::string tiny_tokenizer_json() {
  nlohmann::json vocab = {{"a", 0}, {"b", 1}, {"\u0120", 2}, {"ab", 3}, {"\u0120ab", 4}, {"<|endoftext|>", 5}};
  nlohmann::json json = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 5}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "\u0120 ab"}}}},
  };
  return json.dump();
}

std::shared_ptr<Tokenizer> build(const std::string& path, core::BuiltComponents& keep) {
  keep = testing::build_components("tokenizer: {component_key: tokenizer, variant_key: bpe, config: {path: " + path +
                                   "}}\n");
  return testing::built<Tokenizer>(keep, "tokenizer");
}

TEST(BpeTokenizer, MergesInRankOrderAndCutsAtAddedTokens) {
  testing::TempDir dir;
  core::BuiltComponents keep;
  auto tok = build(dir.write("tokenizer.json", tiny_tokenizer_json()), keep);
  EXPECT_EQ(tok->vocab_size(), 6);
  // "ab ab": pieces "ab" and " ab" -> a+b, then " "+ab.
  EXPECT_EQ(tok->encode("ab ab"), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(tok->encode("ba"), (std::vector<std::int64_t>{1, 0}));
  EXPECT_EQ(tok->encode("ab<|endoftext|> ab"), (std::vector<std::int64_t>{3, 5, 4}));
  EXPECT_EQ(tok->decode({3, 5, 4}), "ab<|endoftext|> ab");
  EXPECT_EQ(tok->eos_id(), 5);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->identity().rfind("bpe tokenizer.json:", 0), 0u) << tok->identity();
  EXPECT_THROW(tok->encode("a\xff"), Error);
  // A byte the vocabulary lacks (here "c") is an error naming the file, not a silent drop.
  EXPECT_THROW(tok->encode("c"), Error);
}

TEST(BpeTokenizer, FilesItCannotReadAreConfigIssuesAtPath) {
  testing::TempDir dir;
  core::BuiltComponents keep;
  auto message = [&](const std::string& text) {
    const std::string path = dir.write("t.json", text);
    try {
      build(path, keep);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("not json").find("not a tokenizer file"), std::string::npos);
  EXPECT_NE(message("not json").find("components.tokenizer.config.path"), std::string::npos);
  auto json = nlohmann::json::parse(tiny_tokenizer_json());
  json["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(message(json.dump()).find("normalizer NFC is not supported"), std::string::npos);
  json = nlohmann::json::parse(tiny_tokenizer_json());
  json["model"]["merges"].push_back("a q");
  EXPECT_NE(message(json.dump()).find("names a token that is not in the vocabulary"), std::string::npos);
  json = nlohmann::json::parse(tiny_tokenizer_json());
  json["model"]["type"] = "Unigram";
  EXPECT_NE(message(json.dump()).find("tokenizer/bpe reads BPE models"), std::string::npos);
  // Ids far beyond the number of tokens would size the id table by the id (found by fuzzing).
  json = nlohmann::json::parse(tiny_tokenizer_json());
  json["model"]["vocab"]["zz"] = 333333347;
  EXPECT_NE(message(json.dump()).find("token ids reach 333333347"), std::string::npos) << message(json.dump());
}

}  // namespace bpe_test
}  // namespace tessera
