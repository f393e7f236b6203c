// A token file and its index (FILE.json, from `tessera prepare-data`) against the config that
// reads it: the checks dataset/tokens and dataset/mixture run at validation and construction
// (header of this plugin only).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/error.hpp"

namespace tessera::token_data {

// A token file's index (FILE.json, written by `tessera prepare-data`), as far as the readers use it.
struct TokenFileIndex {
  bool present = false;
  std::string dtype;
  std::int64_t vocab_size = 0;  // the tokenizer's; 0: unknown
  std::string tokenizer;        // its identity
  std::int64_t eos_id = -1;
};

// A member of an index, when it has the type asked for; else `fallback` (an index written by
// hand or damaged must not stop a run with a JSON type error).
inline std::string index_string(const nlohmann::json& object, const char* key, std::string fallback) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}
inline std::int64_t index_integer(const nlohmann::json& object, const char* key, std::int64_t fallback) {
  const auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

inline TokenFileIndex read_index(const std::string& path) {
  TokenFileIndex out;
  std::ifstream in(path + ".json");
  if (!in) return out;
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!index.is_object() || index_string(index, "format", "") != "tessera-tokens") return out;
  out.present = true;
  out.dtype = index_string(index, "dtype", "");
  out.eos_id = index_integer(index, "eos_id", -1);
  if (const auto t = index.find("tokenizer"); t != index.end() && t->is_object()) {
    out.vocab_size = index_integer(*t, "vocab_size", 0);
    out.tokenizer = index_string(*t, "identity", "?");
  }
  return out;
}

// The index, when the file has one, against the config that reads it: the dtype must be the
// file's, and the tokenizer's vocabulary must fit the model's (`vocab_size`, usually
// ${components.model.config.vocab_size}; 0: not checked). Runs when the spec is validated, so a
// mismatch stops `tessera validate`.
inline void check_index(const std::string& path, const std::string& dtype, std::int64_t vocab_size) {
  const TokenFileIndex index = read_index(path);
  if (!index.present) return;
  if (!index.dtype.empty() && index.dtype != dtype) {
    throw ConfigError(path + " holds " + index.dtype + " ids (its index " + path + ".json says so), the config reads " +
                          dtype,
                      "dtype");
  }
  if (vocab_size > 0 && index.vocab_size > vocab_size) {
    throw ConfigError(path + " was tokenised with " + std::to_string(index.vocab_size) + " ids (" + index.tokenizer +
                          "), more than vocab_size " + std::to_string(vocab_size) +
                          "; use the model's tokenizer, or a model with that vocabulary",
                      "vocab_size");
  }
}

// A file without an index is read as `dtype` on trust, and uint32 ids read as uint16 are still
// ids (each followed by a 0, the high half): a run would train on them without an error. So when
// the first 64 KiB, read as uint16, hold a 0 at every odd place and something else at an even one,
// the file is refused as uint32 ids. Text never looks like this; ids below 65536 written as uint32
// always do.
inline void check_unindexed_width(const std::string& path, const std::string& dtype, const std::string& field) {
  if (dtype != "uint16" || read_index(path).present) return;
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint16_t> head(32 * 1024);
  in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size() * sizeof(std::uint16_t)));
  const auto values = static_cast<std::size_t>(in.gcount()) / sizeof(std::uint16_t) / 2 * 2;
  if (values < 64) return;  // too few to tell
  bool odd_all_zero = true, even_any_set = false;
  for (std::size_t i = 0; i < values; i += 2) {
    even_any_set = even_any_set || head[i] != 0;
    odd_all_zero = odd_all_zero && head[i + 1] == 0;
  }
  if (odd_all_zero && even_any_set) {
    throw ConfigError(path + " looks like uint32 token ids (every second 16-bit value of its first " +
                          std::to_string(values) + " is 0) and has no index saying its dtype: set dtype: uint32, "
                          "or write it with tessera prepare-data (its FILE.json names the dtype). If it does hold "
                          "uint16 ids, say so in an index beside it: " + path +
                          ".json with {\"format\": \"tessera-tokens\", \"dtype\": \"uint16\"}",
                      field);
  }
}

inline std::int64_t token_bytes(const std::string& dtype) { return dtype == "uint32" ? 4 : dtype == "uint8" ? 1 : 2; }

// The number of tokens in a file of `bytes` bytes, which must be whole tokens of `dtype` and at
// least one window of seq_len + 1; the errors name the config `field` holding `path`.
inline std::int64_t checked_token_count(std::uint64_t bytes, const std::string& path, const std::string& dtype,
                                        std::int64_t seq_len, const std::string& field) {
  const std::int64_t width = token_bytes(dtype);
  if (bytes == 0) throw tessera::ConfigError(path + " is empty", field);
  if (bytes % static_cast<std::uint64_t>(width) != 0) {
    throw tessera::ConfigError(path + " has " + std::to_string(bytes) + " bytes, not a multiple of " +
                                   std::to_string(width) + " (" + dtype + "); is dtype right?",
                               field);
  }
  const auto tokens = static_cast<std::int64_t>(bytes / static_cast<std::uint64_t>(width));
  if (tokens < seq_len + 1) {
    throw tessera::ConfigError(path + " has " + std::to_string(tokens) +
                                   " tokens, fewer than one window of seq_len + 1 = " + std::to_string(seq_len + 1),
                               field);
  }
  return tokens;
}

// The same, from the file's size on disk (validation reads no tokens).
inline void check_token_file_size(const std::string& path, const std::string& dtype, std::int64_t seq_len,
                                  const std::string& field) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;  // the host reports it (existing_path), unless told not to check
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec) throw tessera::ConfigError("cannot read the size of " + path + ": " + ec.message(), field);
  checked_token_count(bytes, path, dtype, seq_len, field);
}

}  // namespace tessera::token_data
