// tokenizer/bpe and tokenizer/sentencepiece against Python's `tokenizers` and `sentencepiece`
// (tools/interop/tokenizer_reference.py, in the project's .venv): tokenizers trained in Python on
// a corpus the test makes (ASCII, accents, CJK, emoji, whitespace runs, digits, <|endoftext|>
// inline), then every line of it encoded by both: the ids must be equal, line for line; byte-level
// BPE must also decode back to the very text.
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "tessera/run/batch.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/components/tokenizer.hpp"
#include "reference_process.hpp"
#include "test_support.hpp"

namespace tessera {
namespace tokenizer_interop_test {

using testing::run_command;
using testing::TempDir;

class TokenizerInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::python_has(python_, {"tokenizers", "sentencepiece"})) {
      GTEST_SKIP() << "tokenizers/sentencepiece are not installed in .venv (tools/setup.sh installs them)";
    }
    reference("corpus " + corpus_ + " --lines 3000");
  }

  void reference(const std::string& args) {
    std::string out;
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/tokenizer_reference.py " + args, out), 0)
        << args << "\n"
        << out;
  }

  std::vector<std::string> corpus() const {
    std::ifstream in(corpus_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::vector<std::vector<std::int64_t>> python_ids(const std::string& kind, const std::string& path) {
    const std::string out = dir_.file(kind + ".jsonl");
    reference("encode " + kind + " " + path + " --corpus " + corpus_ + " --out " + out);
    std::ifstream in(out);
    std::vector<std::vector<std::int64_t>> rows;
    for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line).get<std::vector<std::int64_t>>());
    return rows;
  }

  std::shared_ptr<Tokenizer> tokenizer(const std::string& yaml) {
    components_ = testing::build_components("tokenizer: " + yaml + "\n");
    return testing::built<Tokenizer>(components_, "tokenizer");
  }

  // Every line's ids equal; returns how many lines had ids.
  void expect_same_ids(const Tokenizer& tok, const std::vector<std::vector<std::int64_t>>& expected,
                       bool lossless) {
    const auto lines = corpus();
    ASSERT_EQ(lines.size(), expected.size());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const auto ids = tok.encode(lines[i]);
      if (ids != expected[i] && wrong++ < 5) {
        ADD_FAILURE() << "line " << i + 1 << " '" << lines[i] << "': " << nlohmann::json(ids).dump() << " vs Python's "
                      << nlohmann::json(expected[i]).dump();
      }
      if (lossless) EXPECT_EQ(tok.decode(ids), lines[i]) << "line " << i + 1;
    }
    EXPECT_EQ(wrong, 0u) << "of " << lines.size() << " lines";
  }

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
  TempDir dir_;
  const std::string corpus_ = dir_.file("corpus.txt");
  core::BuiltComponents components_;
};

TEST_F(TokenizerInterop, Gpt2StyleBpeGivesTheIdsOfPythonsTokenizers) {
  reference("train-bpe " + dir_.file("gpt2") + " --style gpt2 --corpus " + corpus_);
  const std::string path = dir_.file("gpt2/tokenizer.json");
  auto tok = tokenizer("{component_key: tokenizer, variant_key: bpe, config: {path: " + path + "}}");
  EXPECT_EQ(tok->vocab_size(), 1000);
  EXPECT_EQ(tok->eos_id(), tok->token_id("<|endoftext|>"));
  EXPECT_GE(tok->eos_id(), 0);
  expect_same_ids(*tok, python_ids("bpe", path), /*lossless=*/true);
}

TEST_F(TokenizerInterop, Llama3StyleBpeGivesTheIdsOfPythonsTokenizers) {
  reference("train-bpe " + dir_.file("llama3") + " --style llama3 --corpus " + corpus_);
  const std::string path = dir_.file("llama3/tokenizer.json");
  auto tok = tokenizer("{component_key: tokenizer, variant_key: bpe, config: {path: " + dir_.file("llama3") + "}}");
  expect_same_ids(*tok, python_ids("bpe", path), /*lossless=*/true);
}

