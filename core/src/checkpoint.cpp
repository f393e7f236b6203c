#include "tessera/core/checkpoint.hpp"

#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessera/crc32c.hpp"
#include "tessera/core/failpoint.hpp"
#include "tessera/safetensors.hpp"
#include "tessera/log.hpp"
#include "tessera/version.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

std::string rank_dir(std::int64_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05lld", static_cast<long long>(rank));
  return name;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read " + path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json files_json(const std::map<std::string, WrittenFile>& files) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, f] : files) out[name] = {{"bytes", f.bytes}, {"crc32c", f.crc32c}};
  return out;
}

// The step a folder name stands for, or -1 ("step_00001000" -> 1000).
std::int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(5));
}

// Complete checkpoints under dir, newest first.
std::vector<std::pair<std::int64_t, fs::path>> complete_checkpoints(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) out.emplace_back(step, entry.path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Removes the oldest checkpoints before `newest` (just written) beyond keep_last. Best effort:
// a folder that cannot be removed is reported, never a failure of the save that completed.
void prune(const fs::path& dir, std::int64_t keep_last, std::int64_t newest) {
  if (keep_last <= 0) return;
  std::int64_t kept = 0;
  for (const auto& [step, path] : complete_checkpoints(dir)) {
    if (step > newest) continue;  // not ours to judge (superseded folders are renamed at resume)
    if (++kept <= keep_last) continue;
    failpoint("checkpoint.before_prune");
    log::info("checkpoint: removing ", path.string(), " (keep_last ", keep_last, ")");
    // Renamed first, so a kill midway leaves a .tmp folder (ignored, removed at the next start),
    // never a partly deleted one under a checkpoint's name.
    std::error_code ec;
    const fs::path doomed = path.string() + ".deleting.tmp";
    fs::rename(path, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
    if (ec) log::warn("checkpoint: could not remove ", path.string(), ": ", ec.message());
  }
}

// The index i of a per-parameter key "param.<i>.<field>", or -1.
long long param_index(const std::string& key) {
  if (key.rfind("param.", 0) != 0) return -1;
  const auto dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6) return -1;
  for (std::size_t i = 6; i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9') return -1;
  }
  return std::stoll(key.substr(6, dot - 6));
}

}  // namespace

std::int64_t checkpoint_step(const std::string& path) {
  return step_of(fs::path(path).filename().string());
}

