// `tessera prepare-data` on Parquet files and `datasets` folders, made by pyarrow and datasets
// (tools/interop/parquet_reference.py): the same documents as JSON lines and as Parquet (several
// row groups; snappy, zstd, gzip, uncompressed; dictionary-encoded, large-string and nested
// columns; four shards through a quoted glob) give byte-identical token files and the same index
// but for its sources, whatever the thread count; a save_to_disk folder gives the tokens of its
// own JSON lines export; bad files are one line naming the file, exit 2, nothing at --out.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace tessera {
namespace parquet_input_test {

namespace fs = std::filesystem;

class ParquetInput : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    std::string out;
    if (run_command(python_ + " -c 'import pyarrow, datasets'", out) != 0) {
      GTEST_SKIP() << "pyarrow and datasets are not installed in .venv (tools/setup.sh installs them): " << out;
    }
    if (run_command(tessera("prepare-data --help"), out) != 0 || out.find("parquet") == std::string::npos) {
      GTEST_FAIL() << "prepare-data does not offer parquet: " << out;
    }
    corpus_ = dir_.file("corpus");
    reference("corpus " + corpus_);
    // A byte-level BPE with an end-of-text token, trained on the corpus: documents joined by EOS.
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/tokenizer_reference.py train-bpe " +
                              dir_.file("bpe") + " --style gpt2 --corpus " + corpus_ + "/docs.jsonl --vocab 600",
                          out),
              0)
        << out;
    tokenizer_ = "'{variant_key: bpe, config: {path: " + dir_.file("bpe/tokenizer.json") + "}}'";
  }

  void reference(const std::string& args) {
    std::string out;
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/parquet_reference.py " + args + " 2>&1", out),
              0)
        << out;
  }

  // prepare-data's token file and its index less the sources (which name the inputs).
  struct Prepared {
    std::string tokens;
    nlohmann::json index;
  };
  Prepared prepare(const std::string& inputs, const std::string& name, const std::string& args = "") {
    const std::string out_file = dir_.file("out/" + name + ".bin");
    std::string out;
    EXPECT_EQ(run_command(tessera("prepare-data " + inputs + " --tokenizer " + tokenizer_ + " --out " + out_file + args),
                          out),
              0)
        << out;
    Prepared p;
    std::ifstream in(out_file, std::ios::binary);
    p.tokens.assign(std::istreambuf_iterator<char>(in), {});
    std::ifstream index(out_file + ".json");
    p.index = nlohmann::json::parse(index, nullptr, false);
    if (p.index.is_object()) p.index.erase("sources");
    return p;
  }

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
  std::string corpus_, tokenizer_;
};

TEST_F(ParquetInput, SameDocumentsAsJsonLinesGiveTheSameTokenFile) {
  const Prepared expected = prepare(corpus_ + "/docs.jsonl", "jsonl", " --threads 2");
  ASSERT_FALSE(expected.tokens.empty());
  ASSERT_TRUE(expected.index.is_object());
  EXPECT_EQ(expected.index["documents"], 3000);
  EXPECT_GE(expected.index["eos_id"].get<int>(), 0) << "documents are joined by the tokenizer's EOS";
  for (const std::string name : {"snappy", "zstd", "gzip", "none", "large", "dictionary"}) {
    SCOPED_TRACE(name);
    const Prepared got = prepare(corpus_ + "/" + name + ".parquet", name, " --threads 1");
    EXPECT_TRUE(got.tokens == expected.tokens) << got.tokens.size() << " bytes against " << expected.tokens.size();
    EXPECT_EQ(got.index, expected.index);
  }
  // A nested column, against the JSON lines' nested field.
  const Prepared nested_jsonl = prepare(corpus_ + "/docs.jsonl", "nested-jsonl", " --field meta.text");
  const Prepared nested = prepare(corpus_ + "/nested.parquet", "nested", " --field meta.text --threads 3");
  EXPECT_TRUE(nested_jsonl.tokens == expected.tokens);
  EXPECT_TRUE(nested.tokens == expected.tokens);
  // Four shards through a quoted glob, in name order, and --format parquet on a file named otherwise.
  const Prepared shards = prepare("'" + corpus_ + "/shards/part-*.parquet'", "shards");
  EXPECT_TRUE(shards.tokens == expected.tokens);
  EXPECT_EQ(shards.index, expected.index);
  fs::copy_file(corpus_ + "/zstd.parquet", corpus_ + "/zstd.data");
  EXPECT_TRUE(prepare(corpus_ + "/zstd.data", "format", " --format parquet").tokens == expected.tokens);
  // The index lists every shard with its size and checksum.
  std::ifstream index(dir_.file("out/shards.bin.json"));
  const nlohmann::json with_sources = nlohmann::json::parse(index);
  ASSERT_EQ(with_sources["sources"].size(), 4u);
  EXPECT_EQ(with_sources["sources"][3]["path"], corpus_ + "/shards/part-00003.parquet");
  EXPECT_EQ(with_sources["sources"][3]["bytes"], fs::file_size(corpus_ + "/shards/part-00003.parquet"));
}

