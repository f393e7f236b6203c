#include "tessera/core/checkpoint/checkpoint_reader.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <limits>
#include <map>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/core/checkpoint/reshard.hpp"
#include "tessera/formats/crc32c.hpp"
#include "tessera/formats/safetensors.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An integer member of `object` that fits T. nlohmann's get<T>() converts a float member too,
// with undefined behaviour when it is out of range (found by fuzzing: "step": 6.2e34).
template <class T>
T integer_at(const nlohmann::json& object, const char* key, const std::string& where) {
  const nlohmann::json& value = object.at(key);
  const auto max = static_cast<std::uint64_t>(std::numeric_limits<T>::max());
  if (value.is_number_unsigned() && value.get<std::uint64_t>() <= max) return static_cast<T>(value.get<std::uint64_t>());
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    const auto v = value.get<std::int64_t>();
    if (v >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) && (v < 0 || static_cast<std::uint64_t>(v) <= max)) {
      return static_cast<T>(v);
    }
  }
  throw CheckpointError(where + ": " + key + " is " + value.dump() + ", not an integer in range");
}

// The {"NAME": {"bytes": N, "crc32c": C}} list of a metadata.json or a rank's manifest.json.
// Names stay inside the checkpoint folder: relative, without "..". Throws CheckpointError, or
// nlohmann's exceptions for members of the wrong type (the callers say which file).
std::map<std::string, WrittenFile> read_file_list(const nlohmann::json& files, const std::string& where) {
  if (!files.is_object()) throw CheckpointError(where + ": the file list is not an object");
  std::map<std::string, WrittenFile> out;
  for (const auto& [name, info] : files.items()) {
    const fs::path relative(name);
    bool inside = !name.empty() && relative.is_relative();
    for (const auto& part : relative) inside = inside && part != "..";
    if (!inside) throw CheckpointError(where + ": lists \"" + name + "\", which is not a file inside the checkpoint");
    out[name] = {integer_at<std::uint64_t>(info, "bytes", where), integer_at<std::uint32_t>(info, "crc32c", where)};
  }
  return out;
}

}  // namespace

std::map<std::string, WrittenFile> read_rank_manifest(const std::string& path) {
  try {
    return read_file_list(nlohmann::json::parse(read_text(path)), path);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path + " is malformed: " + e.what());
  }
}

CheckpointMetadata verify_checkpoint(const std::string& path, CheckpointParts parts) {
  const fs::path dir(path);
  const CheckpointFolder folder(dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw CheckpointError("checkpoint " + path + " does not exist");
  if (!fs::exists(folder.file(CheckpointFolder::kMetadata))) {
    throw CheckpointError("checkpoint " + path + " has no metadata.json (an interrupted save?)");
  }
  CheckpointMetadata m;
  m.path = path;
  try {
    const auto meta = nlohmann::json::parse(read_text(folder.file(CheckpointFolder::kMetadata)));
    const std::string where = "checkpoint " + path + ": metadata.json";
    m.format_version = integer_at<int>(meta, "format_version", where);
    if (m.format_version != kCheckpointFormatVersion) {
      throw CheckpointError("checkpoint " + path + " has format version " + std::to_string(m.format_version) +
                            "; this Tessera reads version " + std::to_string(kCheckpointFormatVersion));
    }
    m.tessera_version = meta.at("tessera_version").get<std::string>();
    m.world_size = integer_at<std::int64_t>(meta, "world_size", where);
    m.strategy = meta.at("strategy").get<std::string>();
    m.optimizer_sharded = meta.at("optimizer_sharded").get<bool>();
    m.step = integer_at<std::int64_t>(meta, "step", where);
    m.tokens = integer_at<std::int64_t>(meta, "tokens", where);
    m.samples = integer_at<std::int64_t>(meta, "samples", where);
    m.elapsed_s = meta.at("elapsed_s").get<double>();
    m.files = read_file_list(meta.at("files"), "checkpoint " + path + ": metadata.json");
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint " + path + ": metadata.json is malformed: " + e.what());
  }
  if (m.world_size < 1 || !m.files.count(CheckpointFolder::kModel)) {
    throw CheckpointError("checkpoint " + path + ": metadata.json lists no model");
  }
  const std::int64_t named = CheckpointStore::step_of(dir);
  if (named >= 0 && named != m.step) {
    throw CheckpointError("checkpoint " + path + ": metadata.json says step " + std::to_string(m.step) +
                          " but the folder is step " + std::to_string(named));
  }
  for (const auto& [file, expected] : m.files) {
    const bool read = parts == CheckpointParts::everything || file == CheckpointFolder::kModel ||
                      (parts == CheckpointParts::model_and_reference && file == CheckpointFolder::kReference);
    if (!read) continue;  // not read: not checked
    const fs::path p = folder.file(file);
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) throw CheckpointError("checkpoint " + path + ": " + file + " is missing");
    if (size != expected.bytes) {
      throw CheckpointError("checkpoint " + path + ": " + file + " has " + std::to_string(size) + " bytes, " +
                            std::to_string(expected.bytes) + " were written");
    }
    std::uint32_t crc = 0;
    try {
      crc = file_crc32c(p.string());
    } catch (const Error& e) {
      throw CheckpointError("checkpoint " + path + ": " + e.what());
    }
    if (crc != expected.crc32c) {
      char text[96];
      std::snprintf(text, sizeof text, "checksum mismatch (CRC-32C %08x, %08x was written)", crc, expected.crc32c);
      throw CheckpointError("checkpoint " + path + ": " + file + ": " + text + "; the file is corrupt");
    }
  }
  return m;
}

