// The trainer's side of observability: the event API (order, micro-batches, collected metrics,
// announced evaluations, checkpoint saved/loaded), MFU against a hand computation, the peak
// FLOP/s table, the ETA, and the step's time and memory breakdown.
#include <gtest/gtest.h>

#include <filesystem>

#include "small_trainer.hpp"
#include "tessera/core/checkpoint/checkpoint_store.hpp"
#include "tessera/core/train/throughput.hpp"

namespace tessera::core {
namespace observability_test {

using testing::TempDir;

// Writes down every event it sees, tagged with its own name.
class EventRecorder final : public Callback {
 public:
  EventRecorder(std::string name, std::vector<std::string>& log) : name_(std::move(name)), log_(log) {}
  void on_train_begin(CallbackContext&) override { add("train_begin"); }
  void on_checkpoint_loaded(CallbackContext&, const CheckpointEvent& e) override {
    add("checkpoint_loaded " + std::to_string(e.step));
    loaded_path = e.path;
  }
  void on_step_begin(CallbackContext&) override { add("step_begin"); }
  void on_micro_batch_end(CallbackContext&, const MicroBatchEnd& mb) override {
    add("micro_batch_end " + std::to_string(mb.index) + "/" + std::to_string(mb.count));
    EXPECT_TRUE(mb.loss_sum.defined());
    EXPECT_GT(mb.target_tokens, 0);
  }
  void on_before_optimizer_step(CallbackContext&, const BeforeOptimizerStep& s) override {
    add("before_optimizer_step");
    loss_seen = s.loss.item<double>();
  }
  void on_collect_metrics(CallbackContext& ctx, StepMetrics& m) override {
    add("collect");
    m.extra[name_ + "/collected"] = 1;
    if (announce) ctx.announce_evaluation(EvalMetrics{m.step, "val", {{"loss", 1.5}}});
  }
  void on_step_end(CallbackContext&, const StepMetrics& m) override {
    add("step_end");
    extras_at_end = m.extra.size();
  }
  void on_evaluation_end(CallbackContext&, const EvalMetrics& e) override { add("evaluation_end " + e.name); }
  void on_checkpoint_saved(CallbackContext&, const CheckpointEvent& e) override {
    add("checkpoint_saved " + std::to_string(e.step));
    saved_paths.push_back(e.path);
  }
  void on_train_end(CallbackContext&) override { add("train_end"); }

  bool announce = false;
  double loss_seen = 0;
  std::size_t extras_at_end = 0;
  std::vector<std::string> saved_paths;
  std::string loaded_path;

 private:
  void add(const std::string& event) { log_.push_back(name_ + ": " + event); }
  std::string name_;
  std::vector<std::string>& log_;
};

TEST(Events, OneStepRunsEveryEventInOrderAndCollectsBeforeAnyStepEnd) {
  TempDir dir;
  std::vector<std::string> log;
  auto a = std::make_shared<EventRecorder>("a", log);
  auto b = std::make_shared<EventRecorder>("b", log);
  a->announce = true;
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)),
                                   testing::settings(2, 2, 1), {a, b});
  const TrainResult result = run.trainer->fit();
  EXPECT_EQ(result.steps, 1);
  const std::vector<std::string> expected{
      "a: train_begin", "b: train_begin",
      "a: step_begin", "b: step_begin",
      "a: micro_batch_end 0/2", "b: micro_batch_end 0/2",
      "a: micro_batch_end 1/2", "b: micro_batch_end 1/2",
      "a: before_optimizer_step", "b: before_optimizer_step",
      "a: collect", "a: evaluation_end val", "b: evaluation_end val", "b: collect",
      "a: step_end", "b: step_end",
      "a: train_end", "b: train_end"};
  EXPECT_EQ(log, expected);
  // Both callbacks' collected metrics reach both step ends, beside the trainer's model-state
  // bytes of step 1 (parameter_bytes, gradient_bytes, optimizer_bytes) and its parameter
  // counts (parameters, trainable_parameters).
  EXPECT_EQ(a->extras_at_end, 2u + 5u);
  EXPECT_EQ(b->extras_at_end, 2u + 5u);
  EXPECT_NEAR(a->loss_seen, result.last_loss, 1e-6);
}

