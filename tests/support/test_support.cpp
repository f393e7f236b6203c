#include "test_support.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "tessera/core/config/config_file.hpp"

namespace fs = std::filesystem;

namespace tessera::testing {
namespace {

// Several ranks as threads of one test process share c10d's FlightRecorder singleton, whose
// recordWithResetEnabled (torch 2.11, FlightRecorderDetail.hpp) inserts into its map of process
// group status before it takes its mutex: two ranks starting collectives at once race on that
// map (a SEGV in ProcessGroupGloo::reduce_scatter about one run in fifteen under ASan). A real
// run has one process group per process and never races there; the test processes turn the
// recorder off before any group exists (an explicit TORCH_FR_BUFFER_SIZE still wins).
const bool flight_recorder_off = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0) == 0; }();

}  // namespace

namespace {
// The build and source folders the tests were built in, unless the environment names where they
// are now (tools/device/gpu.sh runs the unit tests of a bundle built on another machine).
std::string folder(const char* variable, const char* built_in) {
  const char* moved = std::getenv(variable);
  return moved != nullptr && *moved != '\0' ? moved : built_in;
}
std::string build_dir() { return folder("TESSERA_TEST_BUILD_DIR", TESSERA_TEST_BINARY_DIR); }
}  // namespace

std::string plugin_dir() { return build_dir() + "/plugins"; }
std::string test_plugin_dir(const std::string& name) { return build_dir() + "/test-plugins/" + name; }
std::string tessera_binary() { return build_dir() + "/bin/tessera"; }
std::string source_dir() { return folder("TESSERA_TEST_SOURCE_DIR", TESSERA_TEST_SOURCE_DIR); }

core::PluginHost& bundled_plugins() {
  // Leaked on purpose: loaded once, alive until the test process ends (no static teardown).
  static core::PluginHost* host = [] {
    auto* h = new core::PluginHost;
    h->load_directories({plugin_dir()});
    return h;
  }();
  return *host;
}

core::BuiltComponents build_components(const std::string& yaml, const RunContext& context) {
  core::ConfigNode node = core::parse_config_string(yaml, "test.yaml");
  return core::ComponentFactory(bundled_plugins().registry(), context).build(node);
}

std::string validation_error(const std::string& yaml) {
  try {
    core::ConfigNode node = core::parse_config_string(yaml, "test.yaml");
    core::ComponentFactory(bundled_plugins().registry(), RunContext{}).validate(node);
  } catch (const core::ConfigIssue& e) {
    return e.what();
  }
  return "";
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = fs::temp_directory_path() / ("tessera-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  fs::create_directories(path_);
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}
std::string TempDir::write(const std::string& name, const std::string& text) const {
  const fs::path p = path_ / name;
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

void write_token_file(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace tessera::testing