LoadedCheckpoint read_checkpoint(const std::string& path, std::int64_t rank, CheckpointParts parts) {
  LoadedCheckpoint out;
  out.metadata = verify_checkpoint(path, parts);
  const CheckpointFolder folder{fs::path(path)};
  out.model = read_safetensors(folder.file(CheckpointFolder::kModel).string()).tensors;
  if (parts == CheckpointParts::model) return out;
  if (out.metadata.files.count(CheckpointFolder::kReference)) {
    out.reference = read_safetensors(folder.file(CheckpointFolder::kReference).string()).tensors;
  }
  if (parts == CheckpointParts::model_and_reference) return out;
  // Every rank that holds optimizer state of its own wrote it: all with sharded state, else
  // rank 0, or with tensor parallelism one rank per tensor-parallel rank, and for stacked experts
  // under expert parallelism one per expert-parallel rank (a file may then hold some parameters
  // only). metadata.json lists them.
  std::vector<OptimizerPart> written_parts;
  for (std::int64_t r = 0; r < out.metadata.world_size; ++r) {
    const std::string relative = CheckpointFolder::rank_file(r, CheckpointFolder::kOptimizer);
    if (!out.metadata.files.count(relative)) continue;
    const fs::path file = folder.file(relative);
    OptimizerPart part;
    for (auto& [key, t] : read_safetensors(file.string()).tensors) {
      if (key.rfind("state/", 0) == 0) part.state[key.substr(6)] = t;
      if (key.rfind("range/", 0) == 0) part.ranges[key.substr(6)] = t;
      if (key.rfind("layout/", 0) == 0) part.layouts[key.substr(7)] = t;
      if (key.rfind("name/", 0) == 0) {
        part.names[key.substr(5)] = std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.numel()));
      }
    }
    written_parts.push_back(std::move(part));
  }
  if (written_parts.empty()) throw CheckpointError("checkpoint " + path + ": metadata.json lists no optimizer state");
  out.optimizer_names = key_parts_by_name(written_parts);
  out.optimizer = merge_optimizer_files(written_parts);
  const std::int64_t mine = rank < out.metadata.world_size ? rank : 0;
  out.data = read_safetensors(folder.file(CheckpointFolder::rank_file(mine, CheckpointFolder::kData)).string()).tensors;
  // Every rank's default generators are in the same state (they draw the same numbers, so that
  // tensor-parallel peers drop the same units of replicated activations): a rank beyond the saved
  // ones takes rank 0's. The sharded stream's state is per tensor-parallel rank (trainer_state.cpp
  // keeps it only where that rank is the same).
  out.rng = read_safetensors(folder.file(CheckpointFolder::rank_file(mine, CheckpointFolder::kRng)).string()).tensors;
  return out;
}

}  // namespace tessera::core
