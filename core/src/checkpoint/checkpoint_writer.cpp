#include "tessera/core/checkpoint/checkpoint_writer.hpp"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <cstring>
#include <map>
#include <thread>

#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/process/failpoint.hpp"
#include "tessera/log.hpp"
#include "tessera/formats/safetensors.hpp"
#include "tessera/version.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

nlohmann::json files_json(const std::map<std::string, WrittenFile>& files) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, f] : files) out[name] = {{"bytes", f.bytes}, {"crc32c", f.crc32c}};
  return out;
}

std::map<std::string, std::string> model_file_metadata(std::int64_t step) {
  return {{"format", "pt"}, {"tessera_step", std::to_string(step)}};
}

// This rank's files of the checkpoint in progress; returns their sizes and checksums by the
// relative names metadata.json lists.
std::map<std::string, WrittenFile> write_rank_files(const CheckpointFolder& folder, const CheckpointState& state) {
  std::map<std::string, WrittenFile> files;
  auto write = [&](const std::string& relative, const StateDict& tensors) {
    files[relative] = write_safetensors(folder.file(relative).string(), tensors);
  };
  if (state.rank == 0) {
    files[CheckpointFolder::kModel] =
        write_safetensors(folder.file(CheckpointFolder::kModel).string(), state.model, model_file_metadata(state.step));
    failpoint("checkpoint.after_model");
    if (!state.reference.empty()) write(CheckpointFolder::kReference, state.reference);
    files[CheckpointFolder::kConfig] = write_file_durably(folder.file(CheckpointFolder::kConfig).string(), state.config_yaml);
  }
  if (state.write_optimizer) {
    StateDict tensors;
    for (const auto& [k, v] : state.optimizer) tensors["state/" + k] = v;
    for (const auto& [k, v] : state.optimizer_ranges) tensors["range/" + k] = v;
    for (const auto& [k, v] : state.optimizer_layouts) tensors["layout/" + k] = v;
    for (const auto& [k, name] : state.optimizer_names) {
      at::Tensor bytes = at::empty({static_cast<std::int64_t>(name.size())}, at::kByte);
      if (!name.empty()) std::memcpy(bytes.data_ptr(), name.data(), name.size());
      tensors["name/" + k] = bytes;
    }
    write(CheckpointFolder::rank_file(state.rank, CheckpointFolder::kOptimizer), tensors);
  }
  write(CheckpointFolder::rank_file(state.rank, CheckpointFolder::kData), state.data);
  write(CheckpointFolder::rank_file(state.rank, CheckpointFolder::kRng), state.rng);
  return files;
}

// A rank whose part of a save failed renames its folder to this, so rank 0 stops waiting for it
// at once (a rename needs no free space, unlike a new file on a full disk).
fs::path failure_mark(const CheckpointFolder& folder, std::int64_t rank) {
  return folder.file(CheckpointFolder::rank_dir(rank) + ".failed");
}

// Rank 0: waits for every other rank's manifest, or its failure mark, and adds its files.
void collect_other_ranks(const CheckpointFolder& folder, const CheckpointState& state, std::chrono::milliseconds timeout,
                         std::map<std::string, WrittenFile>& files) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::int64_t r = 1; r < state.world_size; ++r) {
    const fs::path manifest = folder.file(CheckpointFolder::rank_file(r, CheckpointFolder::kManifest));
    const fs::path failed = failure_mark(folder, r);
    while (!fs::exists(manifest)) {
      if (fs::exists(failed)) {
        throw CheckpointError("checkpoint " + CheckpointStore::name_of(state.step) + ": rank " + std::to_string(r) +
                              " failed to write its part (see its log); the save is incomplete");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw CheckpointError("checkpoint " + CheckpointStore::name_of(state.step) + ": rank " + std::to_string(r) +
                              " did not finish writing within " + std::to_string(timeout.count() / 1000) +
                              " s; the save is incomplete");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (const auto& [file, written] : read_rank_manifest(manifest.string())) files[file] = written;
  }
}

nlohmann::json metadata_json(const CheckpointState& state, const std::map<std::string, WrittenFile>& files) {
  return {{"format_version", kCheckpointFormatVersion},
          {"tessera_version", TESSERA_VERSION_STRING},
          {"world_size", state.world_size},
          {"strategy", state.strategy},
          {"optimizer_sharded", state.optimizer_sharded},
          {"mesh", state.mesh},
          {"step", state.step},
          {"tokens", state.tokens},
          {"samples", state.samples},
          {"elapsed_s", state.elapsed_s},
          {"files", files_json(files)}};
}

}  // namespace

