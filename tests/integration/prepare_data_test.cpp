// `tessera prepare-data` through the real binary: text files and JSON lines through a BPE trained
// in Python give exactly Python's ids of each document joined by EOS; the index says what was
// made from what; two runs (and any number of threads) give the same bytes; the file trains; bad
// inputs are one error, exit 2, nothing left behind.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace prepare_data_test {

class PrepareData : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    std::string out;
    if (run_command(python_ + " -c 'import tokenizers'", out) != 0) {
      GTEST_SKIP() << "tokenizers is not installed in .venv (tools/setup.sh installs it): " << out;
    }
    reference("corpus " + dir_.file("corpus.txt") + " --lines 400");
    reference("train-bpe " + dir_.file("bpe") + " --style gpt2 --corpus " + dir_.file("corpus.txt") + " --vocab 700");
    tokenizer_ = "'{variant_key: bpe, config: {path: " + dir_.file("bpe/tokenizer.json") + "}}'";
    // Two JSONL files of documents (every fourth corpus line as a record) and a text file.
    std::ifstream corpus(dir_.file("corpus.txt"));
    std::ofstream a(dir_.file("a.jsonl")), b(dir_.file("b.jsonl"));
    std::size_t i = 0;
    for (std::string line; std::getline(corpus, line); ++i) {
      (i % 2 ? a : b) << nlohmann::json({{"text", line + (i % 3 ? "\n" + line : "")}, {"id", i}}).dump() << "\n";
    }
    dir_.write("doc.txt", "A plain text document.\n\nWith two paragraphs, ünïcödé and 日本語.\n");
  }

  void reference(const std::string& args) {
    std::string out;
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/tokenizer_reference.py " + args, out), 0)
        << out;
  }

  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
  std::string tokenizer_;
};

TEST_F(PrepareData, WritesPythonsIdsJoinedByEosAndAnIndex) {
  const std::string inputs = dir_.file("a.jsonl") + " " + dir_.file("b.jsonl") + " " + dir_.file("doc.txt");
  std::string out;
  ASSERT_EQ(run_command(tessera("prepare-data " + inputs + " --tokenizer " + tokenizer_ + " --out " +
                                dir_.file("out/train.bin")),
                        out),
            0)
      << out;
  reference("join-encode " + dir_.file("bpe/tokenizer.json") + " " + inputs + " --out " + dir_.file("expected.json"));
  const auto expected = nlohmann::json::parse(read(dir_.file("expected.json")));
  const auto ids = expected.at("ids").get<std::vector<std::int64_t>>();

  // 700 ids fit uint16: two bytes a token, little-endian.
  const std::string bytes = read(dir_.file("out/train.bin"));
  ASSERT_EQ(bytes.size(), ids.size() * 2);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto got = static_cast<std::int64_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                               (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
    if (got != ids[i] && wrong++ < 5) ADD_FAILURE() << "token " << i << ": " << got << " vs Python's " << ids[i];
  }
  EXPECT_EQ(wrong, 0u);

  const auto index = nlohmann::json::parse(read(dir_.file("out/train.bin.json")));
  EXPECT_EQ(index.at("dtype"), "uint16");
  EXPECT_EQ(index.at("documents"), expected.at("documents"));
  EXPECT_EQ(index.at("tokens").get<std::size_t>(), ids.size());
  EXPECT_EQ(index.at("tokenizer").at("vocab_size"), 700);
  EXPECT_EQ(index.at("tokenizer").at("identity").get<std::string>().rfind("bpe tokenizer.json:", 0), 0u);
  ASSERT_EQ(index.at("sources").size(), 3u);
  EXPECT_EQ(index.at("sources")[2].at("path"), dir_.file("doc.txt"));
  EXPECT_EQ(index.at("sources")[2].at("bytes"), fs::file_size(dir_.file("doc.txt")));

  // The file trains: dataset/tokens reads it as uint16.
  const std::string spec = dir_.write(
      "bpe.yaml", "include: [" + tiny() + "]\ncomponents:\n  model: {component_key: model, variant_key: gpt, config: "
                  "{vocab_size: 700, n_layer: 1, n_head: 2, n_embd: 32, max_seq_len: 32}}\n"
                  "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " +
                  dir_.file("out/train.bin") +
                  ", dtype: uint16, seq_len: 32, vocab_size: \"${components.model.config.vocab_size}\"}}\n");
  ASSERT_EQ(run_command(tessera("train " + spec + " --set trainer.max_steps=6 --run-dir " + dir_.file("run")), out), 0)
      << out;
  // A model with fewer ids than the tokenizer that made the file: refused by validate, naming both.
  EXPECT_EQ(run_command(tessera("validate " + spec + " --set components.model.config.vocab_size=500"), out), 2) << out;
  EXPECT_NE(out.find("was tokenised with 700 ids"), std::string::npos) << out;
  EXPECT_NE(out.find("more than vocab_size 500"), std::string::npos) << out;
  // And a dtype other than the index's.
  EXPECT_EQ(run_command(tessera("validate " + spec + " --set components.train_data.config.dtype=uint32"), out), 2) << out;
  EXPECT_NE(out.find("holds uint16 ids"), std::string::npos) << out;
  // The dataset need not repeat the model's vocabulary: without vocab_size it gets the model's.
  const std::string plain = dir_.write(
      "plain.yaml", "include: [" + tiny() + "]\ncomponents:\n  model: {component_key: model, variant_key: gpt, config: "
                    "{vocab_size: 500, n_layer: 1, n_head: 2, n_embd: 32, max_seq_len: 32}}\n"
                    "  train_data: {component_key: dataset, variant_key: tokens, config: {path: " +
                    dir_.file("out/train.bin") + ", dtype: uint16, seq_len: 32}}\n");
  EXPECT_EQ(run_command(tessera("validate " + plain), out), 2) << out;
  EXPECT_NE(out.find("was tokenised with 700 ids"), std::string::npos) << out;
  EXPECT_NE(out.find("more than vocab_size 500"), std::string::npos) << out;
  EXPECT_EQ(run_command(tessera("validate " + plain + " --set components.model.config.vocab_size=700"), out), 0) << out;
}

