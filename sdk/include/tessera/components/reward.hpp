// Kind `reward`: scores completions for reinforcement learning with verifiable rewards
// (loss/grpo). A batched function of each completion and its prompt's dataset row: one float per
// completion, or none where the reward does not apply (a row without the field it reads), which
// the loss leaves out of that completion's weighted sum, as TRL does with a reward function's None.
// reward/math_answer and reward/regex provide it; examples/ holds one built out of tree.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

// One completion to score.
struct RewardInput {
  std::string prompt;                        // the prompt's text as the model read it (rendered)
  std::string completion;                    // the completion's text, without the EOS that ended it
  std::vector<std::int64_t> completion_ids;  // with that EOS
  // The prompt's dataset row: its fields besides the prompt (an `answer`, ...). An object.
  nlohmann::json row = nlohmann::json::object();
};

class TESSERA_API Reward {
 public:
  static constexpr const char* kKind = "reward";
  virtual ~Reward();
  // One score per input, in order; std::nullopt where this reward does not apply.
  virtual std::vector<std::optional<double>> score(const std::vector<RewardInput>& batch) = 0;
};

}  // namespace tessera
