// reward/length_target: 1 at `target` completion tokens, linearly down to 0 at none or twice as many.
#include <algorithm>
#include <cmath>
#include "tessera/components/reward.hpp"
#include "tessera/plugin.hpp"

namespace {

struct LengthTargetConfig {
  std::int64_t target = 64;
  static void declare(tessera::ConfigFields<LengthTargetConfig>& f) {
    f.field("target", &LengthTargetConfig::target, "the completion length (tokens) that scores 1").at_least(1);
  }
};

class LengthTarget final : public tessera::Reward {
 public:
  explicit LengthTarget(std::int64_t target) : target_(static_cast<double>(target)) {}
  std::vector<std::optional<double>> score(const std::vector<tessera::RewardInput>& batch) override {
    std::vector<std::optional<double>> scores;
    for (const auto& input : batch) {
      const double off = std::abs(static_cast<double>(input.completion_ids.size()) - target_) / target_;
      scores.emplace_back(std::max(0.0, 1.0 - off));
    }
    return scores;
  }
 private:
  double target_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Reward, LengthTargetConfig>(
      "length_target", "1 at `target` completion tokens, linearly down to 0 at none or twice as many",
      [](const LengthTargetConfig& c) { return std::make_shared<LengthTarget>(c.target); });
}

}  // namespace

TESSERA_PLUGIN("reward_length_target", "0.1.0", register_components)
