#include "tessera/core/data/prepare_data.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessera/formats/arrow_tables.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/formats/durable_file.hpp"
#include "tessera/error.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

// Documents per batch handed to the threads: large enough to keep them busy, small enough that a
// huge corpus never sits in memory whole.
constexpr std::size_t kBatchDocuments = 2048;

struct Document {
  std::string text;
  std::string where;  // FILE or FILE:LINE, for errors
};

// The byte offset of the first invalid UTF-8 sequence, or npos.
std::size_t invalid_utf8_at(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    std::uint32_t code = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      code = (code << 6) | (d & 0x3Fu);
    }
    const bool overlong = (n == 2 && code < 0x80) || (n == 3 && code < 0x800) || (n == 4 && code < 0x10000);
    if (overlong || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return i;
    i += n;
  }
  return std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read it", "");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

enum class InputKind { text, jsonl, parquet, arrow };

struct Input {
  std::string path;
  InputKind kind;
};

InputKind kind_of(const PrepareOptions& o, const std::string& path) {
  if (o.format == "text") return InputKind::text;
  if (o.format == "jsonl") return InputKind::jsonl;
  if (o.format == "parquet") return InputKind::parquet;
  if (o.format == "arrow") return InputKind::arrow;
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".jsonl" || ext == ".ndjson") return InputKind::jsonl;
  if (ext == ".parquet") return InputKind::parquet;
  if (ext == ".arrow") return InputKind::arrow;
  return InputKind::text;
}

// The files named on the command line (tessera::table_files): a quoted glob's matches in name
// order, a `datasets` folder's Arrow files, and plain files as they are.
std::vector<Input> expand_inputs(const PrepareOptions& o) {
  std::vector<Input> inputs;
  for (const auto& input : o.inputs) {
    std::error_code ec;
    const bool folder = fs::is_directory(input, ec);
    for (const auto& path : table_files(input)) inputs.push_back({path, folder ? InputKind::arrow : kind_of(o, path)});
  }
  return inputs;
}

// `field` of a JSON row: the key itself, else a nested path a.b through objects.
const nlohmann::json* field_of(const nlohmann::json& row, const std::string& field) {
  if (auto it = row.find(field); it != row.end()) return &*it;
  const nlohmann::json* at = &row;
  std::stringstream parts(field);
  for (std::string part; std::getline(parts, part, '.');) {
    if (!at->is_object()) return nullptr;
    auto it = at->find(part);
    if (it == at->end()) return nullptr;
    at = &*it;
  }
  return at == &row ? nullptr : at;
}

// The documents of one input file, in order.
std::vector<Document> documents_of(const PrepareOptions& o, const Input& input, const std::string& bytes) {
  const std::string& path = input.path;
  std::vector<Document> docs;
  if (input.kind == InputKind::jsonl) {
    std::istringstream lines(bytes);
    std::size_t number = 0;
    for (std::string line; std::getline(lines, line);) {
      ++number;
      const std::string where = path + ":" + std::to_string(number);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (const auto at = invalid_utf8_at(line); at != std::string::npos) {
        throw ConfigError(where + ": invalid UTF-8 at byte " + std::to_string(at) + " of the line", "");
      }
      nlohmann::json row;
      try {
        row = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(where + ": not a JSON object (" + std::string(e.what()) + ")", "");
      }
      if (!row.is_object()) throw ConfigError(where + ": not a JSON object", "");
      const nlohmann::json* field = field_of(row, o.field);
      if (!field) throw ConfigError(where + ": no field '" + o.field + "' (choose it with --field, a nested one as a.b)", "");
      if (!field->is_string()) throw ConfigError(where + ": field '" + o.field + "' is not a string", "");
      docs.push_back({field->get<std::string>(), where});
    }
    return docs;
  }
  if (const auto at = invalid_utf8_at(bytes); at != std::string::npos) {
    throw ConfigError(path + ": invalid UTF-8 at byte " + std::to_string(at), "");
  }
  if (o.documents == "file") {
    if (!bytes.empty()) docs.push_back({bytes, path});
    return docs;
  }
  // Blocks separated by one or more blank lines.
  std::istringstream lines(bytes);
  std::string block;
  std::size_t number = 0, first = 0;
  auto flush = [&] {
    if (!block.empty()) docs.push_back({block, path + ":" + std::to_string(first)});
    block.clear();
  };
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
      continue;
    }
    if (block.empty()) first = number;
    block += block.empty() ? line : "\n" + line;
  }
  flush();
  return docs;
}

