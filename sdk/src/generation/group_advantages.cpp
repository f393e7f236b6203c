// GRPO's group advantages (tessera/generation/group_advantages.hpp), TRL's lines in ATen.
#include "tessera/generation/group_advantages.hpp"

#include <ATen/ops/isclose.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/nan_to_num.h>
#include <ATen/ops/nanmean.h>
#include <ATen/ops/nansum.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <limits>

#include "tessera/error.hpp"

namespace tessera {
namespace {

// trl.trainer.utils.nanstd: the NaN-ignoring standard deviation with Bessel's correction (NaN
// where fewer than two values count).
at::Tensor nanstd(const at::Tensor& x, std::optional<std::int64_t> dim) {
  const at::OptionalIntArrayRef dims = dim ? at::OptionalIntArrayRef(at::IntArrayRef(*dim)) : at::OptionalIntArrayRef();
  const at::Tensor mean = at::nanmean(x, dims, /*keepdim=*/true);
  const at::Tensor variance = at::nanmean((x - mean).pow(2), dims, /*keepdim=*/true);
  const at::Tensor count = at::isnan(x).logical_not().sum(dims, /*keepdim=*/true).to(x.scalar_type());
  const at::Tensor correction =
      at::where(count > 1, count / (count - 1), at::full_like(count, std::numeric_limits<float>::quiet_NaN()));
  at::Tensor std = at::sqrt(variance * correction);
  return dim ? std.squeeze(*dim) : std.reshape({});
}

}  // namespace

GroupAdvantages group_advantages(const at::Tensor& scores, const std::vector<double>& weights,
                                 std::int64_t num_generations, const std::string& scale_rewards) {
  if (scores.dim() != 2 || scores.size(1) != static_cast<std::int64_t>(weights.size())) {
    throw Error("group_advantages: scores must be [completions, reward functions] with one weight per function");
  }
  if (num_generations < 1 || scores.size(0) % num_generations != 0) {
    throw Error("group_advantages: " + std::to_string(scores.size(0)) + " completions do not make groups of " +
                std::to_string(num_generations));
  }
  if (scale_rewards != "group" && scale_rewards != "batch" && scale_rewards != "none") {
    throw Error("group_advantages: scale_rewards must be group, batch or none, got '" + scale_rewards + "'");
  }
  const at::Tensor s = scores.to(at::kFloat);
  const at::Tensor unscorable = at::isnan(s).all(1);
  const at::Tensor w = at::tensor(std::vector<float>(weights.begin(), weights.end()), s.options());
  at::Tensor rewards = at::nansum(s * w.unsqueeze(0), 1);
  rewards.masked_fill_(unscorable, std::numeric_limits<float>::quiet_NaN());
  const at::Tensor grouped = rewards.view({-1, num_generations});
  const at::Tensor mean = at::nanmean(grouped, 1).repeat_interleave(num_generations, 0);
  at::Tensor std;
  if (scale_rewards == "batch") {
    std = rewards.numel() > 1 ? nanstd(rewards, std::nullopt).expand_as(rewards) : at::zeros_like(rewards);
  } else {
    std = num_generations > 1 ? nanstd(grouped, 1).repeat_interleave(num_generations, 0) : at::zeros_like(rewards);
  }
  at::Tensor advantages = rewards - mean;
  if (scale_rewards != "none") advantages = advantages / (std + 1e-4);
  GroupAdvantages out;
  out.zero_std = at::isclose(std, at::zeros_like(std));
  out.advantages = at::nan_to_num(advantages, 0.0);
  out.rewards = rewards;
  return out;
}

}  // namespace tessera
