// The step of a loss that trains on the model's own completions (Loss::rollouts; loss/grpo). In
// place of drawing batches: the prompts of the step, num_generations completions of each sampled
// with the generation engine under the whole weights (one phase), the rewards, the advantages over
// every data-parallel rank's completions, and micro-batches of prompt + completion rows whose labels
// are the completion's tokens. A rollout is trained on for num_iterations steps; from the second
// on, its rows' log-probabilities at the rollout are the importance weights' denominators (TRL).
// Rank 0 appends each completion to RUN_DIR/rollouts.jsonl.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "step_inputs.hpp"
#include "tessera/components/prompt_source.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/generation/generate.hpp"
#include "tessera/generation/group_advantages.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/run/precision.hpp"
#include "tessera/text/utf8.hpp"

namespace tessera::core {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Every rank's string, in rank order (a collective of `group`; bytes travel on `device`).
std::vector<std::string> all_gather_strings(Communicator& group, const std::string& mine, const c10::Device& device) {
  at::Tensor bytes = at::empty({static_cast<std::int64_t>(mine.size())}, at::kByte);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<std::uint8_t>());
  std::vector<std::string> out;
  for (const at::Tensor& rank : collectives::all_gather_uneven(bytes, group, device)) {
    out.emplace_back(reinterpret_cast<const char*>(rank.data_ptr<std::uint8_t>()), static_cast<std::size_t>(rank.numel()));
  }
  return out;
}

double nan_mean(const std::vector<double>& v) {
  double sum = 0;
  std::size_t n = 0;
  for (double x : v) {
    if (!std::isnan(x)) sum += x, ++n;
  }
  return n ? sum / static_cast<double>(n) : std::nan("");
}

// Bessel-corrected, NaNs left out (torch.nanstd's meaning, as TRL logs a reward's std).
double nan_std(const std::vector<double>& v) {
  const double mean = nan_mean(v);
  double sum = 0;
  std::size_t n = 0;
  for (double x : v) {
    if (!std::isnan(x)) sum += (x - mean) * (x - mean), ++n;
  }
  return n > 1 ? std::sqrt(sum / static_cast<double>(n - 1)) : std::nan("");
}

}  // namespace

void Trainer::set_eos_token_ids(std::vector<std::int64_t> ids) { eos_token_ids_ = std::move(ids); }

// Checked at construction: what a rollout step needs of the run.
void Trainer::check_rollout_setup() {
  const RolloutSettings& r = *rollout_settings_;
  prompts_ = parts_.train_data->prompts();
  if (!prompts_) {
    throw Error("trainer: " + parts_.names.loss + " samples completions of prompts, but " + parts_.names.train_data +
                " gives token sequences; use a prompt dataset (dataset/prompt_jsonl) as train_data");
  }
  const std::int64_t completions = settings_.micro_batch_size * settings_.grad_accum;
  if (completions % r.num_generations != 0) {
    throw Error("trainer: a step's completions on each rank (micro_batch_size " + std::to_string(settings_.micro_batch_size) +
                " x grad_accum " + std::to_string(settings_.grad_accum) + " = " + std::to_string(completions) +
                ") must be whole groups of " + parts_.names.loss + "'s num_generations " +
                std::to_string(r.num_generations) + "; make micro_batch_size x grad_accum a multiple of it");
  }
  const ParallelDims& dims = mesh_->dims();
  if (dims.pp > 1 || dims.cp > 1) {
    throw Error("trainer: " + parts_.names.loss + " generates with the whole model, which a pipeline (pp) or context "
                "parallelism (cp) splits; use dp, fsdp or tp");
  }
  if (graph_) throw Error("trainer.cuda_graph: a rollout step generates between steps; set trainer.cuda_graph: false");
}

// The step's micro-batches: a new rollout every num_iterations steps, else the last one again.
Trainer::StepInputs Trainer::fetch_rollout() {
  const RolloutSettings& r = *rollout_settings_;
  rollout_metrics_.clear();
  if (!rollout_ || progress_.step % r.num_iterations == 0) rollout_ = sample_rollout();
  StepInputs in;
  in.micro_batches = rollout_->micro_batches;
  rollout_row_ = 0;
  for (const Batch& batch : in.micro_batches) in.count(batch);
  sum_over_ranks(in);
  return in;
}

// Before a micro-batch's loss: its rows of the rollout.
void Trainer::hand_rollout_rows() {
  if (!rollout_settings_) return;
  const RolloutRows& rows = rollout_->rows.at(rollout_row_++);
  in_component(parts_.names.loss, "take_rollout", progress_.step + 1, [&] { parts_.loss->take_rollout(rows); });
}

