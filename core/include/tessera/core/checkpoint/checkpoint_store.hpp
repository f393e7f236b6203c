// The one owner of the checkpoint folders' layout: where the checkpoint of a step goes, where a
// save in progress is written, which folders are complete, `latest`, keep-last-N, checkpoints
// set aside at resume, the export folders, and the files inside one checkpoint. Nothing else
// composes these paths (docs/checkpointing.md describes the format).
//
//   CHECKPOINT_DIR/                  checkpoint.dir (default RUN_DIR/checkpoints)
//     latest                         the name of the newest complete checkpoint
//     step_00001000/                 a complete checkpoint (CheckpointFolder below)
//     step_00001000.tmp/             a save in progress (removed at the next start)
//     step_00001200.superseded/      after a run resumed from an earlier step, or a fresh run
//                                    started in this folder (kept for the user)
//   EXPORTS_DIR/                     RUN_DIR/exports
//     step_00001000/                 model.safetensors and config.json
//     step_00001200.superseded/      set aside with the checkpoint of its step
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::core {

// The files of one checkpoint folder (complete or in progress). Relative names are what
// metadata.json lists; file() makes them paths.
//
//   metadata.json              format, versions, world size, strategy, progress, and the
//                              size and CRC-32C of every file below
//   config.yaml                the resolved run spec
//   model.safetensors          the whole model (rank 0 writes it)
//   rank_00000/                one folder per rank
//     optimizer.safetensors    its optimizer state (only rank 0's when not sharded)
//     data.safetensors         its dataset position
//     rng.safetensors          its random generators
//     manifest.json            its files' sizes and checksums (written last)
class CheckpointFolder {
 public:
  static constexpr const char* kMetadata = "metadata.json";
  static constexpr const char* kConfig = "config.yaml";
  static constexpr const char* kModel = "model.safetensors";
  static constexpr const char* kReference = "reference.safetensors";  // a loss's frozen reference model
  static constexpr const char* kOptimizer = "optimizer.safetensors";
  static constexpr const char* kData = "data.safetensors";
  static constexpr const char* kRng = "rng.safetensors";
  static constexpr const char* kManifest = "manifest.json";
  static constexpr const char* kManifestInProgress = "manifest.json.tmp";  // renamed to kManifest when complete

  explicit CheckpointFolder(std::filesystem::path path) : path_(std::move(path)) {}
  const std::filesystem::path& path() const { return path_; }
  // A file of this folder by its relative name.
  std::filesystem::path file(const std::string& relative) const { return path_ / relative; }

  static std::string rank_dir(std::int64_t rank);  // "rank_00000"
  // "rank_00000/optimizer.safetensors"
  static std::string rank_file(std::int64_t rank, const std::string& name) { return rank_dir(rank) + "/" + name; }

 private:
  std::filesystem::path path_;
};

class CheckpointStore {
 public:
  static constexpr const char* kExportModel = "model.safetensors";
  static constexpr const char* kExportConfig = "config.json";
  // A Tessera export's adapter tensors, apart from the base (model.safetensors).
  static constexpr const char* kExportAdapters = "adapters.safetensors";
  // An export in PEFT's format (checkpoint.export_format: peft).
  static constexpr const char* kPeftConfig = "adapter_config.json";
  static constexpr const char* kPeftModel = "adapter_model.safetensors";

  CheckpointStore() = default;
  CheckpointStore(std::string checkpoints_dir, std::string exports_dir);
  // A run's folders: `checkpoints_dir` (checkpoint.dir) or RUN_DIR/checkpoints, and RUN_DIR/exports.
  static CheckpointStore for_run(const std::string& run_dir, const std::optional<std::string>& checkpoints_dir);

  const std::string& dir() const { return dir_; }
  const std::string& exports_dir() const { return exports_dir_; }

  static std::string name_of(std::int64_t step);  // "step_00001000"
  // The step a checkpoint folder's path or name stands for, or -1 when it is not one (the
  // reader checks that the folder's metadata agrees).
  static std::int64_t step_of(const std::filesystem::path& path);

  CheckpointFolder checkpoint(std::int64_t step) const;   // DIR/step_N
  CheckpointFolder in_progress(std::int64_t step) const;  // DIR/step_N.tmp
  std::filesystem::path export_folder(std::int64_t step) const;       // EXPORTS/step_N
  std::filesystem::path export_in_progress(std::int64_t step) const;  // EXPORTS/step_N.tmp

  // Complete checkpoint folders (by name; not verified), newest first.
  std::vector<std::pair<std::int64_t, std::filesystem::path>> complete() const;
  // The newest checkpoint that verifies (`latest` names the newest complete one unless a crash
  // came between a rename and its update), logging every invalid one it skips; "" when none.
  std::string newest_valid() const;
  // Points `latest` at the checkpoint of `step`, atomically.
  void set_latest(std::int64_t step) const;
  // Removes the oldest checkpoints up to `newest` beyond keep_last (0: keep all). Best effort:
  // a folder that cannot be removed is reported, never a failure of the save that completed.
  void prune(std::int64_t keep_last, std::int64_t newest) const;
  // A run resumed at `step` (or started fresh: 0) continues a different history than the
  // checkpoints and exports after it: those are renamed to step_N.superseded (kept for the user,
  // never resumed from, pruned or mistaken for this run's), and `latest` no longer names them.
  void supersede_after(std::int64_t step) const;
  // Removes the folders of saves that never completed (*.tmp).
  void remove_incomplete() const;
  // Removes the checkpoint of `step` (an invalid one about to be replaced). Renamed to a .tmp
  // name first, so a crash midway leaves a folder the next start removes, never a partial
  // checkpoint under a checkpoint's name. Throws CheckpointError when it cannot.
  void discard(std::int64_t step) const;

 private:
  // The step_N folders in `dir` (checkpoints or exports; not verified), newest first.
  static std::vector<std::pair<std::int64_t, std::filesystem::path>> step_folders(const std::string& dir);
  // The rename-then-delete of discard() and prune(); returns what failed.
  static std::error_code remove_folder(const std::filesystem::path& folder);

  std::string dir_, exports_dir_;
};

}  // namespace tessera::core
