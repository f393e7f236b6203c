// Components that fail on purpose, for the tests of how a run meets a plugin's fault: each throws
// std::runtime_error("planted fault ...") at one point, on one rank (`rank`; -1: every rank).
//   callback/faulty  in the event `event` of step `at_step`
//   dataset/faulty   wraps a real dataset (`data`); its `fail_at_batch`-th next_batch throws
//   loss/faulty      wraps a real loss (`loss`); its `at_call`-th computation throws in forward,
//                    or in backward (a hook on the loss's gradient)
#include <stdexcept>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera::ConfigFields;

bool on_this_rank(std::int64_t wanted, std::int64_t rank) { return wanted < 0 || wanted == rank; }

[[noreturn]] void fail(const std::string& where, std::int64_t rank) {
  throw std::runtime_error("planted fault in " + where + " on rank " + std::to_string(rank));
}

struct FaultyCallbackConfig {
  std::string event = "on_step_end";
  std::int64_t at_step = 1;
  std::int64_t rank = -1;
  static void declare(ConfigFields<FaultyCallbackConfig>& f) {
    using C = FaultyCallbackConfig;
    f.field("event", &C::event, "the event that throws")
        .one_of({"on_train_begin", "on_step_begin", "on_micro_batch_end", "on_before_optimizer_step",
                 "on_collect_metrics", "on_step_end", "on_train_end"});
    f.field("at_step", &C::at_step, "the step (1-based) whose event throws").at_least(1);
    f.field("rank", &C::rank, "the rank that throws (-1: every rank)").at_least(-1);
  }
};

class FaultyCallback final : public tessera::Callback {
 public:
  explicit FaultyCallback(FaultyCallbackConfig c) : c_(std::move(c)) {}
  void on_train_begin(tessera::CallbackContext& ctx) override { maybe("on_train_begin", ctx, 1); }
  void on_step_begin(tessera::CallbackContext& ctx) override { maybe("on_step_begin", ctx, ctx.progress.step + 1); }
  void on_micro_batch_end(tessera::CallbackContext& ctx, const tessera::MicroBatchEnd&) override {
    maybe("on_micro_batch_end", ctx, ctx.progress.step + 1);
  }
  void on_before_optimizer_step(tessera::CallbackContext& ctx, const tessera::BeforeOptimizerStep&) override {
    maybe("on_before_optimizer_step", ctx, ctx.progress.step + 1);
  }
  void on_collect_metrics(tessera::CallbackContext& ctx, tessera::StepMetrics&) override {
    maybe("on_collect_metrics", ctx, ctx.progress.step);
  }
  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics&) override {
    maybe("on_step_end", ctx, ctx.progress.step);
  }
  void on_train_end(tessera::CallbackContext& ctx) override { maybe("on_train_end", ctx, c_.at_step); }

 private:
  void maybe(const char* event, const tessera::CallbackContext& ctx, std::int64_t step) const {
    if (c_.event == event && step == c_.at_step && on_this_rank(c_.rank, ctx.run.rank)) fail(event, ctx.run.rank);
  }
  FaultyCallbackConfig c_;
};

struct FaultyDatasetConfig {
  std::shared_ptr<tessera::Dataset> data;
  std::int64_t fail_at_batch = 1;
  std::int64_t rank = -1;
  static void declare(ConfigFields<FaultyDatasetConfig>& f) {
    using C = FaultyDatasetConfig;
    f.field("data", &C::data, "the real dataset whose batches this one passes on");
    f.field("fail_at_batch", &C::fail_at_batch, "the next_batch call (1-based) that throws").at_least(1);
    f.field("rank", &C::rank, "the rank that throws (-1: every rank)").at_least(-1);
  }
};

class FaultyDataset final : public tessera::Dataset {
 public:
  explicit FaultyDataset(FaultyDatasetConfig c) : c_(std::move(c)) {}
  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    rank_ = rank;
    c_.data->set_shard(rank, world_size);
  }
  tessera::Batch next_batch(std::int64_t batch_size) override {
    if (++calls_ == c_.fail_at_batch && on_this_rank(c_.rank, rank_)) fail("next_batch", rank_);
    return c_.data->next_batch(batch_size);
  }
  std::int64_t seq_len() const override { return c_.data->seq_len(); }
  std::int64_t num_samples() const override { return c_.data->num_samples(); }
  tessera::StateDict state_dict() const override { return c_.data->state_dict(); }
  void load_state_dict(const tessera::StateDict& state) override { c_.data->load_state_dict(state); }

 private:
  FaultyDatasetConfig c_;
  std::int64_t rank_ = 0, calls_ = 0;
};

struct FaultyLossConfig {
  std::shared_ptr<tessera::Loss> loss;
  std::string fail_in = "forward";
  std::int64_t at_call = 1;
  std::int64_t rank = -1;
  static void declare(ConfigFields<FaultyLossConfig>& f) {
    using C = FaultyLossConfig;
    f.field("loss", &C::loss, "the real loss this one computes");
    f.field("fail_in", &C::fail_in, "forward or backward").one_of({"forward", "backward"});
    f.field("at_call", &C::at_call, "the computation (1-based, one per micro-batch) that throws").at_least(1);
    f.field("rank", &C::rank, "the rank that throws (-1: every rank)").at_least(-1);
  }
};

class FaultyLoss final : public tessera::Loss {
 public:
  FaultyLoss(FaultyLossConfig c, std::int64_t rank) : c_(std::move(c)), rank_(rank) {}
  tessera::LossSum compute(const at::Tensor& logits, const at::Tensor& labels) override {
    const bool now = ++calls_ == c_.at_call && on_this_rank(c_.rank, rank_);
    if (now && c_.fail_in == "forward") fail("the loss's forward", rank_);
    tessera::LossSum out = c_.loss->compute(logits, labels);
    if (now) {
      const std::int64_t rank = rank_;
      out.sum.register_hook([rank](const at::Tensor&) -> at::Tensor { fail("the loss's backward", rank); });
    }
    return out;
  }

 private:
  FaultyLossConfig c_;
  std::int64_t rank_;
  std::int64_t calls_ = 0;
};

void register_components(tessera::Registrar& r) {
  r.add<tessera::Callback, FaultyCallbackConfig>("faulty", "throws in one event of one step (tests)",
                                                 [](const FaultyCallbackConfig& c) { return std::make_shared<FaultyCallback>(c); });
  r.add<tessera::Dataset, FaultyDatasetConfig>("faulty", "a dataset whose n-th batch throws (tests)",
                                               [](const FaultyDatasetConfig& c) { return std::make_shared<FaultyDataset>(c); });
  r.add<tessera::Loss, FaultyLossConfig>(
      "faulty", "a loss that throws in forward or backward (tests)",
      [](const FaultyLossConfig& c, const tessera::RunContext& run) { return std::make_shared<FaultyLoss>(c, run.rank); });
}

}  // namespace

TESSERA_PLUGIN("faulty", "0.0.1", register_components)