std::unique_ptr<Trainer::Rollout> Trainer::sample_rollout() {
  const RolloutSettings& r = *rollout_settings_;
  const std::int64_t step = progress_.step + 1;
  const std::int64_t G = r.num_generations;
  const std::int64_t per_rank = settings_.micro_batch_size * settings_.grad_accum;
  Communicator& dp = mesh_->data_parallel();
  const std::vector<Prompt> prompts =
      in_component(parts_.names.train_data, "next_prompts", step, [&] { return prompts_->next_prompts(per_rank / G); });
  for (const Prompt& prompt : prompts) {
    for (const std::int64_t id : prompt.ids) {
      if (id < 0 || id >= vocab_size_) {
        throw Error(parts_.names.train_data + ": prompt " + std::to_string(prompt.index) + " holds token id " +
                    std::to_string(id) + ", outside " + parts_.names.model + "'s vocabulary of " +
                    std::to_string(vocab_size_) + "; the dataset's tokenizer must be the model's");
      }
    }
  }

  // G requests per prompt, each drawn with its own seed: of the run, the rollout and the
  // completion's place among every rank's, so tensor-parallel peers draw alike and a resumed run
  // draws what it would have.
  const auto rollout_index = static_cast<std::uint64_t>(progress_.step / r.num_iterations);
  std::vector<GenerationRequest> requests;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    for (std::int64_t g = 0; g < G; ++g) {
      GenerationRequest request;
      request.prompt_ids = prompts[p].ids;
      request.sampling.temperature = r.temperature;
      request.sampling.top_k = r.top_k;
      request.sampling.top_p = r.top_p;
      request.sampling.min_p = r.min_p;
      const auto global = static_cast<std::uint64_t>(dp.rank() * per_rank + static_cast<std::int64_t>(p) * G + g);
      request.sampling.seed = splitmix64(context_.seed ^ splitmix64(rollout_index * 0x100000001B3ULL + global));
      request.max_new_tokens = r.max_completion_length;
      requests.push_back(std::move(request));
    }
  }
  // As `tessera generate`: the model folder's EOS ids, else the tokenizer's.
  const std::vector<std::int64_t> eos_ids = eos_token_ids_.empty() ? prompts_->eos_token_ids() : eos_token_ids_;
  GenerationOptions options;
  options.eos_token_ids = eos_ids;
  options.batch_size = per_rank;
  options.device = device_;
  std::vector<GenerationResult> results;
  in_component(parts_.names.model, "generate", step, [&] {
    strategy_.with_whole_parameters(*parts_.model, [&] {
      AutocastGuard autocast(device_, compute_dtype_);
      results = generate(*parts_.model, requests, options);
    });
  });
  parts_.model->train();

  // Rewards: one column per reward function, NaN where it gave none.
  const std::set<std::int64_t> eos(eos_ids.begin(), eos_ids.end());
  std::vector<RewardInput> inputs;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& result = results[i];
    std::vector<std::int64_t> text_ids = result.completion_ids;
    if (result.finish_reason == "stop" && !text_ids.empty() && eos.count(text_ids.back())) text_ids.pop_back();
    const Prompt& prompt = prompts[i / static_cast<std::size_t>(G)];
    // As text: a byte-level tokenizer's bytes may be no UTF-8 (Python's errors="replace").
    inputs.push_back({prompt.text, text::replace_invalid_utf8(prompts_->decode(text_ids)), result.completion_ids, prompt.row});
  }
  const auto K = static_cast<std::int64_t>(r.rewards.size());
  // This rank's completions as a table: a column per reward (NaN where it gave none), then each
  // one's length and whether it was cut; gathered from every rank for the advantages (the
  // batch's standard deviation) and the metrics, the same on every rank.
  const at::Tensor table = at::full({per_rank, K + 2}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
  auto cells = table.accessor<float, 2>();
  for (std::int64_t k = 0; k < K; ++k) {
    const NamedReward& reward = r.rewards[static_cast<std::size_t>(k)];
    const auto given = in_component("reward " + reward.name, "score", step, [&] { return reward.reward->score(inputs); });
    if (given.size() != inputs.size()) {
      throw Error("reward " + reward.name + " gave " + std::to_string(given.size()) + " scores for " +
                  std::to_string(inputs.size()) + " completions");
    }
    for (std::size_t i = 0; i < given.size(); ++i) {
      if (given[i]) cells[static_cast<std::int64_t>(i)][k] = static_cast<float>(*given[i]);
    }
  }
  for (std::int64_t i = 0; i < per_rank; ++i) {
    const GenerationResult& result = results[static_cast<std::size_t>(i)];
    cells[i][K] = static_cast<float>(result.completion_ids.size());
    cells[i][K + 1] = result.finish_reason == "length" ? 1.0f : 0.0f;
  }
  const at::Tensor mine = table.to(device_);
  std::vector<at::Tensor> every;
  for (std::int64_t i = 0; i < dp.world_size(); ++i) every.push_back(at::empty_like(mine));
  dp.all_gather_async(every, mine)->wait();
  const at::Tensor all = at::cat(every).to(at::kCPU);
  std::vector<double> weights;
  for (const NamedReward& reward : r.rewards) weights.push_back(reward.weight);
  const GroupAdvantages advantages = group_advantages(all.slice(1, 0, K).contiguous(), weights, G, r.scale_rewards);
  const at::Tensor my_advantages = advantages.advantages.slice(0, dp.rank() * per_rank, (dp.rank() + 1) * per_rank);
  record_rollout_metrics(all, advantages, K);

  auto rollout = std::make_unique<Rollout>();
  for (std::int64_t begin = 0; begin < per_rank; begin += settings_.micro_batch_size) {
    const std::int64_t rows = settings_.micro_batch_size;
    std::int64_t width = 0;
    for (std::int64_t i = begin; i < begin + rows; ++i) {
      const auto& prompt = prompts[static_cast<std::size_t>(i / G)].ids;
      width = std::max<std::int64_t>(width, static_cast<std::int64_t>(prompt.size() + results[static_cast<std::size_t>(i)].completion_ids.size()));
    }
    Batch batch;
    batch.input_ids = at::zeros({rows, width}, at::kLong);
    batch.labels = at::full({rows, width}, kIgnoreIndex, at::kLong);
    auto ids = batch.input_ids.accessor<std::int64_t, 2>();
    auto labels = batch.labels.accessor<std::int64_t, 2>();
    std::int64_t targets = 0;
    for (std::int64_t row = 0; row < rows; ++row) {
      const auto i = static_cast<std::size_t>(begin + row);
      const auto& prompt = prompts[i / static_cast<std::size_t>(G)].ids;
      const GenerationResult& result = results[i];
      const auto P = static_cast<std::int64_t>(prompt.size());
      for (std::int64_t t = 0; t < P; ++t) ids[row][t] = prompt[static_cast<std::size_t>(t)];
      const bool masked = r.mask_truncated_completions && result.finish_reason == "length";
      for (std::size_t t = 0; t < result.completion_ids.size(); ++t) {
        const std::int64_t at = P + static_cast<std::int64_t>(t);
        ids[row][at] = result.completion_ids[t];
        if (!masked) labels[row][at - 1] = result.completion_ids[t], ++targets;
      }
    }
    batch.num_target_tokens = r.units == "sequences" ? rows : r.units == "micro_batches" ? 1 : std::max<std::int64_t>(targets, 1);
    RolloutRows row_data;
    row_data.advantages = my_advantages.slice(0, begin, begin + rows).clone();
    rollout->micro_batches.push_back(std::move(batch));
    rollout->rows.push_back(std::move(row_data));
  }
  if (r.num_iterations > 1) take_old_logps(*rollout);
  write_rollouts(step, prompts, results, inputs, table, advantages, my_advantages);
  return rollout;
}