TEST(Events, CheckpointsSavedAndLoadedAreAnnounced) {
  for (const bool async : {false, true}) {
    TempDir dir;
    const std::string data = testing::uneven_token_file(dir);
    CheckpointContext checkpoints;
    checkpoints.settings.every_steps = 2;
    checkpoints.settings.async = async;
    checkpoints.settings.export_at_end = false;
    checkpoints.store = CheckpointStore(dir.file("checkpoints"), dir.file("exports"));
    std::vector<std::string> log;
    auto first = std::make_shared<EventRecorder>("first", log);
    {
      auto run = testing::make_trainer(testing::components_yaml(data), testing::settings(1, 2, 4), {first});
      run.trainer->enable_checkpoints(checkpoints);
      run.trainer->fit();
    }
    ASSERT_EQ(first->saved_paths.size(), 2u) << "async " << async;
    for (const auto& path : first->saved_paths) EXPECT_TRUE(std::filesystem::is_directory(path)) << path;
    EXPECT_EQ(std::filesystem::path(first->saved_paths.back()).filename(), "step_00000004");

    auto second = std::make_shared<EventRecorder>("second", log);
    log.clear();
    auto resumed = testing::make_trainer(testing::components_yaml(data), testing::settings(1, 2, 5), {second});
    resumed.trainer->enable_checkpoints(checkpoints);
    resumed.trainer->restore(first->saved_paths.back());
    resumed.trainer->fit();
    ASSERT_GE(log.size(), 2u);
    EXPECT_EQ(log[0], "second: train_begin");
    EXPECT_EQ(log[1], "second: checkpoint_loaded 4");
    EXPECT_EQ(second->loaded_path, first->saved_paths.back());
    // The memory report is taken at the first step this process runs, here step 5.
    EXPECT_GT(resumed.trainer->memory().parameters, 0) << "async " << async;
  }
}

TEST(Mfu, MatchesAHandComputationForAKnownModelAndPeak) {
  TempDir dir;
  TrainerSettings s = testing::settings(1, 4, 2);
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)), s, {}, {}, {},
                                   /*peak_flops=*/2.5e9);
  // gpt with vocab 32, 2 layers, width 16, biases, sequence 16. N (without the position table):
  // token embedding 32*16 = 512; per block ln 32 + qkv 16*48+48 + proj 16*16+16 + ln 32 +
  // fc 16*64+64 + proj 64*16+16 = 3280; final ln 32  ->  N = 512 + 2*3280 + 32 = 7104.
  // FLOPs per token = 6N + 12 * layers * width * seq = 42624 + 6144 = 48768.
  const double flops_per_token = 48768;
  EXPECT_DOUBLE_EQ(run.trainer->model().flops_per_token(16), flops_per_token);
  EXPECT_EQ(run.trainer->peak_flops().source, "settings.peak_flops");
  for (int i = 0; i < 2; ++i) {
    const StepMetrics m = run.trainer->step();
    ASSERT_TRUE(m.mfu.has_value());
    const double tokens_per_s = static_cast<double>(4 * 16) / m.step_time_s;  // one rank
    EXPECT_NEAR(m.tokens_per_s_per_device, tokens_per_s, 1e-9 * tokens_per_s);
    EXPECT_NEAR(*m.mfu, flops_per_token * tokens_per_s / 2.5e9, 1e-9 * *m.mfu);
  }
}

// LoRA (rank 2 on each block's c_attn) over the gpt above: the frozen base costs its forward and
// its inputs' gradients but no weight gradients, 4 N instead of 6 N; the adapters' own 256
// elements (A 2x16 and B 48x2 in each of 2 blocks) cost 6 each.
TEST(Mfu, OfAnAdaptedModelCountsTheFrozenBaseWithoutItsWeightGradients) {
  TempDir dir;
  auto run = testing::make_trainer(
      testing::components_yaml(testing::uneven_token_file(dir)) +
          "adapters: [{component_key: adapter, variant_key: lora, config: {rank: 2, alpha: 4, target_modules: "
          "[c_attn]}}]\n",
      testing::settings(1, 4, 1), {}, {}, {}, /*peak_flops=*/2.5e9);
  ASSERT_EQ(run.trainer->parameter_count(), 256);
  // 6N + attention - 2N + 6 * 256 = 48768 - 14208 + 1536.
  const double flops_per_token = 36096;
  const StepMetrics m = run.trainer->step();
  ASSERT_TRUE(m.mfu.has_value());
  EXPECT_NEAR(*m.mfu, flops_per_token * m.tokens_per_s_per_device / 2.5e9, 1e-9 * *m.mfu);
}