std::string checkpoint_name(std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

bool write_checkpoint(const std::string& dir, const CheckpointState& state, std::int64_t keep_last,
                      std::chrono::milliseconds timeout) {
  const fs::path root(dir);
  const std::string name = checkpoint_name(state.step);
  const fs::path final_dir = root / name;
  // Every rank sees the same answer: rank 0 renames only after every rank got past this point.
  // A valid checkpoint of this step stays; an invalid one (a run resumed from an older
  // checkpoint because this one was corrupt) is replaced.
  if (fs::exists(final_dir)) {
    try {
      verify_checkpoint(final_dir.string());
      return false;
    } catch (const CheckpointError& e) {
      if (state.rank == 0) log::warn("checkpoint: replacing an invalid one: ", e.what());
    }
  }
  const fs::path tmp = root / (name + ".tmp");
  const fs::path mine = tmp / rank_dir(state.rank);
  fs::create_directories(mine);

  std::map<std::string, WrittenFile> files;
  auto record = [&](const std::string& relative, WrittenFile written) { files[relative] = written; };
  if (state.rank == 0) {
    record("model.safetensors", write_safetensors((tmp / "model.safetensors").string(), state.model,
                                                  {{"format", "pt"}, {"tessera_step", std::to_string(state.step)}}));
    failpoint("checkpoint.after_model");
    record("config.yaml", write_file_durably((tmp / "config.yaml").string(), state.config_yaml));
  }
  const std::string prefix = rank_dir(state.rank) + "/";
  if (state.write_optimizer) {
    StateDict tensors;
    for (const auto& [k, v] : state.optimizer) tensors["state/" + k] = v;
    for (const auto& [k, v] : state.optimizer_ranges) tensors["range/" + k] = v;
    record(prefix + "optimizer.safetensors", write_safetensors((mine / "optimizer.safetensors").string(), tensors));
  }
  record(prefix + "data.safetensors", write_safetensors((mine / "data.safetensors").string(), state.data));
  record(prefix + "rng.safetensors", write_safetensors((mine / "rng.safetensors").string(), state.rng));
  failpoint("checkpoint.before_manifest");
  fsync_directory(mine.string());
  // Written aside and renamed: rank 0 treats the manifest's existence as "this rank is done",
  // so it must never see it half-written.
  write_file_durably((mine / "manifest.json.tmp").string(), files_json(files).dump(1));
  rename_durably((mine / "manifest.json.tmp").string(), (mine / "manifest.json").string());
  if (state.rank != 0) return true;

  // Rank 0 completes the checkpoint once every rank's manifest is there.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::int64_t r = 1; r < state.world_size; ++r) {
    const fs::path manifest = tmp / rank_dir(r) / "manifest.json";
    while (!fs::exists(manifest)) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw CheckpointError("checkpoint " + name + ": rank " + std::to_string(r) + " did not finish writing within " +
                              std::to_string(timeout.count() / 1000) + " s; the save is incomplete");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto theirs = nlohmann::json::parse(read_text(manifest));
    for (const auto& [file, info] : theirs.items()) {
      files[file] = {info.at("bytes").get<std::uint64_t>(), info.at("crc32c").get<std::uint32_t>()};
    }
  }
  nlohmann::json meta = {{"format_version", kCheckpointFormatVersion},
                         {"tessera_version", TESSERA_VERSION_STRING},
                         {"world_size", state.world_size},
                         {"strategy", state.strategy},
                         {"optimizer_sharded", state.optimizer_sharded},
                         {"step", state.step},
                         {"tokens", state.tokens},
                         {"samples", state.samples},
                         {"elapsed_s", state.elapsed_s},
                         {"files", files_json(files)}};
  write_file_durably((tmp / "metadata.json").string(), meta.dump(1));
  fsync_directory(tmp.string());
  failpoint("checkpoint.before_rename");
  if (fs::exists(final_dir)) {
    // The invalid one found above: moved aside under a .tmp name (removed at the next start
    // if this process dies now), so the rename below never meets a non-empty folder.
    const fs::path aside = root / (name + ".invalid.tmp");
    fs::remove_all(aside);
    rename_durably(final_dir.string(), aside.string());
    fs::remove_all(aside);
  }
  rename_durably(tmp.string(), final_dir.string());
  failpoint("checkpoint.after_rename");
  write_file_durably((root / "latest.tmp").string(), name + "\n");
  rename_durably((root / "latest.tmp").string(), (root / "latest").string());
  prune(root, keep_last, state.step);
  return true;
}