// num_iterations > 1: each row's log-probabilities under the weights that sampled it.
void Trainer::take_old_logps(Rollout& rollout) {
  c10::NoGradGuard no_grad;
  const double temperature = rollout_settings_->temperature;
  for (std::size_t i = 0; i < rollout.micro_batches.size(); ++i) {
    const Batch& batch = rollout.micro_batches[i];
    AutocastGuard autocast(device_, compute_dtype_);
    const at::Tensor input_ids = batch.input_ids.to(device_), labels = batch.labels.to(device_);
    const at::Tensor logits = in_component(parts_.names.model, "forward", progress_.step + 1,
                                           [&] { return parts_.model->forward(input_ids, at::Tensor()); });
    rollout.rows[i].old_logps = completion_logps(logits, labels, temperature);
  }
}

// TRL's rollout metrics over every rank's completions. `all`: [N, K + 2] scores, length, cut.
void Trainer::record_rollout_metrics(const at::Tensor& all, const GroupAdvantages& advantages, std::int64_t K) {
  const RolloutSettings& r = *rollout_settings_;
  const std::int64_t N = all.size(0), G = r.num_generations;
  auto column = [&](const at::Tensor& t) {
    const at::Tensor c = t.to(at::kDouble).contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  const std::vector<double> rewards = column(advantages.rewards);
  rollout_metrics_["reward"] = nan_mean(rewards);
  std::vector<double> group_stds;
  for (std::int64_t g = 0; g < N / G; ++g) {
    group_stds.push_back(nan_std(std::vector<double>(rewards.begin() + g * G, rewards.begin() + (g + 1) * G)));
  }
  rollout_metrics_["reward_std"] = r.scale_rewards == "batch" ? nan_std(rewards) : nan_mean(group_stds);
  rollout_metrics_["frac_reward_zero_std"] = advantages.zero_std.to(at::kDouble).mean().item<double>();
  for (std::int64_t k = 0; k < K; ++k) {
    const std::vector<double> scores = column(all.select(1, k));
    const std::string& name = r.rewards[static_cast<std::size_t>(k)].name;
    rollout_metrics_["rewards/" + name + "/mean"] = nan_mean(scores);
    rollout_metrics_["rewards/" + name + "/std"] = nan_std(scores);
  }
  const std::vector<double> lengths = column(all.select(1, K)), cut = column(all.select(1, K + 1));
  std::vector<double> terminated;
  for (std::int64_t i = 0; i < N; ++i) {
    if (cut[static_cast<std::size_t>(i)] == 0) terminated.push_back(lengths[static_cast<std::size_t>(i)]);
  }
  rollout_metrics_["completions/mean_length"] = nan_mean(lengths);
  rollout_metrics_["completions/min_length"] = *std::min_element(lengths.begin(), lengths.end());
  rollout_metrics_["completions/max_length"] = *std::max_element(lengths.begin(), lengths.end());
  rollout_metrics_["completions/clipped_ratio"] = nan_mean(cut);
  rollout_metrics_["completions/mean_terminated_length"] = terminated.empty() ? 0.0 : nan_mean(terminated);
}

// One line per completion in RUN_DIR/rollouts.jsonl, written by rank 0 for every data-parallel
// rank's (tensor-parallel peers hold the same lines; rank 0's group stands for them).
void Trainer::write_rollouts(std::int64_t step, const std::vector<Prompt>& prompts,
                             const std::vector<GenerationResult>& results, const std::vector<RewardInput>& inputs,
                             const at::Tensor& table, const GroupAdvantages& advantages, const at::Tensor& mine) {
  const RolloutSettings& r = *rollout_settings_;
  Communicator& dp = mesh_->data_parallel();
  const std::int64_t per_rank = settings_.micro_batch_size * settings_.grad_accum;
  const auto cells = table.accessor<float, 2>();
  const auto weighted = advantages.rewards.accessor<float, 1>();
  const at::Tensor mine_contiguous = mine.contiguous();
  const auto advantage = mine_contiguous.accessor<float, 1>();
  std::string lines;
  for (std::size_t i = 0; i < results.size(); ++i) {
    nlohmann::json rewards = nlohmann::json::object();
    for (std::size_t k = 0; k < r.rewards.size(); ++k) {
      const float v = cells[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(k)];
      rewards[r.rewards[k].name] = std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
    }
    const float reward = weighted[dp.rank() * per_rank + static_cast<std::int64_t>(i)];
    const Prompt& prompt = prompts[i / static_cast<std::size_t>(r.num_generations)];
    const nlohmann::json line{{"step", step},
                              {"prompt_index", prompt.index},
                              {"prompt_ids", prompt.ids},
                              {"completion_ids", results[i].completion_ids},
                              {"completion", inputs[i].completion},
                              {"rewards", rewards},
                              {"reward", std::isnan(reward) ? nlohmann::json(nullptr) : nlohmann::json(reward)},
                              {"advantage", advantage[static_cast<std::int64_t>(i)]}};
    lines += line.dump() + "\n";
  }
  const std::vector<std::string> every = all_gather_strings(dp, lines, device_);
  if (context_.rank != 0) return;
  const std::filesystem::path path = in_run_dir(context_, "rollouts.jsonl");
  // A fresh run starts the file; a resumed one appends to what load_rollout kept.
  std::ofstream out(path, rollouts_started_ ? std::ios::app : std::ios::trunc);
  rollouts_started_ = true;
  for (const std::string& part : every) out << part;
  if (!out) throw Error("could not append to " + path.string());
}

}  // namespace tessera::core