// Tokenises `docs` on `threads` threads; ids[i] are document i's.
std::vector<std::vector<std::int64_t>> encode_all(const std::vector<Document>& docs, const Tokenizer& tokenizer,
                                                  std::size_t threads) {
  std::vector<std::vector<std::int64_t>> ids(docs.size());
  std::vector<std::string> errors(threads);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = t; i < docs.size(); i += threads) {
        try {
          ids[i] = tokenizer.encode(docs[i].text);
        } catch (const std::exception& e) {
          errors[t] = docs[i].where + ": " + e.what();
          return;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (const auto& e : errors) {
    if (!e.empty()) throw ConfigError(e, "");
  }
  return ids;
}

std::string dtype_for(std::int64_t vocab) {
  if (vocab <= 256) return "uint8";
  if (vocab <= 65536) return "uint16";
  return "uint32";
}

// Appends `ids` to `out` as little-endian integers of `width` bytes.
void append_ids(std::string& out, const std::vector<std::int64_t>& ids, std::size_t width) {
  for (std::int64_t id : ids) {
    const auto v = static_cast<std::uint64_t>(id);
    for (std::size_t b = 0; b < width; ++b) out.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
  }
}

std::string hex(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

}  // namespace


PrepareResult prepare_data(const PrepareOptions& o, const Tokenizer& tokenizer,
                           const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (o.inputs.empty()) throw ConfigError("no input files", "");
  std::int64_t eos = -1;
  if (o.eos == "auto") {
    eos = tokenizer.eos_id();
  } else if (o.eos != "none") {
    eos = tokenizer.token_id(o.eos);
    if (eos < 0) throw ConfigError("--eos " + o.eos + ": the tokenizer has no such token", "");
  }
  const std::int64_t vocab = tokenizer.vocab_size();
  PrepareResult result;
  result.dtype = dtype_for(vocab);
  const std::size_t width = result.dtype == "uint8" ? 1 : result.dtype == "uint16" ? 2 : 4;
  const std::vector<Input> inputs = expand_inputs(o);
  std::int64_t total_bytes = 0;
  for (const auto& input : inputs) {
    std::error_code ec;
    const auto size = fs::file_size(input.path, ec);
    if (ec) throw ConfigError(input.path + ": cannot read it (" + ec.message() + ")", "");
    total_bytes += static_cast<std::int64_t>(size);
  }
  const std::size_t threads =
      static_cast<std::size_t>(o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency()));

  const fs::path out(o.out);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  const std::string tmp = o.out + ".tmp";
  nlohmann::ordered_json sources = nlohmann::json::array();
  try {
    DurableFile file(tmp);
    std::vector<Document> batch;
    std::string bytes_out;
    auto write_batch = [&] {
      const auto ids = encode_all(batch, tokenizer, threads);
      bytes_out.clear();
      for (const auto& doc_ids : ids) {
        for (std::int64_t id : doc_ids) {
          if (id < 0 || id >= vocab) throw ConfigError("the tokenizer produced id " + std::to_string(id) + " outside its vocabulary", "");
        }
        if (result.documents > 0 && eos >= 0) append_ids(bytes_out, {eos}, width), ++result.tokens;
        append_ids(bytes_out, doc_ids, width);
        result.tokens += static_cast<std::int64_t>(doc_ids.size());
        ++result.documents;
      }
      file.append(bytes_out.data(), bytes_out.size());
      batch.clear();
    };
    for (const auto& input : inputs) {
      const std::string& path = input.path;
      if (input.kind == InputKind::parquet || input.kind == InputKind::arrow) {
        // Streamed: a batch of one column at a time, documents handed on as they come.
        const auto size = static_cast<std::int64_t>(fs::file_size(path));
        sources.push_back({{"path", path}, {"bytes", size}, {"crc32c", hex(file_crc32c(path))}});
        const DocumentSink take = [&](std::string text, const std::string& where) {
          if (const auto at = invalid_utf8_at(text); at != std::string::npos) {
            throw ConfigError(where + ": invalid UTF-8 at byte " + std::to_string(at) + " of the text", "");
          }
          batch.push_back({std::move(text), where});
          if (batch.size() == kBatchDocuments) write_batch();
        };
        if (input.kind == InputKind::parquet) {
          read_parquet_documents(path, o.field, take);
        } else {
          read_arrow_documents(path, o.field, take);
        }
        if (!batch.empty()) write_batch();
        result.input_bytes += size;
        if (progress) progress(result.input_bytes, total_bytes);
        continue;
      }
      const std::string bytes = read_file(path);
      sources.push_back({{"path", path}, {"bytes", bytes.size()}, {"crc32c", hex(crc32c(bytes.data(), bytes.size()))}});
      for (auto& doc : documents_of(o, input, bytes)) {
        batch.push_back(std::move(doc));
        if (batch.size() == kBatchDocuments) write_batch();
      }
      if (!batch.empty()) write_batch();
      result.input_bytes += static_cast<std::int64_t>(bytes.size());
      if (progress) progress(result.input_bytes, total_bytes);
    }
    if (result.documents == 0) throw ConfigError("the inputs hold no documents (empty files?)", "");
    file.commit();
    nlohmann::ordered_json index = {
        {"format", "tessera-tokens"},
        {"dtype", result.dtype},
        {"documents", result.documents},
        {"tokens", result.tokens},
        {"eos_id", eos},
        {"tokenizer", {{"spec", o.tokenizer_spec}, {"identity", tokenizer.identity()}, {"vocab_size", vocab}}},
        {"sources", sources},
    };
    write_file_durably(o.out + ".json.tmp", index.dump(2) + "\n");
    rename_durably(tmp, o.out);
    rename_durably(o.out + ".json.tmp", o.out + ".json");
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fs::remove(o.out + ".json.tmp", ignored);
    throw;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tessera::core
