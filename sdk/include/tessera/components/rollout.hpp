// What a loss that trains on the model's own completions (reinforcement learning: loss/grpo)
// tells the trainer, and what the trainer hands it back. Such a loss returns its RolloutSettings
// from Loss::rollouts(); the trainer then draws prompts (Dataset::prompts()) instead of batches,
// samples num_generations completions of each with the generation engine (the whole weights once
// per phase: ParallelStrategy::with_whole_parameters), scores them with the rewards, gives each
// its advantage within its group (tessera/generation/group_advantages.hpp, over the whole step's
// completions on every data-parallel rank), and trains on micro-batches of prompt + completion
// rows whose labels are the completion's tokens. Before each micro-batch's compute() the loss is
// given its rows' RolloutRows (Loss::take_rollout).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/components/reward.hpp"
#include "tessera/export.hpp"

namespace tessera {

struct NamedReward {
  std::string name;  // its metric: rewards/NAME/mean, and its key in rollouts.jsonl
  std::shared_ptr<Reward> reward;
  double weight = 1.0;
};

struct RolloutSettings {
  std::int64_t num_generations = 8;         // completions per prompt: a group
  std::int64_t max_completion_length = 256;  // new tokens at most
  // Sampling (tessera/generation/sampling.hpp's meanings; the trainer seeds each draw).
  double temperature = 1.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
  // Optimizer steps each rollout is trained on; from the second on, the log-probabilities taken at
  // the rollout (RolloutRows::old_logps) are the importance weights' denominators.
  std::int64_t num_iterations = 1;
  bool mask_truncated_completions = false;  // a completion that hit max_completion_length gets no loss
  std::string scale_rewards = "group";      // group, batch or none (group_advantages)
  std::vector<NamedReward> rewards;
  // What the step's summed loss is divided by, counted per micro-batch (Batch::num_target_tokens):
  // "tokens" (its completion tokens, at least 1), "sequences" (its rows) or "micro_batches" (1).
  std::string units = "tokens";
};

// A micro-batch's rows as the rollout left them, for the loss.
struct RolloutRows {
  at::Tensor advantages;  // [B] float32
  // [B, S] float32: each target's log-probability under the model that sampled it (logits divided
  // by the temperature, completion_logps); undefined when num_iterations is 1 (the policy's own
  // values, detached, are the denominators then, as in TRL).
  at::Tensor old_logps;
};

// The log-probability of each label under softmax(logits / temperature), float32 [B, S]; 0 where the
// label is kIgnoreIndex. As TRL computes a policy's per-token log-probabilities (temperature 0 is
// taken as 1: greedy sampling has no tempered distribution).
TESSERA_API at::Tensor completion_logps(const at::Tensor& logits, const at::Tensor& labels, double temperature);
// Its two halves, for a loss that reads the whole distribution too (an entropy) from one
// log-softmax: log_softmax(logits / temperature) in float32 [B, S, V], and the labels' entries of
// such log-probabilities (0 where the label is kIgnoreIndex).
TESSERA_API at::Tensor tempered_log_probs(const at::Tensor& logits, double temperature);
TESSERA_API at::Tensor label_logps(const at::Tensor& log_probs, const at::Tensor& labels);

}  // namespace tessera
