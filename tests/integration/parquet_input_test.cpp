// `tessera prepare-data` on Parquet files and `datasets` folders, made by pyarrow and datasets
// (tools/interop/parquet_reference.py): the same documents as JSON lines and as Parquet (several
// row groups; snappy, zstd, gzip, uncompressed; dictionary-encoded, large-string and nested
// columns; four shards through a quoted glob) give byte-identical token files and the same index
// but for its sources, whatever the thread count; a save_to_disk folder gives the tokens of its
// own JSON lines export; bad files are one line naming the file, exit 2, nothing at --out.
// dataset/sft_jsonl and dataset/preference_jsonl read the same examples from Parquet files, an
// Arrow file, a quoted glob of shards and a `datasets` folder as from JSON lines: every row, its
// tokens, targets and example boundaries equal.
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "reference_process.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/arrow_tables.hpp"
#include "tessera/run/batch.hpp"
#include "test_support.hpp"

namespace tessera {
namespace parquet_input_test {

namespace fs = std::filesystem;

// The CLI fixture with pyarrow and datasets in .venv to write the inputs (skipped without them).
class WithPyarrow : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (!testing::python_has(python_, {"pyarrow", "datasets"})) {
      GTEST_SKIP() << "pyarrow and datasets are not installed in .venv (tools/setup.sh installs them)";
    }
  }

  const std::string python_ = testing::source_dir() + "/.venv/bin/python3";
};

