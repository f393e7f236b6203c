// reward/regex built through the real loader: re.search and re.fullmatch semantics on format
// rewards as TRL's examples write them, text that is not UTF-8, and a pattern that does not compile.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "tessera/components/reward.hpp"
#include "test_support.hpp"

namespace tessera {
namespace regex_test {

std::vector<std::optional<double>> scores(const std::string& config, const std::vector<std::string>& completions) {
  auto built = testing::build_components("r: {component_key: reward, variant_key: regex, config: " + config + "}\n");
  std::vector<RewardInput> batch;
  for (const auto& c : completions) {
    RewardInput input;
    input.completion = c;
    batch.push_back(input);
  }
  return testing::built<Reward>(built, "r")->score(batch);
}

TEST(RegexReward, SearchFindsTheMatchAnywhereAndFullmatchNeedsAllOfIt) {
  const std::vector<std::string> completions = {"foo <answer>1</answer> bar", "<answer>1</answer>", "<answer>1"};
  EXPECT_EQ(scores("{pattern: '<answer>.*</answer>'}", completions),
            (std::vector<std::optional<double>>{1.0, 1.0, 0.0}));
  EXPECT_EQ(scores("{pattern: '<answer>.*</answer>', mode: fullmatch}", completions),
            (std::vector<std::optional<double>>{0.0, 1.0, 0.0}));
  // TRL's format reward: reasoning, then the answer, nothing else.
  EXPECT_EQ(scores("{pattern: '<think>[\\s\\S]*?</think>\\s*<answer>[\\s\\S]*?</answer>', mode: fullmatch}",
                   {"<think>a\nb</think>\n<answer>3</answer>", "<think>a</think><answer>3</answer> extra", "é"}),
            (std::vector<std::optional<double>>{1.0, 0.0, 0.0}));
}

TEST(RegexReward, ClassesAreUnicodeAsPythonsRe) {
  // re.search(r'^\w+$', 'héllo') and re.search(r'\d', '٣') (an Arabic-Indic three) both match.
  EXPECT_EQ(scores("{pattern: '^\\w+$'}", {"h\xC3\xA9llo"}), (std::vector<std::optional<double>>{1.0}));
  EXPECT_EQ(scores("{pattern: '\\d'}", {"\xD9\xA3"}), (std::vector<std::optional<double>>{1.0}));
}

TEST(RegexReward, TextThatIsNotUtf8MatchesNothing) {
  EXPECT_EQ(scores("{pattern: '.'}", {"\xff\xfe", "ok"}), (std::vector<std::optional<double>>{0.0, 1.0}));
}

TEST(RegexReward, APatternThatDoesNotCompileIsAConfigIssue) {
  try {
    testing::build_components("r: {component_key: reward, variant_key: regex, config: {pattern: '(unclosed'}}\n");
    FAIL() << "a pattern that does not compile was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a regular expression"), std::string::npos) << e.what();
  }
}

}  // namespace regex_test
}  // namespace tessera
