// The plugin loader against real shared libraries, good and deliberately broken.
#include "tessera/core/plugin_host.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "tessera/version.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace {

std::string load_error(const std::vector<std::string>& dirs) {
  PluginHost host;
  try {
    host.load_directories(dirs);
  } catch (const PluginLoadError& e) {
    return e.what();
  }
  return "";
}

std::string plugin_file(const std::string& name) {
  return testing::test_plugin_dir(name) + "/libtessera_" + name + ".so";
}

TEST(PluginHost, LoadsEveryBundledPluginFromItsOwnFile) {
  PluginHost host;
  host.load_directories({testing::plugin_dir()});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"model", "gpt"},          {"dataset", "tokens"},       {"loss", "cross_entropy"},
      {"optimizer", "adamw"},    {"optimizer", "sgd"},        {"scheduler", "constant"},
      {"scheduler", "warmup_cosine"}, {"scheduler", "linear"}, {"callback", "console_logger"},
      {"callback", "jsonl_metrics"}, {"callback", "sample_text"}, {"tokenizer", "bytes"}};
  std::set<std::string> files;
  for (const auto& [kind, variant] : expected) {
    const ComponentInfo* info = host.registry().find(kind, variant);
    ASSERT_NE(info, nullptr) << kind << "/" << variant;
    files.insert(info->origin);
  }
  EXPECT_EQ(files.size(), expected.size()) << "each component comes from its own .so";
  EXPECT_GE(host.plugins().size(), expected.size());
}

TEST(PluginHost, RefusesAnotherAbiVersionNamingBothAndTheFile) {
  const std::string error = load_error({testing::test_plugin_dir("wrong_abi")});
  EXPECT_NE(error.find(plugin_file("wrong_abi")), std::string::npos) << error;
  EXPECT_NE(error.find("ABI version 999"), std::string::npos) << error;
  EXPECT_NE(error.find("this host has ABI version " + std::to_string(kSdkAbiVersion)), std::string::npos) << error;
}

TEST(PluginHost, DuplicateRegistrationNamesBothFiles) {
  const std::string error = load_error({testing::plugin_dir(), testing::test_plugin_dir("duplicate")});
  EXPECT_NE(error.find("duplicate component scheduler/constant"), std::string::npos) << error;
  EXPECT_NE(error.find("libtessera_scheduler_constant.so"), std::string::npos) << error;
  EXPECT_NE(error.find(plugin_file("duplicate")), std::string::npos) << error;
}

TEST(PluginHost, MissingEntrySymbolIsNamed) {
  const std::string error = load_error({testing::test_plugin_dir("no_entry")});
  EXPECT_NE(error.find("does not export the entry symbol tessera_plugin_entry"), std::string::npos) << error;
  EXPECT_NE(error.find(plugin_file("no_entry")), std::string::npos) << error;
}

TEST(PluginHost, UnresolvedSymbolShowsTheLoaderMessage) {
  const std::string error = load_error({testing::test_plugin_dir("unresolved")});
  EXPECT_NE(error.find(plugin_file("unresolved")), std::string::npos) << error;
  EXPECT_NE(error.find("tessera_test_symbol_that_does_not_exist"), std::string::npos) << error;
}

TEST(PluginHost, ExceptionInRegisterFunctionIsReported) {
  const std::string error = load_error({testing::test_plugin_dir("throwing")});
  EXPECT_NE(error.find("failed while registering its components: cannot find my data"), std::string::npos) << error;
}

TEST(PluginHost, MissingPluginPathIsAnError) {
  try {
    plugin_search_path({}, {"/nonexistent/plugins"});
    FAIL();
  } catch (const PluginLoadError& e) {
    EXPECT_NE(std::string(e.what()).find("plugin path /nonexistent/plugins does not exist"), std::string::npos);
  }
}

TEST(PluginHost, EarlierDirectoryShadowsSameFileName) {
  // The same directory twice (as spec path and as bundled dir) loads each plugin once.
  PluginHost host;
  host.load_directories({testing::plugin_dir(), testing::plugin_dir() + "/."});
  EXPECT_NE(host.registry().find("model", "gpt"), nullptr);
}

TEST(PluginHost, SearchPathOrderIsSpecCliEnvBundled) {
  testing::TempDir a, b, c;
  ::setenv("TESSERA_PLUGIN_PATH", c.path().c_str(), 1);
  auto path = plugin_search_path({a.path().string()}, {b.path().string()});
  ::unsetenv("TESSERA_PLUGIN_PATH");
  ASSERT_GE(path.size(), 3u);
  EXPECT_EQ(path[0], a.path().string());
  EXPECT_EQ(path[1], b.path().string());
  EXPECT_EQ(path[2], c.path().string());
}

}  // namespace
}  // namespace tessera::core
