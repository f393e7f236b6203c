// `tessera prepare-data`: text files or JSON lines, through a tokenizer, into the flat token file
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

#include "tessera/kinds/tokenizer.hpp"

namespace tessera::core {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out;                   // the token file; its index is out + ".json"
  std::string format = "auto";       // auto (by extension: .jsonl/.json lines, else text), text, jsonl
  std::string field = "text";        // jsonl: the field holding a document's text
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
// a missing file, no documents at all. Nothing is left at `out` then. `progress` is called with
// (input bytes done, input bytes in all) now and then.
PrepareResult prepare_data(const PrepareOptions& options, const kinds::Tokenizer& tokenizer,
                           const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace tessera::core