void write_model_export(const std::string& exports_dir, const CheckpointState& state) {
  const fs::path final_dir = fs::path(exports_dir) / checkpoint_name(state.step);
  if (fs::exists(final_dir)) return;
  const fs::path tmp = fs::path(exports_dir) / (checkpoint_name(state.step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_safetensors((tmp / "model.safetensors").string(), state.model,
                    {{"format", "pt"}, {"tessera_step", std::to_string(state.step)}});
  write_file_durably((tmp / "config.json").string(), state.model_config_json);
  fsync_directory(tmp.string());
  rename_durably(tmp.string(), final_dir.string());
}

CheckpointMetadata verify_checkpoint(const std::string& path) {
  const fs::path dir(path);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw CheckpointError("checkpoint " + path + " does not exist");
  if (!fs::exists(dir / "metadata.json")) {
    throw CheckpointError("checkpoint " + path + " has no metadata.json (an interrupted save?)");
  }
  CheckpointMetadata m;
  m.path = path;
  try {
    const auto meta = nlohmann::json::parse(read_text(dir / "metadata.json"));
    m.format_version = meta.at("format_version").get<int>();
    if (m.format_version != kCheckpointFormatVersion) {
      throw CheckpointError("checkpoint " + path + " has format version " + std::to_string(m.format_version) +
                            "; this Tessera reads version " + std::to_string(kCheckpointFormatVersion));
    }
    m.tessera_version = meta.at("tessera_version").get<std::string>();
    m.world_size = meta.at("world_size").get<std::int64_t>();
    m.strategy = meta.at("strategy").get<std::string>();
    m.optimizer_sharded = meta.at("optimizer_sharded").get<bool>();
    m.step = meta.at("step").get<std::int64_t>();
    m.tokens = meta.at("tokens").get<std::int64_t>();
    m.samples = meta.at("samples").get<std::int64_t>();
    m.elapsed_s = meta.at("elapsed_s").get<double>();
    for (const auto& [file, info] : meta.at("files").items()) {
      m.files[file] = {info.at("bytes").get<std::uint64_t>(), info.at("crc32c").get<std::uint32_t>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint " + path + ": metadata.json is malformed: " + e.what());
  }
  if (m.world_size < 1 || !m.files.count("model.safetensors")) {
    throw CheckpointError("checkpoint " + path + ": metadata.json lists no model");
  }
  const std::int64_t named = step_of(dir.filename().string());
  if (named >= 0 && named != m.step) {
    throw CheckpointError("checkpoint " + path + ": metadata.json says step " + std::to_string(m.step) +
                          " but the folder is step " + std::to_string(named));
  }
  for (const auto& [file, expected] : m.files) {
    const fs::path p = dir / file;
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

std::string find_resumable_checkpoint(const std::string& dir) {
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "latest", ec)) {
    std::string name = read_text(fs::path(dir) / "latest");
    name.erase(name.find_last_not_of(" \n\r\t") + 1);
    if (step_of(name) >= 0) candidates.push_back(fs::path(dir) / name);
  }
  for (const auto& [step, path] : complete_checkpoints(dir)) {
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
  }
  std::sort(candidates.begin(), candidates.end(), [](const fs::path& a, const fs::path& b) {
    return step_of(a.filename().string()) > step_of(b.filename().string());
  });
  for (const auto& path : candidates) {
    try {
      verify_checkpoint(path.string());
      return path.string();
    } catch (const CheckpointError& e) {
      log::warn("skipping checkpoint: ", e.what());
    }
  }
  return {};
}

void supersede_checkpoints_after(const std::string& dir, std::int64_t step) {
  for (const auto& [later, path] : complete_checkpoints(dir)) {
    if (later <= step) continue;
    const fs::path aside = path.string() + ".superseded";
    std::error_code ec;
    fs::remove_all(aside, ec);
    fs::rename(path, aside, ec);
    if (ec) {
      log::warn("checkpoint: could not set aside ", path.string(), ": ", ec.message());
    } else {
      log::warn("checkpoint: ", path.string(), " is from a run that went past step ", step,
                "; renamed to ", aside.string(), " (delete it when no longer needed)");
    }
  }
}

void remove_incomplete_checkpoints(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      log::info("checkpoint: removing the interrupted save ", entry.path().string());
      fs::remove_all(entry.path());
    }
  }
}

LoadedCheckpoint read_checkpoint(const std::string& path, std::int64_t rank) {
  LoadedCheckpoint out;
  out.metadata = verify_checkpoint(path);
  const fs::path dir(path);
  out.model = read_safetensors((dir / "model.safetensors").string()).tensors;
  const std::int64_t writers = out.metadata.optimizer_sharded ? out.metadata.world_size : 1;
  std::vector<std::pair<StateDict, StateDict>> parts;
  for (std::int64_t r = 0; r < writers; ++r) {
    const fs::path file = dir / rank_dir(r) / "optimizer.safetensors";
    if (!fs::exists(file)) throw CheckpointError("checkpoint " + path + ": " + file.string() + " is missing");
    StateDict state, ranges;
    for (auto& [key, t] : read_safetensors(file.string()).tensors) {
      if (key.rfind("state/", 0) == 0) state[key.substr(6)] = t;
      if (key.rfind("range/", 0) == 0) ranges[key.substr(6)] = t;
    }
    parts.emplace_back(std::move(state), std::move(ranges));
  }
  out.optimizer = merge_optimizer_parts(parts);
  const std::string mine = rank_dir(rank < out.metadata.world_size ? rank : 0);
  out.data = read_safetensors((dir / mine / "data.safetensors").string()).tensors;
  if (rank < out.metadata.world_size) out.rng = read_safetensors((dir / mine / "rng.safetensors").string()).tensors;
  return out;
}

StateDict merge_optimizer_parts(const std::vector<std::pair<StateDict, StateDict>>& parts_and_ranges) {
  StateDict whole;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> covered;
  for (const auto& [state, ranges] : parts_and_ranges) {
    for (const auto& [key, t] : state) {
      const long long index = param_index(key);
      if (index < 0 || t.dim() == 0) {
        if (!whole.count(key)) whole[key] = t;  // the same on every rank
        continue;
      }
      const auto range = ranges.find("param." + std::to_string(index));
      if (range == ranges.end() || range->second.numel() != 3) {
        throw CheckpointError("optimizer state " + key + " has no saved range");
      }
      const auto begin = range->second[0].item<std::int64_t>(), end = range->second[1].item<std::int64_t>(),
                 numel = range->second[2].item<std::int64_t>();
      if (begin < 0 || end < begin || end > numel || t.numel() != end - begin) {
        throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) +
                              " elements for the range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
      }
      at::Tensor& target = whole[key];
      if (!target.defined()) target = at::zeros({numel}, t.options());
      if (target.numel() != numel) {
        throw CheckpointError("optimizer state " + key + ": ranks disagree on the parameter's size (" +
                              std::to_string(target.numel()) + " and " + std::to_string(numel) + ")");
      }
      target.narrow(0, begin, end - begin).copy_(t.reshape({-1}));
      covered[key].emplace_back(begin, end);
    }
  }
  // The parts of each parameter must tile it exactly: no hole silently zero, no overlap.
  for (auto& [key, ranges] : covered) {
    std::sort(ranges.begin(), ranges.end());
    std::int64_t next = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin != next) {
        throw CheckpointError("optimizer state " + key + ": the saved parts leave a hole or overlap at element " +
                              std::to_string(next));
      }
      next = end;
    }
    if (next != whole.at(key).numel()) {
      throw CheckpointError("optimizer state " + key + ": the saved parts cover " + std::to_string(next) + " of " +
                            std::to_string(whole.at(key).numel()) + " elements");
    }
  }
  return whole;
}

StateDict optimizer_state_for(const StateDict& whole, const std::vector<at::Tensor>& params,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>* ranges) {
  StateDict out;
  for (const auto& [key, t] : whole) {
    const long long index = param_index(key);
    if (index < 0 || t.dim() == 0) {
      out[key] = t.clone();
      continue;
    }
    if (index >= static_cast<long long>(params.size())) {
      throw CheckpointError("optimizer state " + key + " names parameter " + std::to_string(index) + " but the optimizer has " +
                            std::to_string(params.size()) + "; was the model changed?");
    }
    const at::Tensor& p = params[static_cast<std::size_t>(index)];
    if (t.numel() != p.numel()) {
      throw CheckpointError("optimizer state " + key + " has " + std::to_string(t.numel()) + " elements, parameter " +
                            std::to_string(index) + " has " + std::to_string(p.numel()) + "; was the model changed?");
    }
    if (ranges) {
      const auto [begin, end] = (*ranges)[static_cast<std::size_t>(index)];
      out[key] = t.reshape({-1}).narrow(0, begin, end - begin).clone();
    } else {
      out[key] = t.reshape(p.sizes()).clone();
    }
  }
  return out;
}

}  // namespace tessera::core
