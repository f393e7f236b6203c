// Loads plugin shared libraries with Boost.DLL and lets them register their components.
// Owns the registry and the libraries; destroying it clears the registry (whose factories are
// code inside the libraries) before the libraries are released.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/registry.hpp"

namespace boost::dll {
class shared_library;
}

namespace tessera::core {

// A plugin that cannot be loaded: wrong ABI, missing entry symbol, unresolved symbols, a
// duplicate, a failing register function. The message names the file and the reason.
class PluginLoadError : public tessera::Error {
 public:
  using tessera::Error::Error;
};

struct LoadedPlugin {
  std::string path;
  std::string name;
  std::string version;
  std::shared_ptr<boost::dll::shared_library> library;
};

class PluginHost {
 public:
  PluginHost();
  ~PluginHost();
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  void load_file(const std::string& path);
  // Loads every plugin file in each directory, in order. A file name seen in an earlier
  // directory shadows the same name later (so a user's build can override a bundled plugin).
  void load_directories(const std::vector<std::string>& directories);

  Registry& registry() { return *registry_; }
  const Registry& registry() const { return *registry_; }
  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }

 private:
  std::vector<LoadedPlugin> plugins_;
  // Declared after plugins_ so it is destroyed first.
  std::unique_ptr<Registry> registry_;
};

// True for names the host treats as plugins: libtessera_*.so.
bool is_plugin_file_name(const std::string& file_name);

// The search path in priority order: the spec's plugins.paths, --plugin-path, then
// $TESSERA_PLUGIN_PATH (colon-separated), then the plugins bundled next to the binary.
std::vector<std::string> plugin_search_path(const std::vector<std::string>& from_spec,
                                            const std::vector<std::string>& from_cli);

// The directory of plugins shipped with this binary (build/plugins or PREFIX/lib/tessera/plugins).
std::string bundled_plugin_directory();

}  // namespace tessera::core
