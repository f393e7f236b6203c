// `tessera prepare-data`: text files, JSON lines, Parquet files or Hugging Face `datasets` folders
// (Arrow IPC; tessera/formats/arrow_tables.hpp), through a tokenizer, into the flat token file
// dataset/tokens reads (the smallest dtype that holds the vocabulary) and a JSON index beside it
// (FILE.json: documents, tokens, the tokenizer's identity and vocabulary size, every source with
// its size and CRC-32C). Documents are separated by the tokenizer's EOS. The work is spread over
// threads in fixed-size batches written in input order, so the output is the same bytes however
// many threads ran; it appears only when complete (written aside, then renamed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/components/tokenizer.hpp"

namespace tessera::core {

struct PrepareOptions {
  // Files; a quoted glob (sorted matches); a `datasets` folder (its data-*.arrow files in order).
  std::vector<std::string> inputs;
  std::string out;                   // the token file; its index is out + ".json"
  // auto (by extension: .jsonl/.ndjson JSON lines, .parquet, .arrow, else text), text, jsonl,
  // parquet, arrow
  std::string format = "auto";
  std::string field = "text";        // jsonl, parquet, arrow: the text's field (nested: a.b)
  std::string documents = "file";    // text: file (one document per file) or blank-lines
  std::string eos = "auto";          // auto (the tokenizer's EOS, none if it has none), none, or a token
  std::int64_t threads = 0;          // 0: every core
  std::string tokenizer_spec;        // recorded in the index
};

struct PrepareResult {
  std::int64_t documents = 0;
  std::int64_t tokens = 0;
  std::int64_t input_bytes = 0;
  std::string dtype;
  double seconds = 0;
};

// Throws tessera::ConfigError (exit 2) for input it cannot take: a JSONL line that is not an
// object with the field as a string (FILE:LINE), invalid UTF-8 (FILE:LINE or FILE, byte offset),
// a missing file, a glob matching nothing, a Parquet or Arrow file that is corrupt, truncated,
// lacks the column or holds no text in it (FILE: row group G), no documents at all. Nothing is left at `out` then. `progress` is called with
// (input bytes done, input bytes in all) now and then.
PrepareResult prepare_data(const PrepareOptions& options, const Tokenizer& tokenizer,
                           const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace tessera::core