TEST(Mfu, IsAbsentOnACpuWithoutAConfiguredPeak) {
  TempDir dir;
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)), testing::settings(1, 2, 1));
  EXPECT_FALSE(run.trainer->step().mfu.has_value());
  EXPECT_NE(run.trainer->peak_flops().source.find("set settings.peak_flops"), std::string::npos);
}

TEST(PeakFlops, TheTableKnowsH100H200AndA100AndNothingElse) {
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H100 80GB HBM3", ComputePrecision::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H100 80GB HBM3", ComputePrecision::tf32), 494.7e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H100 80GB HBM3", ComputePrecision::fp32), 66.9e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H100 PCIe", ComputePrecision::bf16), 756.0e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H100 NVL", ComputePrecision::fp16), 835.5e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA H200", ComputePrecision::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA A100-SXM4-80GB", ComputePrecision::bf16), 312.0e12);
  EXPECT_DOUBLE_EQ(*known_peak_flops("NVIDIA A100-PCIE-40GB", ComputePrecision::tf32), 156.0e12);
  EXPECT_FALSE(known_peak_flops("NVIDIA GeForce RTX 4090", ComputePrecision::bf16));
  EXPECT_FALSE(known_peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", ComputePrecision::bf16));  // a slice
  EXPECT_FALSE(known_peak_flops("cpu", ComputePrecision::fp32));
  // The configuration wins over the table; without either there is no number at all.
  EXPECT_DOUBLE_EQ(*resolve_peak_flops(1e12, "NVIDIA H100 80GB HBM3", ComputePrecision::bf16).flops, 1e12);
  EXPECT_DOUBLE_EQ(*resolve_peak_flops(0, "NVIDIA H200", ComputePrecision::bf16).flops, 989.4e12);
  EXPECT_FALSE(resolve_peak_flops(0, "cpu", ComputePrecision::fp32).flops);
}

TEST(Eta, TheNearestLimitAtTheRatesSeen) {
  EtaInputs in;
  EXPECT_FALSE(estimate_eta(in));  // no limit
  in.step = 10;
  in.max_steps = 110;
  in.seconds_per_step = 0.5;
  EXPECT_DOUBLE_EQ(*estimate_eta(in), 50.0);
  in.tokens = 1000;
  in.max_tokens = 3000;
  in.tokens_per_s = 100;  // 20 s to the token limit: nearer
  EXPECT_DOUBLE_EQ(*estimate_eta(in), 20.0);
  in.elapsed_s = 95;
  in.max_time_s = 100;  // 5 s of budget left: nearer still
  EXPECT_DOUBLE_EQ(*estimate_eta(in), 5.0);
}

TEST(StepMetrics, BreakDownTheStepAndMeasureMemory) {
  TempDir dir;
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)), testing::settings(2, 2, 10));
  run.trainer->step();
  const StepMetrics m = run.trainer->step();
  EXPECT_GT(m.time_data_s, 0);
  EXPECT_GT(m.time_forward_backward_s, 0);
  EXPECT_GT(m.time_optimizer_s, 0);
  EXPECT_EQ(m.time_communication_s, 0);  // one local rank: nothing to wait for
  EXPECT_LE(m.time_data_s + m.time_forward_backward_s + m.time_optimizer_s, m.step_time_s);
  EXPECT_GT(m.memory_in_use_bytes, 1 << 20);  // the process's resident set
  EXPECT_GE(m.memory_peak_bytes, m.memory_in_use_bytes);
  ASSERT_TRUE(m.eta_s.has_value());  // 8 steps left
  EXPECT_NEAR(*m.eta_s, 8 * m.step_time_s, 1e-9);  // the second step is the only one past warm-up
}