bool write_checkpoint(const CheckpointStore& store, const CheckpointState& state, std::int64_t keep_last,
                      std::chrono::milliseconds timeout) {
  const CheckpointFolder final_folder = store.checkpoint(state.step);
  // Every rank sees the same answer: rank 0 renames only after every rank got past this point.
  // A valid checkpoint of this step stays; an invalid one (a run resumed from an older
  // checkpoint because this one was corrupt) is replaced.
  if (fs::exists(final_folder.path())) {
    try {
      verify_checkpoint(final_folder.path().string());
      return false;
    } catch (const CheckpointError& e) {
      if (state.rank == 0) log::warn("checkpoint: replacing an invalid one: ", e.what());
    }
  }
  const CheckpointFolder tmp = store.in_progress(state.step);
  const fs::path mine = tmp.file(CheckpointFolder::rank_dir(state.rank));
  fs::create_directories(mine);

  std::map<std::string, WrittenFile> files;
  const fs::path manifest = tmp.file(CheckpointFolder::rank_file(state.rank, CheckpointFolder::kManifest));
  try {
    files = write_rank_files(tmp, state);
    failpoint("checkpoint.before_manifest");
    fsync_directory(mine.string());
    // Written aside and renamed: rank 0 treats the manifest's existence as "this rank is done",
    // so it must never see it half-written.
    const std::string pending =
        tmp.file(CheckpointFolder::rank_file(state.rank, CheckpointFolder::kManifestInProgress)).string();
    write_file_durably(pending, files_json(files).dump(1));
    rename_durably(pending, manifest.string());
  } catch (...) {
    // Once the manifest is there (only the directory's fsync after its rename failed), rank 0
    // may have read it already: the folder stays, and this rank's error stops the run.
    std::error_code ignored;
    if (state.rank != 0 && !fs::exists(manifest, ignored)) {
      fs::rename(mine, failure_mark(tmp, state.rank), ignored);  // best effort: else rank 0 waits for its timeout
    }
    throw;
  }
  if (state.rank != 0) return true;

  // Rank 0 completes the checkpoint once every rank's manifest is there.
  collect_other_ranks(tmp, state, timeout, files);
  write_file_durably(tmp.file(CheckpointFolder::kMetadata).string(), metadata_json(state, files).dump(1));
  fsync_directory(tmp.path().string());
  failpoint("checkpoint.before_rename");
  // The invalid one found above, if any, goes first: the rename below needs the name free.
  if (fs::exists(final_folder.path())) store.discard(state.step);
  rename_durably(tmp.path().string(), final_folder.path().string());
  failpoint("checkpoint.after_rename");
  store.set_latest(state.step);
  store.prune(keep_last, state.step);
  return true;
}

void write_model_export(const CheckpointStore& store, const CheckpointState& state, std::uint64_t max_shard_bytes) {
  const fs::path final_dir = store.export_folder(state.step);
  if (fs::exists(final_dir)) return;
  const fs::path tmp = store.export_in_progress(state.step);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  if (state.hf_export) {
    write_hf_checkpoint(tmp.string(), *state.hf_export, max_shard_bytes);
  } else if (state.peft_export) {
    write_file_durably((tmp / CheckpointStore::kPeftConfig).string(), state.peft_export->adapter_config_json);
    write_safetensors((tmp / CheckpointStore::kPeftModel).string(), state.peft_export->tensors, {{"format", "pt"}});
    fsync_directory(tmp.string());
  } else {
    // The base and the adapters apart: init_from of the folder takes the base, an adapter's
    // init_from the adapters.
    StateDict base, adapters;
    for (const auto& [name, tensor] : state.model) (state.adapter_tensors.count(name) ? adapters : base)[name] = tensor;
    write_safetensors((tmp / CheckpointStore::kExportModel).string(), base, model_file_metadata(state.step));
    if (!adapters.empty()) {
      write_safetensors((tmp / CheckpointStore::kExportAdapters).string(), adapters, model_file_metadata(state.step));
    }
    write_file_durably((tmp / CheckpointStore::kExportConfig).string(), state.model_config_json);
    fsync_directory(tmp.string());
  }
  rename_durably(tmp.string(), final_dir.string());
}

}  // namespace tessera::core
