// reward/regex: 1 where a completion's text matches `pattern` (PCRE2 over UTF-8 with Unicode
// classes: \d, \w, \s and \b as Python 3's `re` reads them in a str), else 0. `mode: search` finds it anywhere (re.search), `fullmatch`
// needs the whole completion to match (re.fullmatch): a format reward ("<think>...</think>
// <answer>...</answer>").
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/components/reward.hpp"
#include "tessera/plugin.hpp"

namespace {

struct RegexConfig {
  std::string pattern;
  std::string mode = "search";

  static void declare(tessera::ConfigFields<RegexConfig>& f) {
    using C = RegexConfig;
    f.field("pattern", &C::pattern, "the regular expression (PCRE2 syntax, UTF-8)").required();
    f.field("mode", &C::mode, "search: a match anywhere; fullmatch: the whole completion").one_of({"search", "fullmatch"});
    f.check([](const C& c) {
      int error = 0;
      PCRE2_SIZE offset = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(c.pattern.data()), c.pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                       &error, &offset, nullptr);
      if (code) {
        pcre2_code_free(code);
        return;
      }
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw tessera::ConfigError("is not a regular expression: " + std::string(reinterpret_cast<char*>(message)) +
                                     " at offset " + std::to_string(offset),
                                 "pattern");
    });
  }
};

class RegexReward final : public tessera::Reward {
 public:
  explicit RegexReward(const RegexConfig& config) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // fullmatch: anchored at the start and required to end at the end, as re.fullmatch.
    const std::uint32_t options = PCRE2_UTF | PCRE2_UCP | (config.mode == "fullmatch" ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0);
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(config.pattern.data()), config.pattern.size(), options,
                              &error, &offset, nullptr));
    if (!code_) throw tessera::Error("reward/regex: the pattern does not compile");
    match_.reset(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  }

  std::vector<std::optional<double>> score(const std::vector<tessera::RewardInput>& batch) override {
    std::vector<std::optional<double>> scores;
    for (const auto& input : batch) {
      // Text that is not valid UTF-8 (a byte-level model's) matches nothing.
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(input.completion.data()),
                                 input.completion.size(), 0, 0, match_.get(), nullptr);
      scores.emplace_back(rc >= 0 ? 1.0 : 0.0);
    }
    return scores;
  }

 private:
  struct FreeCode {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  struct FreeMatch {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  std::unique_ptr<pcre2_code, FreeCode> code_;
  std::unique_ptr<pcre2_match_data, FreeMatch> match_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Reward, RegexConfig>(
      "regex", "1 where the completion matches `pattern` (search: anywhere; fullmatch: all of it), else 0",
      [](const RegexConfig& c) { return std::make_shared<RegexReward>(c); });
}

}  // namespace

TESSERA_PLUGIN("reward_regex", "0.1.0", register_components)