TEST_F(PrepareData, SameInputsGiveTheSameBytesWhateverTheThreads) {
  const std::string inputs = dir_.file("a.jsonl") + " " + dir_.file("b.jsonl");
  std::string out;
  for (const std::string run : {"1", "2", "3"}) {
    ASSERT_EQ(run_command(tessera("prepare-data " + inputs + " --tokenizer " + tokenizer_ + " --threads " + run +
                                  " --out " + dir_.file("run" + run + ".bin")),
                          out),
              0)
        << out;
  }
  EXPECT_EQ(read(dir_.file("run1.bin")), read(dir_.file("run2.bin")));
  EXPECT_EQ(read(dir_.file("run1.bin")), read(dir_.file("run3.bin")));
  EXPECT_EQ(read(dir_.file("run1.bin.json")), read(dir_.file("run2.bin.json")));
  // The byte tokenizer: uint8, no EOS (it has none), blank-line blocks as documents.
  ASSERT_EQ(run_command(tessera("prepare-data " + dir_.file("doc.txt") + " --tokenizer bytes --documents blank-lines --out " +
                                dir_.file("bytes.bin")),
                        out),
            0)
      << out;
  EXPECT_EQ(read(dir_.file("bytes.bin")), "A plain text document.With two paragraphs, ünïcödé and 日本語.");
  EXPECT_EQ(nlohmann::json::parse(read(dir_.file("bytes.bin.json"))).at("documents"), 2);
}

TEST_F(PrepareData, BadInputsAreOneErrorExitTwoAndLeaveNothing) {
  struct Case {
    std::string name, content, args, expected;
  };
  const std::vector<Case> cases = {
      {"bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": oops}\n", "", "bad.jsonl:2: not a JSON object"},
      {"field.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n", "", "field.jsonl:2: no field 'text'"},
      {"utf8.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"caf\xe9\"}\n", "", "utf8.jsonl:2: invalid UTF-8"},
      {"utf8.txt", "good\nbad \xff here\n", "", "utf8.txt: invalid UTF-8 at byte 9"},
      {"empty.jsonl", "\n\n", "", "no documents"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string input = dir_.write(c.name, c.content);
    const std::string target = dir_.file("bad-" + c.name + ".bin");
    std::string out;
    EXPECT_EQ(run_command(tessera("prepare-data " + input + " --tokenizer " + tokenizer_ + c.args + " --out " + target), out),
              2)
        << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(target));
    EXPECT_FALSE(fs::exists(target + ".tmp"));
    EXPECT_FALSE(fs::exists(target + ".json"));
  }
  // A tokenizer file that is not one: positioned at its path.
  std::string out;
  const std::string not_tokenizer = dir_.write("not.json", "[1, 2, 3]");
  EXPECT_EQ(run_command(tessera("prepare-data " + dir_.file("a.jsonl") + " --tokenizer '{variant_key: bpe, config: {path: " +
                                not_tokenizer + "}}' --out " + dir_.file("x.bin")),
                        out),
            2)
      << out;
  EXPECT_NE(out.find("tokenizer.config.path"), std::string::npos) << out;
  EXPECT_NE(out.find("not a tokenizer.json"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_.file("x.bin")));
}

}  // namespace prepare_data_test
}  // namespace tessera
