// Includes, --set overrides and ${...} interpolation, and the positions errors carry.
#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/config/config_interpolation.hpp"
#include "tessera/core/config/config_override.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "test_support.hpp"

namespace tessera::core {
namespace config_tree_test {

using testing::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigIssue& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTree, KeepsPositionsOfValues) {
  ConfigNode root = parse_config_string("a:\n  b: 3\n  c: [1, 2]\n", "x.yaml");
  const ConfigNode* b = root.find("a")->find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->scalar(), "3");
  EXPECT_EQ(b->pos().to_string(), "x.yaml:2:6");
  EXPECT_EQ(root.find("a")->find_entry("c")->key_pos.to_string(), "x.yaml:3:3");
}

TEST(ConfigTree, QuotedScalarsAreNotPlain) {
  ConfigNode root = parse_config_string("a: \"12\"\nb: 12\n", "x.yaml");
  EXPECT_FALSE(root.find("a")->plain());
  EXPECT_TRUE(root.find("b")->plain());
}

TEST(ConfigTree, InvalidYamlNamesFileLineAndColumn) {
  TempDir dir;
  const std::string path = dir.write("bad.yaml", "a: 1\nb: [1, 2\n");
  const std::string error = error_of([&] { load_config_file(path); });
  EXPECT_NE(error.find(path + ":"), std::string::npos) << error;
  EXPECT_NE(error.find("invalid YAML"), std::string::npos) << error;
}

TEST(ConfigTree, ASecondYamlDocumentIsAnErrorNotDropped) {
  const std::string error = error_of([] { parse_config_string("name: x\n---\ncheckpoint: {every_steps: 100}\n", "two.yaml"); });
  EXPECT_NE(error.find("two.yaml:3:1"), std::string::npos) << error;
  EXPECT_NE(error.find("a run spec is one YAML document; this text holds 2"), std::string::npos) << error;
  EXPECT_NO_THROW(parse_config_string("---\nname: x\n", "one.yaml")) << "one document after --- is fine";
}

// yaml-cpp 0.7's LoadAll never returned on these (its memory growing): a ',' where a value should
// begin left the parser emitting empty documents without moving on. The last is a --set value
// that libFuzzer found so.
TEST(ConfigTree, AStrayCommaIsAnErrorWhereItStands) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {",", "c.yaml:1:1"}, {"- 1\n,\n", "c.yaml:2:1"}, {"---\n, b: c}\n", "c.yaml:2:1"}, {"  ,", "c.yaml:1:3"}};
  for (const auto& [text, where] : cases) {
    // A name of its own: C++17 lambdas cannot capture a structured binding (GCC allows it, clang not).
    const std::string& spec = text;
    const std::string error = error_of([&] { parse_config_string(spec, "c.yaml"); });
    EXPECT_NE(error.find(where + ": invalid YAML: ',' cannot begin a value here"), std::string::npos)
        << text << " -> " << error;
  }
  ConfigNode root = parse_config_string("trainer: {max_steps: 3}\n", "c.yaml");
  const std::string error = error_of([&] { apply_override(root, "trainer.max_steps=, beta\"${trainer.max_steps}\""); });
  EXPECT_NE(error.find("invalid YAML: ',' cannot begin a value here"), std::string::npos) << error;
  EXPECT_NE(error.find("--set"), std::string::npos) << error;
  EXPECT_EQ(root.find("trainer")->find("max_steps")->scalar(), "3") << "a refused --set changes nothing";
}

TEST(ConfigTree, IncludingAFolderIsAnError) {
  TempDir dir;
  dir.write("shared/base.yaml", "name: base\n");
  const std::string top = dir.write("top.yaml", "include: shared\n");
  const std::string error = error_of([&] { load_config_file(top); });
  EXPECT_NE(error.find("top.yaml:1:10"), std::string::npos) << error;
  EXPECT_NE(error.find("it is a folder"), std::string::npos) << error;
}

TEST(ConfigTree, DuplicateKeysAreErrors) {
  const std::string error = error_of([] { parse_config_string("a: 1\na: 2\n", "d.yaml"); });
  EXPECT_NE(error.find("d.yaml:2:1"), std::string::npos) << error;
  EXPECT_NE(error.find("duplicate key 'a'"), std::string::npos) << error;
}

