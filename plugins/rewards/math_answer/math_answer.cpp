// reward/math_answer: 1 where a completion's final answer equals its row's, else 0; none for a
// row without an answer. The final answer is read as verl's judges read it (answer_extraction.hpp):
// `format: gsm8k` the last "#### N", `boxed` the last \boxed{...}, `last_number` the last number.
// The row's answer may be the bare answer or a whole solution in that format (GSM8K's `answer`
// column, MATH's `solution`): its final answer is taken the same way.
#include <optional>
#include <string>
#include <vector>

#include "answer_extraction.hpp"
#include "tessera/components/reward.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace ma = tessera_plugins::math_answer;

struct MathAnswerConfig {
  std::string format = "gsm8k";
  std::string answer_field = "answer";

  static void declare(tessera::ConfigFields<MathAnswerConfig>& f) {
    using C = MathAnswerConfig;
    f.field("format", &C::format, "where the final answer is: gsm8k (the last '#### N'), boxed (the last "
                                  "\\boxed{...}) or last_number")
        .one_of({"gsm8k", "boxed", "last_number"});
    f.field("answer_field", &C::answer_field, "the row's field holding the reference answer (or a solution ending in it)");
    f.check([](const C& c) {
      if (c.answer_field.empty()) throw tessera::ConfigError("answer_field must not be empty", "answer_field");
    });
  }
};

class MathAnswer final : public tessera::Reward {
 public:
  explicit MathAnswer(MathAnswerConfig config) : config_(std::move(config)) {}

  std::vector<std::optional<double>> score(const std::vector<tessera::RewardInput>& batch) override {
    std::vector<std::optional<double>> scores;
    for (const auto& input : batch) {
      const auto it = input.row.find(config_.answer_field);
      if (it == input.row.end() || it->is_null()) {
        scores.emplace_back(std::nullopt);
        continue;
      }
      const std::string reference = it->is_string() ? reference_answer(it->get<std::string>()) : it->dump();
      const std::optional<std::string> answer = final_answer(input.completion);
      scores.emplace_back(answer && ma::same_answer(*answer, reference) ? 1.0 : 0.0);
    }
    return scores;
  }

 private:
  // A whole solution ("... #### 72", "... \\boxed{72}") gives its final answer; anything else is
  // the answer itself ("1/2" stays "1/2", not its last number).
  std::string reference_answer(const std::string& answer) const {
    const bool solution = (config_.format == "gsm8k" && answer.find("#### ") != std::string::npos) ||
                          (config_.format == "boxed" && answer.find("\\boxed") != std::string::npos);
    return solution ? final_answer(answer).value_or(answer) : answer;
  }

  std::optional<std::string> final_answer(const std::string& text) const {
    if (config_.format == "gsm8k") return ma::gsm8k_answer(text);
    if (config_.format == "boxed") return ma::boxed_answer(text);
    return ma::last_number(text);
  }

  MathAnswerConfig config_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Reward, MathAnswerConfig>(
      "math_answer", "1 where the completion's final answer (gsm8k '#### N', \\boxed{}, or the last number) equals the "
                     "row's answer, compared as numbers; none without one",
      [](const MathAnswerConfig& c) { return std::make_shared<MathAnswer>(c); });
}

}  // namespace

TESSERA_PLUGIN("reward_math_answer", "0.1.0", register_components)
