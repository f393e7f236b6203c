// Shared helpers for tests: the real plugins from the build tree, components built from YAML
// text through the real factory, and temporary directories that clean up after themselves.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "tessera/run/context.hpp"
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/plugins/plugin_host.hpp"

namespace tessera::testing {

// build/plugins, where every bundled plugin is built.
std::string plugin_dir();
// build/test-plugins/NAME: deliberately broken plugins for loader tests.
std::string test_plugin_dir(const std::string& name);
// build/bin/tessera
std::string tessera_binary();
// The source tree's root (for configs/).
std::string source_dir();

// A PluginHost with every bundled plugin loaded (loaded once per test process).
core::PluginHost& bundled_plugins();

// Parses `yaml` (the body of a `components:` section) and builds it with the bundled plugins.
core::BuiltComponents build_components(const std::string& yaml, const RunContext& context = {});
// Same, but only validates; returns the ConfigIssue text or "" when valid.
std::string validation_error(const std::string& yaml);

template <class T>
std::shared_ptr<T> built(const core::BuiltComponents& b, const std::string& name) {
  return std::static_pointer_cast<T>(b.instances.at(name).object);
}

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `text` to NAME under the directory and returns its path.
  std::string write(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

// Writes `tokens` as a uint16 token file.
void write_token_file(const std::string& path, const std::vector<std::uint16_t>& tokens);

// Runs a shell command; returns its exit code and puts stdout+stderr in `output`.
int run_command(const std::string& command, std::string& output);

}  // namespace tessera::testing