TEST_F(ParquetInput, DatasetsFolderGivesTheTokensOfItsJsonLinesExport) {
  const std::string folder = dir_.file("ds");
  reference("datasets " + folder + " " + corpus_ + "/docs.jsonl");
  const Prepared exported = prepare(folder + ".jsonl", "export");
  const Prepared read = prepare(folder, "folder");
  ASSERT_FALSE(exported.tokens.empty());
  EXPECT_TRUE(read.tokens == exported.tokens) << read.tokens.size() << " bytes against " << exported.tokens.size();
  EXPECT_EQ(read.index, exported.index);
  // ... and the nested field of the same rows.
  EXPECT_TRUE(prepare(folder, "folder-nested", " --field meta.text").tokens == exported.tokens);
}

TEST_F(ParquetInput, BadFilesAreOneLineNamingTheFileExitTwoAndLeaveNothing) {
  reference("bad " + corpus_);
  struct Case {
    std::string input, args, expected;
  };
  const std::vector<Case> cases = {
      {"truncated.parquet", "", "truncated.parquet: not a Parquet file, or truncated"},
      {"empty.parquet", "", "empty.parquet: not a Parquet file, or truncated"},
      {"snappy.parquet", " --field body", "snappy.parquet: no column 'body' (it has id, text;"},
      {"nested.parquet", " --field meta.body", "nested.parquet: no column 'meta.body' (it has text;"},
      {"numbers.parquet", "", "numbers.parquet: column 'text' is int64, not text"},
      {"nulls.parquet", "", "nulls.parquet: row group 1, row 1: the text is null"},
      {"utf8.parquet", "", "utf8.parquet: row group 0: invalid UTF-8"},
      {"missing.parquet", "", "missing.parquet: cannot read it"},
      {"nothing-*.parquet", "", "nothing-*.parquet: the pattern matches no file"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.input);
    const std::string target = dir_.file("bad/" + c.input + ".bin");
    // After good documents (whose tokens were written aside) where the field is the default one.
    const std::string good = c.args.empty() ? "'" + corpus_ + "/docs.jsonl' " : "";
    std::string out;
    EXPECT_EQ(run_command(tessera("prepare-data " + good + "'" + corpus_ + "/" + c.input + "' --tokenizer bytes --out " +
                                  target + c.args),
                          out),
              2)
        << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line: " << out;
    EXPECT_FALSE(fs::exists(target));
    EXPECT_FALSE(fs::exists(target + ".tmp"));
    EXPECT_FALSE(fs::exists(target + ".json"));
  }
  // A host without the Arrow reader module beside it (as a build without pyarrow): one line.
  fs::create_directories(dir_.file("bare/bin"));
  fs::copy_file(testing::tessera_binary(), dir_.file("bare/bin/tessera"));
  {
    std::string out;
    EXPECT_EQ(run_command(dir_.file("bare/bin/tessera") + " prepare-data " + corpus_ + "/snappy.parquet --tokenizer bytes"
                          " --plugin-path " + testing::plugin_dir() + " --out " + dir_.file("bare.bin"),
                          out),
              2)
        << out;
    EXPECT_NE(out.find("snappy.parquet: this Tessera was built without Apache Arrow"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir_.file("bare.bin")));
  }
  // A DatasetDict's top folder names its splits.
  fs::create_directories(dir_.file("dict/train"));
  std::ofstream(dir_.file("dict/dataset_dict.json")) << "{\"splits\": [\"train\"]}";
  std::string out;
  EXPECT_EQ(run_command(tessera("prepare-data " + dir_.file("dict") + " --tokenizer bytes --out " + dir_.file("dict.bin")), out), 2);
  EXPECT_NE(out.find("a DatasetDict folder (splits: train)"), std::string::npos) << out;
}

}  // namespace parquet_input_test
}  // namespace tessera
