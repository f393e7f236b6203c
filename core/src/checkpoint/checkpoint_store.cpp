#include "tessera/core/checkpoint/checkpoint_store.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/checkpoint/checkpoint_state.hpp"
#include "tessera/core/process/failpoint.hpp"
#include "tessera/formats/durable_file.hpp"
#include "tessera/log.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

constexpr const char* kLatest = "latest";

std::string trimmed_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  text.erase(text.find_last_not_of(" \n\r\t") + 1);
  return text;
}

}  // namespace

std::string CheckpointFolder::rank_dir(std::int64_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05lld", static_cast<long long>(rank));
  return name;
}

CheckpointStore::CheckpointStore(std::string checkpoints_dir, std::string exports_dir)
    : dir_(std::move(checkpoints_dir)), exports_dir_(std::move(exports_dir)) {}

CheckpointStore CheckpointStore::for_run(const std::string& run_dir, const std::optional<std::string>& checkpoints_dir) {
  return CheckpointStore(checkpoints_dir.value_or((fs::path(run_dir) / "checkpoints").string()),
                         (fs::path(run_dir) / "exports").string());
}

std::string CheckpointStore::name_of(std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

std::int64_t CheckpointStore::step_of(const fs::path& path) {
  const std::string name = path.filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(5));
}

CheckpointFolder CheckpointStore::checkpoint(std::int64_t step) const { return CheckpointFolder(fs::path(dir_) / name_of(step)); }

CheckpointFolder CheckpointStore::in_progress(std::int64_t step) const {
  return CheckpointFolder(fs::path(dir_) / (name_of(step) + ".tmp"));
}

fs::path CheckpointStore::export_folder(std::int64_t step) const { return fs::path(exports_dir_) / name_of(step); }

fs::path CheckpointStore::export_in_progress(std::int64_t step) const {
  return fs::path(exports_dir_) / (name_of(step) + ".tmp");
}

std::vector<std::pair<std::int64_t, fs::path>> CheckpointStore::step_folders(const std::string& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = step_of(entry.path());
    if (step >= 0 && entry.is_directory()) out.emplace_back(step, entry.path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::vector<std::pair<std::int64_t, fs::path>> CheckpointStore::complete() const { return step_folders(dir_); }

std::string CheckpointStore::newest_valid() const {
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path latest = fs::path(dir_) / kLatest;
  if (fs::exists(latest, ec)) {
    const std::string name = trimmed_text(latest);
    if (step_of(name) >= 0) candidates.push_back(fs::path(dir_) / name);
  }
  for (const auto& [step, path] : complete()) {
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) > step_of(b); });
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

void CheckpointStore::set_latest(std::int64_t step) const {
  const fs::path latest = fs::path(dir_) / kLatest;
  const std::string pending = latest.string() + ".tmp";
  write_file_durably(pending, name_of(step) + "\n");
  rename_durably(pending, latest.string());
}

void CheckpointStore::prune(std::int64_t keep_last, std::int64_t newest) const {
  if (keep_last <= 0) return;
  std::int64_t kept = 0;
  for (const auto& [step, path] : complete()) {
    if (step > newest) continue;  // not ours to judge (superseded folders are renamed at resume)
    if (++kept <= keep_last) continue;
    failpoint("checkpoint.before_prune");
    log::info("checkpoint: removing ", path.string(), " (keep_last ", keep_last, ")");
    if (const std::error_code ec = remove_folder(path)) {
      log::warn("checkpoint: could not remove ", path.string(), ": ", ec.message());
    }
  }
}

std::error_code CheckpointStore::remove_folder(const fs::path& folder) {
  std::error_code ec;
  const fs::path doomed = folder.string() + ".deleting.tmp";
  fs::remove_all(doomed, ec);
  fs::rename(folder, doomed, ec);
  if (!ec) fs::remove_all(doomed, ec);
  return ec;
}

void CheckpointStore::discard(std::int64_t step) const {
  const fs::path folder = checkpoint(step).path();
  if (const std::error_code ec = remove_folder(folder)) {
    throw CheckpointError("cannot remove " + folder.string() + ": " + ec.message());
  }
}

void CheckpointStore::supersede_after(std::int64_t step) const {
  bool set_aside = false;
  // The checkpoints, then the exports of the same steps: a later save or export of this run at
  // one of those steps must not find the other history's folder there and keep it.
  for (const std::string& dir : {dir_, exports_dir_}) {
    for (const auto& [later, path] : step_folders(dir)) {
      if (later <= step) continue;
      // A history set aside before keeps its name: this one takes the next free .superseded.N.
      fs::path aside = path.string() + ".superseded";
      std::error_code rename_ec;
      for (int n = 2; fs::exists(aside, rename_ec); ++n) aside = path.string() + ".superseded." + std::to_string(n);
      fs::rename(path, aside, rename_ec);
      if (rename_ec) {
        log::warn("checkpoint: could not set aside ", path.string(), ": ", rename_ec.message());
        continue;
      }
      set_aside = true;
      log::warn("checkpoint: ", path.string(), " is from a run that ",
                step == 0 ? "this fresh run replaces" : "went past step " + std::to_string(step), "; renamed to ",
                aside.string(), " (delete it when no longer needed)");
    }
  }
  if (!set_aside) return;
  // `latest` named one of them: it now names the checkpoint resumed from, where this folder has it.
  std::error_code ec;
  if (step > 0 && fs::is_directory(checkpoint(step).path(), ec)) {
    set_latest(step);
  } else {
    fs::remove(fs::path(dir_) / kLatest, ec);
  }
}

void CheckpointStore::remove_incomplete() const {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      log::info("checkpoint: removing the interrupted save ", entry.path().string());
      fs::remove_all(entry.path());
    }
  }
}

}  // namespace tessera::core