TEST_F(TokenizerInterop, SentencePieceGivesTheIdsOfPythonsSentencepiece) {
  for (const std::string type : {"unigram", "bpe"}) {
    SCOPED_TRACE(type);
    const std::string prefix = dir_.file("sp-" + type);
    reference("train-sp " + prefix + " --type " + type + " --corpus " + corpus_);
    auto tok = tokenizer("{component_key: tokenizer, variant_key: sentencepiece, config: {path: " + prefix + ".model}}");
    EXPECT_EQ(tok->vocab_size(), 800);
    // SentencePiece normalises (NFKC, whitespace): not lossless, but its own decode is the reference.
    expect_same_ids(*tok, python_ids("sentencepiece", prefix + ".model"), /*lossless=*/false);
    auto with_bos = tokenizer("{component_key: tokenizer, variant_key: sentencepiece, config: {path: " + prefix +
                              ".model, add_bos: true, add_eos: true}}");
    const auto ids = with_bos->encode("the lazy dog");
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), with_bos->bos_id());
    EXPECT_EQ(ids.back(), with_bos->eos_id());
  }
}

// dataset/sft_jsonl encodes prompt and response apart; with a tokenizer that adds BOS and EOS to
// every encode(), an example must still hold one BOS (first) and one EOS (after the response, a
// target), as Python's tokenizers give for the whole example, not a BOS and EOS around each part.
TEST_F(TokenizerInterop, SftExamplesHoldTheTokenizersBosOnceAndEosOnlyAfterTheResponse) {
  const std::string prefix = dir_.file("sp-sft");
  reference("train-sp " + prefix + " --type unigram --corpus " + corpus_);
  const std::string tokenizer_yaml =
      "{component_key: tokenizer, variant_key: sentencepiece, config: {path: " + prefix + ".model, add_bos: true, add_eos: true}}";
  auto tok = tokenizer(tokenizer_yaml);
  const std::string data_path = dir_.file("sft.jsonl");
  std::ofstream(data_path) << R"({"prompt": "the lazy dog", "response": "jumps over"})" << "\n";
  core::BuiltComponents built = testing::build_components(
      "data: {component_key: dataset, variant_key: sft_jsonl, config: {path: " + data_path + ", tokenizer: " +
      tokenizer_yaml + ", seq_len: 32, pack: false, shuffle: false}}\n");
  auto data = testing::built<Dataset>(built, "data");
  data->set_shard(0, 1);
  const Batch batch = data->next_batch(1);

  const auto inner = [&](const std::string& text) {  // the ids without the BOS and EOS added around them
    std::vector<std::int64_t> ids = tok->encode(text);
    EXPECT_EQ(ids.front(), tok->bos_id());
    EXPECT_EQ(ids.back(), tok->eos_id());
    return std::vector<std::int64_t>(ids.begin() + 1, ids.end() - 1);
  };
  std::vector<std::int64_t> tokens{tok->bos_id()};
  std::vector<bool> target{false};
  for (std::int64_t id : inner("the lazy dog")) tokens.push_back(id), target.push_back(false);
  for (std::int64_t id : inner("jumps over")) tokens.push_back(id), target.push_back(true);
  tokens.push_back(tok->eos_id()), target.push_back(true);
  std::vector<std::int64_t> inputs(32, tok->eos_id()), labels(32, kIgnoreIndex);  // padding: EOS, no loss
  for (std::size_t i = 0; i + 1 < tokens.size(); ++i) {
    inputs[i] = tokens[i];
    labels[i] = target[i + 1] ? tokens[i + 1] : kIgnoreIndex;
  }
  const at::Tensor in = batch.input_ids[0].contiguous(), out = batch.labels[0].contiguous();
  EXPECT_EQ(std::vector<std::int64_t>(in.data_ptr<std::int64_t>(), in.data_ptr<std::int64_t>() + 32), inputs);
  EXPECT_EQ(std::vector<std::int64_t>(out.data_ptr<std::int64_t>(), out.data_ptr<std::int64_t>() + 32), labels);
  EXPECT_EQ(batch.num_target_tokens, static_cast<std::int64_t>(inner("jumps over").size() + 1));

  // Packed, such rows differ from what earlier versions packed (a BOS and EOS around every part):
  // a state saved by them (no layout) is refused rather than resumed among other rows.
  core::BuiltComponents packed_built = testing::build_components(
      "data: {component_key: dataset, variant_key: sft_jsonl, config: {path: " + data_path + ", tokenizer: " +
      tokenizer_yaml + ", seq_len: 32, pack: true}}\n");
  auto packed = testing::built<Dataset>(packed_built, "data");
  try {
    packed->load_state_dict({{"epoch", at::scalar_tensor(0, at::kLong)}, {"position", at::scalar_tensor(0, at::kLong)}});
    ADD_FAILURE() << "a state without a layout was accepted over changed rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no layout and was saved by an earlier Tessera"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(packed->load_state_dict(packed->state_dict()));
}

}  // namespace tokenizer_interop_test
}  // namespace tessera
