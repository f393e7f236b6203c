// What reinforcement learning samples completions for: a dataset's prompts, each with the row it
// came from. A dataset of prompts (dataset/prompt_jsonl) gives one from Dataset::prompts();
// loss/grpo's step takes its prompts there, generates, and hands each row to the rewards.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

struct Prompt {
  std::int64_t index = 0;         // the row's place in the dataset, in file order
  std::vector<std::int64_t> ids;  // as the model reads it: rendered, encoded, at most max_prompt_length
  std::string text;               // the same as text: what rewards are given as the prompt
  // The row's other fields (an answer, ...): what rewards read beside the completion. An object.
  nlohmann::json row = nlohmann::json::object();
};

class TESSERA_API PromptSource {
 public:
  virtual ~PromptSource();
  // The next `count` prompts of this rank's share (Dataset::set_shard), in the dataset's order (a
  // new seeded shuffle each epoch, or file order), epochs following each other. The position is
  // the dataset's state (Stateful): a resumed run goes on with the prompts it would have had.
  // Every rank asks for the same counts (the shares interleave over one global position).
  virtual std::vector<Prompt> next_prompts(std::int64_t count) = 0;
  // A completion's text as rewards read it: the ids decoded by the tokenizer the prompts were
  // encoded with.
  virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
  // The ids that end a completion, where the model's folder names none (its generation_config):
  // the tokenizer's EOS; empty when it has none.
  virtual std::vector<std::int64_t> eos_token_ids() const { return {}; }
};

}  // namespace tessera
