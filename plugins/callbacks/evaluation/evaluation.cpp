// Callback `evaluation`: validation loss and perplexity on an evaluation dataset every N steps
// and at the end of training. Every rank evaluates its shard of the same fixed batches (the
// dataset is rewound before each evaluation, so every evaluation sees the same tokens); the
// summed loss and token counts are reduced across ranks, and the result is announced to every
// callback (sinks log it; see on_evaluation_end).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/components/evaluate.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/components/model.hpp"
#include "tessera/plugin.hpp"

namespace {

struct EvaluationConfig {
  std::shared_ptr<tessera::Dataset> data;
  std::shared_ptr<tessera::Loss> loss;
  std::string name = "val";
  std::int64_t every = 100;
  std::int64_t batches = 10;
  std::int64_t micro_batch_size = 8;
  bool at_end = true;

  static void declare(tessera::ConfigFields<EvaluationConfig>& f) {
    using C = EvaluationConfig;
    f.field("data", &C::data, "the evaluation data (e.g. tokens from a held-out file)");
    f.field("loss", &C::loss, "the loss to evaluate, usually the training loss by reference");
    f.field("name", &C::name, "what the results are called in the sinks (val/loss, val/perplexity)");
    f.field("every", &C::every, "evaluate every N optimizer steps (0: only at the end)").at_least(0);
    f.field("batches", &C::batches, "micro-batches per rank per evaluation (the same ones every time)").at_least(1);
    f.field("micro_batch_size", &C::micro_batch_size, "sequences per evaluation micro-batch").at_least(1);
    f.field("at_end", &C::at_end, "also evaluate after the last step");
  }
};

class Evaluation final : public tessera::Callback {
 public:
  explicit Evaluation(const EvaluationConfig& config)
      : config_(config) {}

  void on_train_begin(tessera::CallbackContext& ctx) override {
    const auto data_parallel = tessera::data_parallel_group(ctx.run);
    config_.data->set_shard(data_parallel->rank(), data_parallel->world_size());
    start_ = config_.data->state_dict();  // rewound to here before every evaluation
    // A resumed run's last step was evaluated (or not) by the attempt that reached it.
    last_step_ = ctx.progress.step > 0 ? ctx.progress.step : -1;
  }

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (config_.every > 0 && m.step % config_.every == 0) evaluate(ctx);
  }

  void on_train_end(tessera::CallbackContext& ctx) override {
    if (config_.at_end && ctx.progress.step > 0 && last_step_ != ctx.progress.step) evaluate(ctx);
  }

 private:
  void evaluate(tessera::CallbackContext& ctx) {
    const auto start = std::chrono::steady_clock::now();
    config_.data->load_state_dict(start_);
    tessera::EvalTotals totals;
    double loss = 0;
    try {
      totals = tessera::evaluate_loss(ctx.model, *config_.loss, *config_.data, config_.batches,
                                      config_.micro_batch_size, ctx.run, ctx.reference_logits);
      loss = totals.mean_loss();  // throws when the batches hold no target tokens
    } catch (const tessera::Error& e) {
      throw tessera::Error("callback/evaluation '" + config_.name + "': " + e.what());
    }
    tessera::EvalMetrics metrics;
    metrics.step = ctx.progress.step;
    metrics.name = config_.name;
    metrics.values["loss"] = loss;
    metrics.values["perplexity"] = std::exp(loss);
    metrics.values["tokens"] = totals.input_tokens;
    // The loss's own (loss/dpo: rewards/chosen, rewards/accuracies, logps/chosen, ...), which the
    // sinks write under this evaluation's name, as TRL writes eval_rewards/chosen.
    for (const auto& [key, value] : totals.metrics) metrics.values[key] = value;
    metrics.values["time_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    last_step_ = ctx.progress.step;
    ctx.announce_evaluation(metrics);
  }

  const EvaluationConfig config_;
  tessera::StateDict start_;
  std::int64_t last_step_ = -1;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, EvaluationConfig>(
      "evaluation", "validation loss and perplexity on an evaluation dataset every N steps",
      [](const EvaluationConfig& c) { return std::make_shared<Evaluation>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_evaluation", "0.1.0", register_components)