TEST(ConfigTree, IncludesMergeWithTheIncludingFileWinning) {
  TempDir dir;
  dir.write("base.yaml", "trainer: {max_steps: 10, micro_batch_size: 4}\nname: base\n");
  dir.write("sub/mid.yaml", "include: ../base.yaml\ntrainer: {grad_accum: 2}\n");
  const std::string top = dir.write("sub/top.yaml", "include: [mid.yaml]\ntrainer: {max_steps: 20}\n");
  ConfigNode root = load_config_file(top);
  const ConfigNode* trainer = root.find("trainer");
  EXPECT_EQ(trainer->find("max_steps")->scalar(), "20");
  EXPECT_EQ(trainer->find("micro_batch_size")->scalar(), "4");
  EXPECT_EQ(trainer->find("grad_accum")->scalar(), "2");
  EXPECT_EQ(root.find("name")->scalar(), "base");
  EXPECT_EQ(root.find("include"), nullptr);
  // A value keeps the position of the file it came from.
  EXPECT_NE(trainer->find("micro_batch_size")->pos().file.find("base.yaml"), std::string::npos);
}

TEST(ConfigTree, IncludeCyclesAndMissingFilesAreErrors) {
  TempDir dir;
  dir.write("a.yaml", "include: b.yaml\n");
  dir.write("b.yaml", "include: a.yaml\n");
  EXPECT_NE(error_of([&] { load_config_file(dir.file("a.yaml")); }).find("include cycle"), std::string::npos);
  dir.write("c.yaml", "include: nope.yaml\n");
  const std::string error = error_of([&] { load_config_file(dir.file("c.yaml")); });
  EXPECT_NE(error.find("c.yaml:1:10"), std::string::npos) << error;
  EXPECT_NE(error.find("nope.yaml"), std::string::npos) << error;
}

TEST(ConfigTree, OverridesAreYamlTypedAndCreatePaths) {
  ConfigNode root = parse_config_string("trainer: {max_steps: 10}\nlist: [1, 2]\n", "x.yaml");
  apply_override(root, "trainer.max_steps=50");
  apply_override(root, "trainer.new.deep=[1, 2, 3]");
  apply_override(root, "list.1=7");
  apply_override(root, "name='quoted'");
  // An index also as messages write paths, a[0]: `components.adapters[0].config.rank`.
  apply_override(root, "trainer.new.deep[2]=9");
  apply_override(root, "list[0]=5");
  EXPECT_EQ(root.find("trainer")->find("max_steps")->scalar(), "50");
  EXPECT_EQ(root.find("trainer")->find("new")->find("deep")->items().size(), 3u);
  EXPECT_EQ(root.find("trainer")->find("new")->find("deep")->items()[2].scalar(), "9");
  EXPECT_EQ(root.find("list")->items()[0].scalar(), "5");
  EXPECT_EQ(root.find("list")->items()[1].scalar(), "7");
  EXPECT_FALSE(root.find("list[0]")) << "an index, not a new key";
  EXPECT_FALSE(root.find("name")->plain());
}