// A skip asked for after the optimizer step must not skip the next, healthy step.
TEST(Events, ASkipRequestedTooLateIsDroppedNotCarriedOver) {
  class LateSkipper final : public Callback {
   public:
    void on_step_end(CallbackContext& ctx, const StepMetrics&) override { ctx.control.request_skip_step("too late"); }
  };
  TempDir dir;
  auto run = testing::make_trainer(testing::components_yaml(testing::uneven_token_file(dir)), testing::settings(1, 2, 3),
                                   {std::make_shared<LateSkipper>()});
  ::testing::internal::CaptureStderr();
  run.trainer->fit();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("a skip requested after step 1's optimizer step is dropped"), std::string::npos) << log;
  EXPECT_EQ(run.trainer->progress().step, 3);
}

// The trainer adds the model's own loss terms (MoE balancing) to the objective, not the report.
TEST(AuxiliaryLoss, ShapesTheGradientButNotTheReportedLoss) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  auto moe = [&](const std::string& coef) {
    return "model: {component_key: model, variant_key: gpt_moe,\n"
           "        config: {vocab_size: 32, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16, num_experts: 4,\n"
           "                 top_k: 1, z_loss_coef: 0, aux_loss_coef: " + coef + "}}\n"
           "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n"
           "loss: {component_key: loss, variant_key: cross_entropy}\n"
           "optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 0.5, model: {instance_key: model}}}\n";
  };
  auto without = testing::make_trainer(moe("0.0"), testing::settings(2, 2, 1));
  auto with = testing::make_trainer(moe("1.0"), testing::settings(2, 2, 1));
  const StepMetrics a = without.trainer->step(), b = with.trainer->step();
  EXPECT_DOUBLE_EQ(a.loss, b.loss);  // same weights, same data: the reported loss is the LM loss
  EXPECT_NE(a.grad_norm, b.grad_norm);
  double router_change = 0;
  for (const auto& item : without.trainer->model().named_parameters()) {
    if (item.key().find("router") == std::string::npos) continue;
    const at::Tensor other = with.trainer->model().named_parameters()[item.key()];
    router_change += (item.value() - other).abs().sum().item<double>();
  }
  EXPECT_GT(router_change, 0) << "the balancing loss moved the router";
}

// The weight is 1 / (micro-batches x ranks): with top-1 routing the gates are 1 and the router
// learns from the balancing loss alone, so its SGD update is -lr x mean over micro-batches of
// d(aux)/d(router), computed here by hand from the same two micro-batches.
TEST(AuxiliaryLoss, EachMicroBatchCountsOneOverTheirNumber) {
  TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  const std::string yaml =
      "model: {component_key: model, variant_key: gpt_moe,\n"
      "        config: {vocab_size: 32, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16, num_experts: 4,\n"
      "                 top_k: 1, z_loss_coef: 0, aux_loss_coef: 0.5}}\n"
      "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n"
      "loss: {component_key: loss, variant_key: cross_entropy}\n"
      "optimizer: {component_key: optimizer, variant_key: sgd, config: {lr: 0.5, model: {instance_key: model}}}\n";
  auto trained = testing::make_trainer(yaml, testing::settings(2, 2, 1));
  auto by_hand = testing::make_trainer(yaml, testing::settings(2, 2, 1));  // same seed: same weights, same data
  auto router_of = [](Model& m) {
    for (const auto& item : m.named_parameters()) {
      if (item.key().find("router") != std::string::npos) return item.value();
    }
    return at::Tensor();
  };
  const at::Tensor before = router_of(trained.trainer->model()).detach().clone();
  trained.trainer->step();
  const at::Tensor update = router_of(trained.trainer->model()).detach() - before;

  Model& model = by_hand.trainer->model();
  auto dataset = testing::built<Dataset>(by_hand.components, "train_data");
  at::Tensor aux_sum;
  for (int i = 0; i < 2; ++i) {
    model.forward(dataset->next_batch(2).input_ids);
    const at::Tensor aux = model.auxiliary_loss();
    aux_sum = i == 0 ? aux : aux_sum + aux;
  }
  (aux_sum / 2.0).backward();
  const at::Tensor expected = -0.5 * router_of(model).grad();
  ASSERT_GT(expected.abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(at::allclose(update, expected, 1e-4, 1e-7))
      << "update " << update.abs().sum().item<double>() << " vs expected " << expected.abs().sum().item<double>();
}

}  // namespace observability_test
}  // namespace tessera::core
