// GRPO's advantages from the rewards of groups of completions, as TRL's GRPOTrainer computes them
// (multi_objective_aggregation "sum_then_normalize", in float32): a completion's reward is the
// weighted sum of its reward functions' scores, the none (NaN) ones left out; a completion that
// no reward applied to is unscorable (its reward NaN, its advantage 0). Its advantage is its
// reward less its group's mean (unscorable ones left out), divided by the Bessel-corrected
// standard deviation of its group ("group") or of the whole batch ("batch") plus 1e-4, or not
// divided ("none"). Groups are the rows [g * G, (g + 1) * G): a prompt's G completions in a row.
// TRL gathers the rewards of every rank first: pass the whole step's completions, so that the
// batch's standard deviation is the step's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

struct GroupAdvantages {
  at::Tensor rewards;     // [N] float32: the weighted sums (NaN: unscorable)
  at::Tensor advantages;  // [N] float32
  // [N] bool: the standard deviation each advantage was scaled by (its group's for "none") is
  // zero: TRL's frac_reward_zero_std is its mean.
  at::Tensor zero_std;
};

// `scores`: [N, K] float32, one column per reward function, NaN where it gave none; `weights`: K
// of them (reward_weights); N a multiple of `num_generations`. tessera::Error for a shape that
// does not fit, and a `scale_rewards` other than group, batch or none.
TESSERA_API GroupAdvantages group_advantages(const at::Tensor& scores, const std::vector<double>& weights,
                                             std::int64_t num_generations, const std::string& scale_rewards);

}  // namespace tessera
