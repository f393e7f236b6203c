// The SDK's side of Parquet and Arrow input (tessera/formats/arrow_tables.hpp): the Arrow reader
// module is loaded on first use from the tessera folder beside the SDK library (build/lib/tessera
// in the build tree, PREFIX/lib/tessera installed), whichever executable or plugin asks; nothing
// that reads no such file ever loads Arrow. Also what a path names: globs and `datasets` folders.
#include "tessera/formats/arrow_tables.hpp"

#include <dlfcn.h>
#include <glob.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "arrow_reader_module.hpp"
#include "tessera/error.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using arrow_module::ArrowReaders;

// The module's path: beside the library holding this function (the SDK's), in its own folder.
fs::path module_path() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&module_path), &info) == 0 || info.dli_fname == nullptr) return {};
  return fs::path(info.dli_fname).parent_path() / arrow_module::kModuleFolder / arrow_module::kModuleName;
}

// The module's readers, or why there are none (loaded once; a failed load is not retried).
const ArrowReaders* readers(std::string& why) {
  static std::once_flag once;
  static const ArrowReaders* loaded = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const fs::path path = module_path();
    if (!fs::exists(path)) {
      error = "this Tessera was built without Apache Arrow (no " + path.string() +
              "), so it cannot read Parquet or Arrow files; install pyarrow into the project's .venv "
              "(tools/setup.sh does) and configure again";
      return;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* reason = ::dlerror();
      error = "cannot load the Arrow reader " + path.string() + ": " + (reason ? reason : "unknown error") +
              " (its Arrow libraries come from the pyarrow wheel it was built with)";
      return;
    }
    using Entry = const ArrowReaders* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "tessera_arrow_readers"));
    if (!entry) {
      error = path.string() + " is not Tessera's Arrow reader (no tessera_arrow_readers)";
      return;
    }
    loaded = entry();
  });
  why = error;
  return loaded;
}

const ArrowReaders& readers_for(const std::string& path) {
  std::string why;
  const ArrowReaders* r = readers(why);
  if (!r) throw ConfigError(path + ": " + why, "");
  return *r;
}

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

}  // namespace

bool arrow_inputs_available() {
  std::string why;
  return readers(why) != nullptr;
}

void read_parquet_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  readers_for(path).read_parquet(path, field, take);
}

void read_arrow_documents(const std::string& path, const std::string& field, const DocumentSink& take) {
  readers_for(path).read_arrow(path, field, take);
}

void read_parquet_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take) {
  readers_for(path).read_parquet_rows(path, columns, take);
}

void read_arrow_rows(const std::string& path, const std::vector<std::string>& columns, const RowSink& take) {
  readers_for(path).read_arrow_rows(path, columns, take);
}

std::vector<std::string> datasets_folder_files(const std::string& folder) {
  const fs::path dir(folder);
  if (fs::exists(dir / "dataset_dict.json")) {
    std::string splits;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_directory()) splits += (splits.empty() ? "" : ", ") + entry.path().filename().string();
    }
    throw ConfigError(folder + ": a DatasetDict folder (splits: " + splits + "); give one split's folder, such as " +
                          (dir / "train").string(),
                      "");
  }
  if (!fs::exists(dir / "dataset_info.json") && !fs::exists(dir / "state.json")) {
    throw ConfigError(folder + ": a folder that is not a datasets folder (no dataset_info.json or state.json); give files "
                               "or a quoted glob",
                      "");
  }
  std::vector<std::string> files;
  if (fs::exists(dir / "state.json")) {
    const std::string state_file = (dir / "state.json").string();
    std::ifstream in(state_file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      const nlohmann::json state = nlohmann::json::parse(text);
      for (const auto& f : state.at("_data_files")) files.push_back((dir / f.at("filename").get<std::string>()).string());
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(state_file + ": not the state.json datasets writes (" + e.what() + ")", "");
    }
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("data-", 0) == 0 && entry.path().extension() == ".arrow") files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) throw ConfigError(folder + ": the datasets folder lists no data files", "");
  return files;
}

std::vector<std::string> table_files(const std::string& path) {
  std::vector<std::string> files;
  auto add = [&](const std::string& p) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      const auto folder = datasets_folder_files(p);
      files.insert(files.end(), folder.begin(), folder.end());
    } else {
      files.push_back(p);
    }
  };
  if (!is_glob(path) || fs::exists(path)) {
    add(path);
    return files;
  }
  glob_t matches{};
  const int rc = ::glob(path.c_str(), 0, nullptr, &matches);  // sorted, as the shell sorts them
  const std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + (rc == 0 ? matches.gl_pathc : 0));
  ::globfree(&matches);
  if (paths.empty()) throw ConfigError(path + ": the pattern matches no file", "");
  for (const auto& p : paths) add(p);
  return files;
}

TableFormat table_format_of(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".parquet") return TableFormat::parquet;
  if (ext == ".arrow") return TableFormat::arrow;
  return TableFormat::other;
}

}  // namespace tessera