class ParquetInput : public WithPyarrow {
 protected:
  void SetUp() override {
    WithPyarrow::SetUp();
    if (IsSkipped()) return;
    std::string out;
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
  // An SDK without the Arrow reader module beside it (as a build without pyarrow): one line. The
  // copy of the SDK library is the one loaded (LD_LIBRARY_PATH comes before the binary's RUNPATH).
  fs::create_directories(dir_.file("bare/bin"));
  fs::create_directories(dir_.file("bare/lib"));
  fs::copy_file(testing::tessera_binary(), dir_.file("bare/bin/tessera"));
  fs::copy_file(fs::path(testing::tessera_binary()).parent_path().parent_path() / "lib" / "libtessera_sdk.so",
                dir_.file("bare/lib/libtessera_sdk.so"));
  {
    std::string out;
    EXPECT_EQ(run_command("LD_LIBRARY_PATH=" + dir_.file("bare/lib") + " " + dir_.file("bare/bin/tessera") + " prepare-data " + corpus_ + "/snappy.parquet --tokenizer bytes"
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

// Fine-tuning examples as tables (tools/interop/parquet_reference.py examples).
class ParquetExamples : public WithPyarrow {
 protected:
  void SetUp() override {
    WithPyarrow::SetUp();
    if (IsSkipped()) return;
    std::string out;
    examples_ = dir_.file("examples");
    ASSERT_EQ(run_command(python_ + " " + testing::source_dir() + "/tools/interop/parquet_reference.py examples " +
                              examples_ + " 2>&1",
                          out),
              0)
        << out;
    // A template that prints a message's name where it has one: the tables' rows hold name: null
    // where the JSON lines have no key, as `datasets` gives them to transformers.
    template_ = dir_.write("chat.jinja",
                           "{% for m in messages %}<|{{ m['role'] }}|>{% if m.name %}({{ m.name }}){% endif %}"
                           "{{ m['content'] }}<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}");
  }

  std::shared_ptr<Dataset> make(const std::string& variant, const std::string& path, const std::string& extra) {
    auto built = testing::build_components("data: {component_key: dataset, variant_key: " + variant + ", config: {path: '" +
                                           path + "', tokenizer: {component_key: tokenizer, variant_key: bytes}, "
                                           "shuffle: false" + extra + "}}\n");
    auto data = testing::built<Dataset>(built, "data");
    data->set_shard(0, 1);
    return data;
  }

  // Every row of an epoch: inputs, labels and example ids, `per` rows a batch.
  static std::vector<std::vector<std::int64_t>> rows_of(Dataset& data, std::int64_t per) {
    std::vector<std::vector<std::int64_t>> rows;
    for (std::int64_t b = 0; b < data.num_samples() / per; ++b) {
      const Batch batch = data.next_batch(per);
      for (const at::Tensor* t : {&batch.input_ids, &batch.labels, &batch.document_ids}) {
        if (!t->defined()) continue;
        const at::Tensor c = t->contiguous();
        rows.emplace_back(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
      }
      rows.push_back({batch.num_target_tokens});
    }
    return rows;
  }

  std::string examples_, template_;
};

TEST_F(ParquetExamples, SftAndPreferenceRowsFromTablesEqualTheirJsonLines) {
  struct Case {
    std::string variant, jsonl;
    std::vector<std::string> tables;
    std::string extra;
    std::int64_t per_batch;
  };
  const std::string e = examples_ + "/";
  const std::vector<Case> cases = {
      {"sft_jsonl", e + "chats.jsonl",
       {e + "chats.parquet", e + "chats-shards/part-*.parquet", e + "chats-folder"},
       ", seq_len: 160, chat_template: " + template_, 1},
      {"sft_jsonl", e + "chats.jsonl", {e + "chats.parquet"}, ", seq_len: 96, pack: false, chat_template: none", 1},
      {"sft_jsonl", e + "pairs.jsonl", {e + "pairs.parquet"}, ", seq_len: 64", 1},
      {"preference_jsonl", e + "preferences.jsonl", {e + "preferences.parquet", e + "preferences.arrow"},
       ", seq_len: 200, chat_template: " + template_, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variant + c.extra);
    auto from_lines = make(c.variant, c.jsonl, c.extra);
    const auto expected = rows_of(*from_lines, c.per_batch);
    ASSERT_GT(from_lines->num_samples(), 4);
    for (const std::string& table : c.tables) {
      SCOPED_TRACE(table);
      auto from_table = make(c.variant, table, c.extra);
      ASSERT_EQ(from_table->num_samples(), from_lines->num_samples());
      EXPECT_TRUE(rows_of(*from_table, c.per_batch) == expected);
      EXPECT_TRUE(from_table->state_dict().at("layout").equal(from_lines->state_dict().at("layout")))
          << "the same rows, so the same layout checksum";
    }
  }
}

TEST_F(ParquetExamples, RowsHoldWhatPyarrowsToPylistHolds) {
  std::vector<std::string> lines;
  for (std::ifstream in(examples_ + "/types.jsonl"); std::getline(in, lines.emplace_back());) {
  }
  lines.pop_back();
  ASSERT_EQ(lines.size(), 3u);
  std::vector<nlohmann::ordered_json> rows;
  std::vector<std::string> wheres;
  read_parquet_rows(examples_ + "/types.parquet", {}, [&](const std::string& row, const std::string& where) {
    rows.push_back(nlohmann::ordered_json::parse(row));
    wheres.push_back(where);
  });
  ASSERT_EQ(rows.size(), lines.size());
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i], nlohmann::ordered_json::parse(lines[i])) << "row " << i;
  EXPECT_NE(wheres[2].find("types.parquet: row group 1, row 0"), std::string::npos) << wheres[2];
  // Only the columns asked for are read: the others are absent, not null.
  std::vector<std::string> kept;
  read_parquet_rows(examples_ + "/types.parquet", {"ok", "missing"}, [&](const std::string& row, const std::string&) {
    kept.push_back(row);
  });
  EXPECT_EQ(kept, (std::vector<std::string>{R"({"ok":true})", R"({"ok":null})", R"({"ok":false})"}));
  // A binary column asked for is refused in one line (JSON holds no bytes).
  try {
    read_parquet_rows(examples_ + "/chats.parquet", {"image"}, [](const std::string&, const std::string&) {});
    ADD_FAILURE() << "bytes were taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chats.parquet: row group 0, row 0: a value is bytes (binary)"), std::string::npos)
        << e.what();
  }
}

TEST_F(ParquetExamples, TablesWithoutTheColumnsOrFilesAreClearErrors) {
  try {
    make("sft_jsonl", examples_ + "/other.parquet", ", seq_len: 16");
    ADD_FAILURE() << "a table without the dataset's columns was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other.parquet: none of the columns messages, prompt, response, tools (it has a, b"),
              std::string::npos)
        << e.what();
  }
  try {
    make("preference_jsonl", examples_ + "/nothing-*.parquet", ", seq_len: 16");
    ADD_FAILURE() << "a glob matching nothing was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no file or folder matches"), std::string::npos) << e.what();
  }
  // A JSON lines file read as Parquet: the reader's one line names it.
  try {
    make("sft_jsonl", examples_ + "/pairs.jsonl", ", seq_len: 16, format: parquet");
    ADD_FAILURE() << "JSON lines read as Parquet";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pairs.jsonl: not a Parquet file"), std::string::npos) << e.what();
  }
}

}  // namespace parquet_input_test
}  // namespace tessera