TEST(ConfigTree, BadOverridesAreErrors) {
  ConfigNode root = parse_config_string("a: 1\nlist: [1]\n", "x.yaml");
  EXPECT_NE(error_of([&] { apply_override(root, "novalue"); }).find("expected KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(root, "a.b=1"); }).find("cannot set a key inside a scalar"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(root, "list.5=1"); }).find("past the end"), std::string::npos);
  // An index of more digits than any size: past the end too, not an overflow.
  EXPECT_NE(error_of([&] { apply_override(root, "list.99999999999999999999=1"); }).find("past the end"),
            std::string::npos);
  ConfigNode huge = parse_config_string("list: [1]\na: ${list.99999999999999999999}\n", "h.yaml");
  EXPECT_NE(error_of([&] { resolve_interpolations(huge); }).find("h.yaml:2:4: a: ${list.99999999999999999999}: list has no element"),
            std::string::npos);
}

TEST(ConfigTree, InterpolatesPathsAndEnvironment) {
  ::setenv("TESSERA_TEST_DATA", "/data", 1);
  ConfigNode root = parse_config_string(
      "name: run1\n"
      "trainer: {max_steps: 300}\n"
      "settings: {run_dir: 'runs/${name}', data: '${env:TESSERA_TEST_DATA}/x.bin'}\n"
      "sched: {total: '${trainer.max_steps}', chain: '${sched.total}'}\n"
      "sizes: [8, 16]\n"
      "widths: {first: '${sizes.0}', second: '${sizes[1]}'}\n",
      "i.yaml");
  resolve_interpolations(root);
  EXPECT_EQ(root.find("widths")->find("first")->scalar(), "8");
  EXPECT_EQ(root.find("widths")->find("second")->scalar(), "16");
  EXPECT_EQ(root.find("settings")->find("run_dir")->scalar(), "runs/run1");
  EXPECT_EQ(root.find("settings")->find("data")->scalar(), "/data/x.bin");
  // A whole-value interpolation keeps the referenced node's type (a plain integer here).
  EXPECT_EQ(root.find("sched")->find("total")->scalar(), "300");
  EXPECT_TRUE(root.find("sched")->find("total")->plain());
  EXPECT_EQ(root.find("sched")->find("chain")->scalar(), "300");
}

// A whole value of one ${env:...} reads as if written unquoted: quoted (as flow style needs) it
// is still a number for a number field. Inside a longer string it stays text.
TEST(ConfigTree, AWholeEnvironmentValueIsPlain) {
  ::setenv("TESSERA_TEST_SEED", "42", 1);
  ConfigNode root = parse_config_string("settings: {seed: '${env:TESSERA_TEST_SEED}', name: 'run${env:TESSERA_TEST_SEED}'}\n", "p.yaml");
  resolve_interpolations(root);
  EXPECT_EQ(root.find("settings")->find("seed")->scalar(), "42");
  EXPECT_TRUE(root.find("settings")->find("seed")->plain());
  EXPECT_FALSE(root.find("settings")->find("name")->plain());
}

// A reference through a value that is itself one ${...} resolves whatever the order of keys.
TEST(ConfigTree, AReferenceThroughAnotherReferenceDoesNotDependOnKeyOrder) {
  for (const std::string text : {"a: ${c.x}\nc: ${d}\nd: {x: 1}\n", "c: ${d}\nd: {x: 1}\na: ${c.x}\n"}) {
    ConfigNode root = parse_config_string(text, "o.yaml");
    resolve_interpolations(root);
    EXPECT_EQ(root.find("a")->scalar(), "1") << text;
  }
  ConfigNode cycle = parse_config_string("a: ${c.x}\nc: ${c.x}\n", "c.yaml");
  EXPECT_NE(error_of([&] { resolve_interpolations(cycle); }).find("interpolation cycle"), std::string::npos);
}

TEST(ConfigTree, InterpolationErrorsNameThePlace) {
  ::unsetenv("TESSERA_TEST_UNSET");
  ConfigNode env = parse_config_string("a: ${env:TESSERA_TEST_UNSET}\n", "e.yaml");
  std::string error = error_of([&] { resolve_interpolations(env); });
  EXPECT_NE(error.find("e.yaml:1:4: a: environment variable TESSERA_TEST_UNSET is not set"), std::string::npos)
      << error;
  ConfigNode missing = parse_config_string("trainer: {max_steps: 1}\na: ${trainer.max_step}\n", "m.yaml");
  error = error_of([&] { resolve_interpolations(missing); });
  EXPECT_NE(error.find("did you mean 'max_steps'"), std::string::npos) << error;
  ConfigNode cycle = parse_config_string("a: ${b}\nb: ${a}\n", "c.yaml");
  EXPECT_NE(error_of([&] { resolve_interpolations(cycle); }).find("interpolation cycle"), std::string::npos);
}

TEST(ConfigTree, ResolvedTreeRoundTripsThroughYaml) {
  ConfigNode root = parse_config_string("a: {b: [1, 'two', null]}\nc: \"3\"\n", "r.yaml");
  ConfigNode again = parse_config_string(root.to_yaml(), "again.yaml");
  EXPECT_EQ(again.find("a")->find("b")->items()[1].scalar(), "two");
  EXPECT_TRUE(again.find("a")->find("b")->items()[2].is_null());
  EXPECT_FALSE(again.find("c")->plain());
}

}  // namespace config_tree_test
}  // namespace tessera::core
