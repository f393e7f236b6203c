// reward/math_answer built through the real loader and factory, scored against a table of cases:
// GSM8K's "#### N" as verl's strict judge takes it (the last one, in the last 300 characters),
// \boxed{} as verl's math judge extracts it, the last number as its flexible one; answers compared
// as numbers; none for a row without an answer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tessera/components/reward.hpp"
#include "test_support.hpp"

namespace tessera {
namespace math_answer_test {

struct Case {
  std::string completion;
  nlohmann::json answer;  // null: the row has no answer field
  std::optional<double> expected;
};

std::vector<std::optional<double>> scores(const std::string& format, const std::vector<Case>& cases) {
  auto built = testing::build_components("r: {component_key: reward, variant_key: math_answer, config: {format: " +
                                         format + "}}\n");
  std::vector<RewardInput> batch;
  for (const auto& c : cases) {
    RewardInput input;
    input.prompt = "What is it?";
    input.completion = c.completion;
    if (!c.answer.is_null()) input.row["answer"] = c.answer;
    input.row["id"] = batch.size();
    batch.push_back(input);
  }
  return testing::built<Reward>(built, "r")->score(batch);
}

void expect_table(const std::string& format, const std::vector<Case>& cases) {
  const auto got = scores(format, cases);
  ASSERT_EQ(got.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i], cases[i].expected) << format << " case " << i << ": " << cases[i].completion << " vs "
                                         << cases[i].answer.dump();
  }
}

TEST(MathAnswer, Gsm8kTakesTheLastHashAnswerAsVerlsStrictJudge) {
  const std::string long_tail(400, 'x');
  expect_table("gsm8k", {
      {"She sold 48 + 24 = 72.\n#### 72", "72", 1.0},
      {"#### 1,000", 1000, 1.0},                  // commas dropped; a number answer
      {"#### 72.0", "72", 1.0},                   // as numbers (verl compares strings)
      {"#### 71", "72", 0.0},
      {"The answer is 72", "72", 0.0},            // no "#### "
      {"####72", "72", 0.0},                      // the space is part of the format
      {"#### 5 and then #### 7", "7", 1.0},       // the last one
      {"#### -3", "-3", 1.0},
      {"#### 72" + long_tail, "72", 0.0},         // only the last 300 characters are read
      // The row's answer a whole GSM8K solution: its own "#### N" is the reference.
      {"#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", 1.0},
      {"#### 72", nullptr, std::nullopt},         // no answer: the reward does not apply
  });
}

TEST(MathAnswer, BoxedTakesTheLastBalancedBoxAsVerlsMathJudge) {
  expect_table("boxed", {
      {"so the answer is $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", 1.0},  // nested braces
      {"\\boxed{3} first, then \\boxed{4}", "4", 1.0},
      {"\\boxed{3} first, then \\boxed{4}", "3", 0.0},
      {"$\\boxed 5$", 5, 1.0},                                              // "\boxed X" up to the $
      {"\\fbox{12}", "12", 0.0},                                            // verl's remove_boxed fails
      {"\\boxed{12", "12", 0.0},                                            // never closed
      {"\\boxed{42.0}", "The area is $6 \\cdot 7 = \\boxed{42}$.", 1.0},    // a MATH solution's box
      {"\\boxed{x + 1}", " x + 1 ", 1.0},                                   // text, trimmed
      {"no box 42", "42", 0.0},
  });
}

TEST(MathAnswer, LastNumberTakesTheFinalNumberAsVerlsFlexibleJudge) {
  expect_table("last_number", {
      {"I think 12, no 13.", 13, 1.0},
      {"I think 12, no 13.", 12, 0.0},
      {"no numbers here", 3, 0.0},
      {"it is -7", -7, 1.0},
      {"about 1,234,567 people", "1234567", 1.0},
      {"it was 1/2", "1/2", 0.0},               // the reference is the answer itself, not its last number
      {"21 then " + std::string(300, 'x'), 21, 0.0},  // only the last 300 characters are read
  });
}

TEST(MathAnswer, AnUnknownFormatIsAConfigIssue) {
  EXPECT_THROW(testing::build_components("r: {component_key: reward, variant_key: math_answer, config: {format: latex}}\n"),
               ConfigError);
}

}  // namespace math_answer_test
}  // namespace tessera
