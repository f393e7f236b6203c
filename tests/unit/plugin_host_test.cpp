// The plugin loader against real shared libraries, good and deliberately broken.
#include "tessera/core/plugins/plugin_host.hpp"

#include <gtest/gtest.h>

#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <functional>
#include <set>

#include "tessera/build_record.hpp"
#include "tessera/core/plugins/plugin_build_record.hpp"
#include "tessera/version.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace plugin_host_test {

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

// Loads test plugin `name` with $TESSERA_TEST_LOAD_MARKER set: the build_record test plugins
// create that file from a static initialiser, so its existence says whether their code ran.
struct LoadAttempt {
  std::string error;
  bool plugin_code_ran = false;
};
LoadAttempt load_marked(const std::string& name) {
  testing::TempDir dir;
  const std::string marker = dir.file("loaded");
  ::setenv("TESSERA_TEST_LOAD_MARKER", marker.c_str(), 1);
  LoadAttempt attempt{load_error({testing::test_plugin_dir(name)}), false};
  ::unsetenv("TESSERA_TEST_LOAD_MARKER");
  attempt.plugin_code_ran = std::filesystem::exists(marker);
  return attempt;
}

TEST(PluginHost, APluginWithTheHostsBuildRecordLoadsAndTheMarkerShowsItsCodeRan) {
  // The control for the refusals below: the same source with a matching record loads, and its
  // static initialiser leaves the marker.
  const LoadAttempt attempt = load_marked("build_record");
  EXPECT_EQ(attempt.error, "");
  EXPECT_TRUE(attempt.plugin_code_ran);
}

TEST(PluginHost, RefusesAnotherLibTorchInOneLineBeforeAnyOfItsCodeRuns) {
  const LoadAttempt attempt = load_marked("wrong_torch");
  EXPECT_NE(attempt.error.find("plugin " + plugin_file("wrong_torch")), std::string::npos) << attempt.error;
  EXPECT_NE(attempt.error.find("built against LibTorch 1.13.1"), std::string::npos) << attempt.error;
  EXPECT_NE(attempt.error.find(std::string("this host runs LibTorch ") + TORCH_VERSION), std::string::npos)
      << attempt.error;
  EXPECT_EQ(attempt.error.find('\n'), std::string::npos) << "one line: " << attempt.error;
  EXPECT_FALSE(attempt.plugin_code_ran) << "the plugin's static initialiser ran before the refusal";
}

TEST(PluginHost, RefusesAnotherCompilerNamingBoth) {
  const LoadAttempt attempt = load_marked("wrong_compiler");
  EXPECT_NE(attempt.error.find("built with clang 99.0.0, but this host with " + core::host_build_record().compiler),
            std::string::npos)
      << attempt.error;
  EXPECT_NE(attempt.error.find(plugin_file("wrong_compiler")), std::string::npos) << attempt.error;
  EXPECT_FALSE(attempt.plugin_code_ran);
}

TEST(PluginHost, RefusesAnotherStandardLibraryNamingBoth) {
  const LoadAttempt attempt = load_marked("wrong_stdlib");
  EXPECT_NE(attempt.error.find("the C++ library libc++, but this host uses " + core::host_build_record().stdlib),
            std::string::npos)
      << attempt.error;
  EXPECT_FALSE(attempt.plugin_code_ran);
}

TEST(PluginHost, AFileWithoutABuildRecordIsRefused) {
  const std::string error = load_error({testing::test_plugin_dir("no_record")});
  EXPECT_NE(error.find(plugin_file("no_record") + " has no Tessera build record"), std::string::npos) << error;
}

TEST(PluginHost, AFileThatIsNotELFIsRefusedWithoutLoading) {
  testing::TempDir dir;
  std::ofstream(dir.file("libtessera_text.so")) << "not a library\n";
  const std::string error = load_error({dir.path().string()});
  EXPECT_NE(error.find("libtessera_text.so: not an ELF shared library"), std::string::npos) << error;
}

TEST(BuildRecord, TheHostsRecordNamesThisBuild) {
  const core::BuildRecord& host = core::host_build_record();
  EXPECT_EQ(host.sdk_abi, std::to_string(kSdkAbiVersion));
  EXPECT_EQ(host.torch, TORCH_VERSION);
#if defined(__GNUC__) && !defined(__clang__)
  EXPECT_EQ(host.compiler.rfind("gcc " + std::to_string(__GNUC__) + ".", 0), 0u) << host.compiler;
#endif
  EXPECT_EQ(host.stdlib, "libstdc++ cxx11-abi");
  EXPECT_EQ(host.format, "tessera-build-record 1");
}

TEST(BuildRecord, MalformedFilesAreRefusedWithAnErrorNeverACrash) {
  std::ifstream in(testing::plugin_dir() + "/libtessera_scheduler_constant.so", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(good.size(), 4096u);
  testing::TempDir dir;
  const std::string path = dir.file("libtessera_mutated.so");
  auto outcome = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      const auto record = core::read_build_record_section(path);
      return std::string(record ? "record" : "none");
    } catch (const Error& e) {
      return std::string("error: ") + e.what();
    }
  };
  EXPECT_EQ(outcome(good), "record");
  EXPECT_EQ(outcome(good.substr(0, 40)), "error: not an ELF shared library") << "shorter than the ELF header";
  std::string far = good;
  const std::uint64_t huge = 0xFFFFFFFFFFFF0000ull;
  std::memcpy(&far[0x28], &huge, sizeof huge);  // e_shoff beyond the file
  EXPECT_EQ(outcome(far), "error: its ELF section headers are malformed");
  std::string many = good;
  const std::uint16_t sections = 0xFFFE;
  std::memcpy(&many[0x3C], &sections, sizeof sections);  // e_shnum beyond the file
  EXPECT_EQ(outcome(many), "error: its ELF section headers are malformed");
  EXPECT_EQ(outcome(good.substr(0, good.size() / 2)).rfind("error: ", 0), 0u) << "cut in half";
  // Random bytes in the header and the section headers: a record, none, or one error each.
  std::uint64_t shoff = 0;
  std::memcpy(&shoff, &good[0x28], sizeof shoff);
  std::uint32_t state = 12345;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    for (int k = 0; k < 4; ++k) {
      state = state * 1664525u + 1013904223u;
      const std::size_t at = k % 2 == 0 ? state % 64 : static_cast<std::size_t>(shoff + state % (good.size() - shoff));
      bytes[at] = static_cast<char>(state >> 24);
    }
    const std::string result = outcome(bytes);
    EXPECT_TRUE(result == "record" || result == "none" || result.rfind("error: ", 0) == 0) << result;
  }
}

TEST(BuildRecord, EveryBundledPluginCarriesTheHostsRecord) {
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::plugin_dir())) {
    if (!core::is_plugin_file_name(entry.path().filename().string())) continue;
    const auto record = core::read_build_record_section(entry.path().string());
    ASSERT_TRUE(record) << entry.path();
    EXPECT_EQ(*record, TESSERA_BUILD_RECORD) << entry.path();
    ++files;
  }
  EXPECT_GE(files, 20u);
}

TEST(BuildRecord, MinorReleasesOfOneCompilerMatch) {
  core::BuildRecord plugin = core::host_build_record(), host = core::host_build_record();
  plugin.compiler = "gcc 12.3.0";
  host.compiler = "gcc 12.2.0";
  EXPECT_EQ(core::build_record_mismatch(plugin, host), "");
  plugin.compiler = "gcc 13.1.0";
  EXPECT_NE(core::build_record_mismatch(plugin, host), "");
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

}  // namespace plugin_host_test
}  // namespace tessera::core
