// Reading a spec is bounded whatever the input: nested aliases that would expand into billions of
// values, deep nesting, huge files, long include chains and ${...} references that double at
// every level each stop with one positioned error, quickly and in little memory.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include "tessera/core/config/config_file.hpp"
#include "tessera/core/config/config_interpolation.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "test_support.hpp"

namespace tessera::core {
namespace config_limits_test {

std::string issue_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigIssue& e) {
    return e.what();
  }
  return "no issue";
}

// Ten aliases a level, nine levels: 10^9 values once expanded, 11 lines of YAML.
std::string billion_laughs() {
  std::string yaml = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i <= 9; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k) yaml += ", " + prev;
    yaml += "]\n";
  }
  return yaml;
}

TEST(ConfigLimits, NestedAliasesStopAtTheNodeBudgetQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const std::string issue = issue_of([] { parse_config_string(billion_laughs(), "laughs.yaml"); });
  EXPECT_NE(issue.find("laughs.yaml:"), std::string::npos) << issue;
  EXPECT_NE(issue.find("expands to more than 100000 values"), std::string::npos) << issue;
  // A hang guard, not a timing claim: without the budget this runs until memory is gone.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  // Aliases within the budget still work.
  const ConfigNode small = parse_config_string("base: &b {lr: 0.1}\nx: *b\n", "ok.yaml");
  EXPECT_EQ(small.find("x")->find("lr")->scalar(), "0.1");
}

// Few values, long ones: an alias of a 1 MiB scalar, 100 times (100 MiB once copied), and the
// same through ${...} references. Both stop at a byte budget; a long unknown key gets no
// did-you-mean (whose edit distance grows with the product of the lengths).
TEST(ConfigLimits, AliasesAndReferencesOfALongValueStopAtTheByteBudget) {
  const std::string long_value(1u << 20, 'x');
  std::string aliases = "a: &a " + long_value + "\nb: [*a";
  for (int i = 1; i < 100; ++i) aliases += ", *a";
  aliases += "]\n";
  const std::string issue = issue_of([&] { parse_config_string(aliases, "long.yaml"); });
  EXPECT_NE(issue.find("long.yaml:"), std::string::npos) << issue.substr(0, 200);
  EXPECT_NE(issue.find("expand to more than 67108864 bytes"), std::string::npos) << issue.substr(0, 200);

  std::string references = "a: " + long_value + "\nb: [";
  for (int i = 0; i < 100; ++i) references += std::string(i ? ", " : "") + "'${a}'";
  references += "]\n";
  ConfigNode root = parse_config_string(references, "refs.yaml");
  const std::string copied = issue_of([&] { resolve_interpolations(root); });
  EXPECT_NE(copied.find("copy more than 67108864 bytes"), std::string::npos) << copied.substr(0, 200);

  ConfigNode keys = parse_config_string("trainer: {max_steps: 1}\na: ${trainer." + std::string(100000, 'k') + "}\n", "k.yaml");
  const std::string missing = issue_of([&] { resolve_interpolations(keys); });
  EXPECT_NE(missing.find("no key"), std::string::npos) << missing.substr(0, 200);
  EXPECT_EQ(missing.find("did you mean"), std::string::npos);
}

TEST(ConfigLimits, DeepNestingAndHugeTextsAreRefused) {
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  EXPECT_NE(issue_of([&] { parse_config_string(deep, "deep.yaml"); }).find("deep.yaml:"), std::string::npos);
  const std::string nested_200 = "x: " + std::string(200, '[') + "1" + std::string(200, ']') + "\n";
  EXPECT_NE(issue_of([&] { parse_config_string(nested_200, "n.yaml"); }).find("nests deeper than 128"), std::string::npos);
  const std::string huge(config_limits::kMaxBytes + 1, ' ');
  EXPECT_NE(issue_of([&] { parse_config_string(huge, "huge.yaml"); }).find("more than the 16777216"), std::string::npos);
}

TEST(ConfigLimits, IncludeChainsAreBounded) {
  testing::TempDir dir;
  // 20 files, each including the next: deeper than 16.
  for (int i = 0; i < 20; ++i) {
    dir.write("f" + std::to_string(i) + ".yaml",
              "include: [f" + std::to_string(i + 1) + ".yaml]\nk" + std::to_string(i) + ": 1\n");
  }
  dir.write("f20.yaml", "last: 1\n");
  const std::string issue = issue_of([&] { load_config_file(dir.file("f0.yaml")); });
  EXPECT_NE(issue.find("includes nest deeper than 16"), std::string::npos) << issue;
}

TEST(ConfigLimits, InterpolationThatDoublesIsBounded) {
  // v0 = "xx...", v(i) = "${v(i-1)}${v(i-1)}": 2^40 bytes if expanded.
  std::string yaml = "v0: " + std::string(64, 'x') + "\n";
  for (int i = 1; i <= 40; ++i) yaml += "v" + std::to_string(i) + ": \"${v" + std::to_string(i - 1) + "}${v" + std::to_string(i - 1) + "}\"\n";
  ConfigNode root = parse_config_string(yaml, "double.yaml");
  const std::string issue = issue_of([&] { resolve_interpolations(root); });
  EXPECT_NE(issue.find("double.yaml:"), std::string::npos) << issue;
  EXPECT_NE(issue.find("bytes as ${...} are replaced"), std::string::npos) << issue;
  // Lists that copy each other: x(i) = [${x(i-1)}, ${x(i-1)}].
  std::string lists = "x0: [1, 2]\n";
  for (int i = 1; i <= 30; ++i) lists += "x" + std::to_string(i) + ": [\"${x" + std::to_string(i - 1) + "}\", \"${x" + std::to_string(i - 1) + "}\"]\n";
  ConfigNode copies = parse_config_string(lists, "lists.yaml");
  EXPECT_NE(issue_of([&] { resolve_interpolations(copies); }).find("copy more than"), std::string::npos);
}

}  // namespace config_limits_test
}  // namespace tessera::core
