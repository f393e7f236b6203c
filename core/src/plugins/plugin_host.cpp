#include "tessera/core/plugins/plugin_host.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>

#include "tessera/core/plugins/plugin_build_record.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"
#include "tessera/version.hpp"

namespace fs = std::filesystem;

namespace tessera::core {

PluginHost::PluginHost() : registry_(std::make_unique<Registry>()) {}

PluginHost::~PluginHost() {
  // Factories are code inside the plugins: drop them while the libraries are still loaded.
  // Objects built from them hold their own reference to their library (see ComponentFactory).
  registry_.reset();
  plugins_.clear();
}

bool is_plugin_file_name(const std::string& name) {
  return name.rfind("libtessera_", 0) == 0 && name.size() > 3 &&
         name.compare(name.size() - 3, 3, ".so") == 0;
}

void PluginHost::load_file(const std::string& path) {
  // Judged from the file before it is loaded: a plugin built against another SDK, LibTorch,
  // compiler or C++ library must not run any code here, static initialisers included.
  std::optional<std::string> record;
  try {
    record = read_build_record_section(path);
  } catch (const std::exception& e) {
    throw PluginLoadError("cannot load plugin " + path + ": " + e.what());
  }
  if (!record) {
    throw PluginLoadError("plugin " + path + " has no Tessera build record (section " + kBuildRecordSection +
                          "): it was built against an SDK older than ABI version " + std::to_string(kSdkAbiVersion) +
                          " or without TESSERA_PLUGIN; rebuild it against this SDK");
  }
  const BuildRecord built_with = parse_build_record(*record);
  if (std::string mismatch = build_record_mismatch(built_with, host_build_record()); !mismatch.empty()) {
    throw PluginLoadError("plugin " + path + " " + mismatch);
  }

  auto library = std::make_shared<boost::dll::shared_library>();
  try {
    library->load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw PluginLoadError("cannot load plugin " + path + ": " + e.what());
  }
  if (!library->has(kPluginEntrySymbol)) {
    throw PluginLoadError("cannot load plugin " + path + ": it does not export the entry symbol " +
                          kPluginEntrySymbol + " (define it with TESSERA_PLUGIN(...))");
  }
  const PluginInfo* info = library->get<PluginEntryFn>(kPluginEntrySymbol)();
  if (!info) throw PluginLoadError("plugin " + path + ": its entry function returned null");
  if (info->abi_version != kSdkAbiVersion) {  // a hand-written entry that disagrees with its record
    throw PluginLoadError("plugin " + path + "'s entry says SDK ABI version " + std::to_string(info->abi_version) +
                          ", its build record " + built_with.sdk_abi + "; rebuild it with TESSERA_PLUGIN");
  }
  LoadedPlugin plugin{path, info->name ? info->name : "", info->version ? info->version : "",
                      library};
  // Every registered factory keeps the library alive as long as it exists.
  std::shared_ptr<const void> keep_alive = library;
  Registrar registrar(*registry_, path, keep_alive);
  try {
    info->register_components(registrar);
  } catch (const tessera::Error& e) {
    throw PluginLoadError(e.what());
  } catch (const std::exception& e) {
    throw PluginLoadError("plugin " + path + " failed while registering its components: " + e.what());
  }
  log::debug("loaded plugin ", plugin.name, " ", plugin.version, " from ", path);
  plugins_.push_back(std::move(plugin));
}

void PluginHost::load_directories(const std::vector<std::string>& directories) {
  std::set<std::string> seen_names;
  std::set<std::string> seen_dirs;
  for (const auto& dir : directories) {
    std::error_code ec;
    const std::string canonical = fs::weakly_canonical(dir, ec).string();
    if (!seen_dirs.insert(canonical).second) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.is_regular_file() && is_plugin_file_name(entry.path().filename().string())) {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      if (!seen_names.insert(file.filename().string()).second) {
        log::debug("skipping ", file.string(), ": a plugin of that name was found earlier");
        continue;
      }
      load_file(file.string());
    }
  }
}

std::string bundled_plugin_directory() {
  boost::dll::fs::error_code ec;
  const fs::path exe = boost::dll::program_location(ec).string();
  if (ec) return {};
  const fs::path bin = exe.parent_path();
  for (const fs::path& candidate : {bin.parent_path() / "plugins",
                                    bin.parent_path() / "lib" / "tessera" / "plugins"}) {
    if (fs::is_directory(candidate)) return candidate.string();
  }
  return {};
}

std::vector<std::string> plugin_search_path(const std::vector<std::string>& from_spec,
                                            const std::vector<std::string>& from_cli) {
  std::vector<std::string> out;
  for (const auto& list : {from_spec, from_cli}) {
    for (const auto& dir : list) {
      if (!fs::is_directory(dir)) {
        throw PluginLoadError("plugin path " + dir + " does not exist or is not a directory");
      }
      out.push_back(dir);
    }
  }
  if (const char* env = std::getenv("TESSERA_PLUGIN_PATH")) {
    std::string all = env;
    size_t start = 0;
    while (start <= all.size()) {
      size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      std::string dir = all.substr(start, end - start);
      if (!dir.empty()) {
        if (fs::is_directory(dir)) {
          out.push_back(dir);
        } else {
          log::warn("TESSERA_PLUGIN_PATH entry ", dir, " is not a directory; ignored");
        }
      }
      start = end + 1;
    }
  }
  if (std::string bundled = bundled_plugin_directory(); !bundled.empty()) out.push_back(bundled);
  return out;
}

}  // namespace tessera::core
