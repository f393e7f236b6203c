// The strategies on real Gloo process groups (ranks as threads of this process, rendezvous over a
// real TCPStore on loopback), driving the real trainer with the real gpt, tokens, cross_entropy
// and adamw plugins. N ranks with A micro-batches each must match one rank with N*A micro-batches:
// per-step loss and grad norm, and the final weights.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <c10/core/GradMode.h>

#include <mutex>
#include <thread>

#include "tessera/run/communicator.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/generation/generate.hpp"
#include "gloo_ranks.hpp"
#include "trainer_parts.hpp"
#include "test_support.hpp"

namespace tessera {
namespace strategies_test {

using core::Trainer;
using testing::TempDir;

constexpr std::int64_t kSteps = 3;
constexpr std::int64_t kMicroBatch = 2;
constexpr std::int64_t kAccumPerRank = 2;

// Token 0 is padding (ignored as a label) in runs of varying length: ranks and micro-batches
// carry different numbers of target tokens, which the global normalisation must absorb.
std::string uneven_token_file(const TempDir& dir) {
  std::vector<std::uint16_t> tokens;
  std::uint32_t state = 11;
  for (int doc = 0; tokens.size() < 6000; ++doc) {
    const int text = 3 + doc * 7 % 29, pad = doc * 11 % 23;
    for (int i = 0; i < text; ++i) tokens.push_back(static_cast<std::uint16_t>(1 + (state = state * 1103515245u + 12345u) % 31));
    for (int i = 0; i < pad; ++i) tokens.push_back(0);
  }
  const std::string path = dir.file("uneven.bin");
  testing::write_token_file(path, tokens);
  return path;
}

// Three blocks so fsdp has several units besides the root; bucket_mb small enough for ddp and
// zero to cut several buckets.
std::string components_yaml(const std::string& data, const std::string& strategy, const std::string& extra = "") {
  std::string yaml =
      "model: {component_key: model, variant_key: gpt,\n"
      "        config: {vocab_size: 32, n_layer: 3, n_head: 2, n_embd: 16, max_seq_len: 16}}\n"
      "train_data: {component_key: dataset, variant_key: tokens,\n"
      "             config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n"
      "loss: {component_key: loss, variant_key: cross_entropy}\n"
      "optimizer: {component_key: optimizer, variant_key: adamw,\n"
      "            config: {lr: 0.01, weight_decay: 0.1, model: {instance_key: model}}}\n";
  if (!strategy.empty()) {
    yaml += "parallel: {component_key: parallel, variant_key: " + strategy + ", config: {" +
            (strategy == "fsdp" ? std::string("prefetch: true") : std::string("bucket_mb: 0.005")) + extra + "}}\n";
  }
  return yaml;
}

struct RankRun {
  std::vector<double> losses, grad_norms;
  StateDict weights;  // full parameters after the last step
  core::MemoryReport memory;
  bool blocks_freed_between_steps = false;  // fsdp: a block's parameters hold no memory at rest
  at::Tensor eval_logits;                   // a no-grad forward after training
  // The loss of a no-grad forward after training, from the logits and from the hidden states and
  // the output head (the path of a chunked loss in evaluation).
  double eval_loss_from_logits = 0, eval_loss_from_hidden = 0;
  // Loading other full parameters changed the forward's logits, and loading these back restored them.
  bool load_changes_the_model = false, load_restores_the_model = false;
  // keep_reference_weights after training, then other weights loaded: within with_reference_weights
  // the forward and full_parameters are the kept ones', and after it the loaded ones' again.
  bool reference_computes_as_kept = false, trained_weights_back = false;
  StateDict reference_weights;
  std::int64_t reference_bytes = 0;
  std::string error;
};

std::mutex build_mutex;  // the global RNG seeds each rank's build in turn

void train_rank(const std::string& yaml, std::shared_ptr<Communicator> comm, std::int64_t accum, RankRun& out,
                const std::string& precision) {
  try {
    RunContext context = testing::rank_context(comm, 42);
    context.precision = precision;
    core::BuiltComponents built;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      // Ranks other than 0 start from other weights: the strategy must broadcast rank 0's.
      core::seed_everything(context.seed + 1000 * static_cast<std::uint64_t>(context.rank), "cpu");
      built = testing::build_components(yaml, context);
    }
    core::TrainerParts parts = testing::trainer_parts(built);
    core::TrainerSettings settings;
    settings.grad_accum = accum;
    settings.micro_batch_size = kMicroBatch;
    settings.max_steps = kSteps;
    settings.clip_grad_norm = 0.5;
    auto strategy = parts.parallel;
    Trainer trainer(std::move(parts), settings, context);
    for (std::int64_t s = 0; s < kSteps; ++s) {
      StepMetrics m = trainer.step();
      out.losses.push_back(m.loss);
      out.grad_norms.push_back(m.grad_norm);
    }
    out.memory = trainer.memory();
    const auto block_weight = trainer.model().named_parameters()["h.1.mlp.c_fc.weight"];
    out.blocks_freed_between_steps = block_weight.storage().nbytes() == 0;
    out.weights = strategy ? strategy->full_parameters(trainer.model()) : StateDict{};
    if (!strategy) {
      for (const auto& item : trainer.model().named_parameters()) out.weights[item.key()] = item.value().detach().clone();
    }
    c10::NoGradGuard no_grad;
    out.eval_logits = trainer.model().forward(at::ones({1, 8}, at::kLong));
    const at::Tensor ids = at::arange(1, 9, at::kLong).view({1, 8}), labels = at::arange(2, 10, at::kLong).view({1, 8});
    const auto loss = testing::built<Loss>(built, "loss");
    out.eval_loss_from_logits = loss->compute(trainer.model().forward(ids), labels).sum.item<double>();
    out.eval_loss_from_hidden = loss->compute_from_hidden(trainer.model().forward_hidden(ids),
                                                          trainer.model().output_head(), labels).sum.item<double>();
    if (strategy) {  // what resuming from a checkpoint does: every parameter, trained or frozen
      // A frozen copy of these weights (loss/dpo's reference without adapters) outlives a change.
      strategy->keep_reference_weights(trainer.model());
      out.reference_bytes = strategy->reference_bytes();
      StateDict halved;
      for (const auto& [name, w] : out.weights) halved[name] = w * 0.5;
      strategy->load_full_parameters(trainer.model(), halved);
      const at::Tensor halved_logits = trainer.model().forward(at::ones({1, 8}, at::kLong));
      out.load_changes_the_model = !halved_logits.equal(out.eval_logits);
      strategy->with_reference_weights([&] {
        out.reference_computes_as_kept = trainer.model().forward(at::ones({1, 8}, at::kLong)).equal(out.eval_logits);
        out.reference_weights = strategy->full_parameters(trainer.model());
      });
      out.trained_weights_back = trainer.model().forward(at::ones({1, 8}, at::kLong)).equal(halved_logits);
      strategy->load_full_parameters(trainer.model(), out.weights);
      out.load_restores_the_model = trainer.model().forward(at::ones({1, 8}, at::kLong)).equal(out.eval_logits);
    }
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

// N ranks as threads, each with its own TCPStore client and Gloo process group.
std::vector<RankRun> run_ranks(const std::string& yaml, std::int64_t world, std::int64_t accum,
                               const std::string& precision = "fp32") {
  std::vector<RankRun> runs(static_cast<std::size_t>(world));
  if (world == 1) {
    train_rank(yaml, core::make_local_communicator(), accum, runs[0], precision);
    return runs;
  }
  core::DistributedEnv env;
  env.world_size = world;
  env.master_port = testing::free_loopback_port();
  std::vector<std::thread> threads;
  for (std::int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      core::DistributedEnv mine = env;
      mine.rank = r;
      std::shared_ptr<Communicator> comm;
      try {
        comm = core::make_gloo_communicator(mine, std::chrono::seconds(60));
      } catch (const std::exception& e) {
        runs[static_cast<std::size_t>(r)].error = e.what();
        return;
      }
      train_rank(yaml, comm, accum, runs[static_cast<std::size_t>(r)], precision);
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

struct Case {
  std::string strategy;
  std::int64_t world;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.strategy << " on " << c.world << " ranks"; }

class Strategies : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
};

// Bytes within a few percent: each unit pads to a multiple of the world size, and AdamW keeps an
// 8-byte step count per parameter on every rank.
void expect_about(std::int64_t actual, double expected, const char* what) {
  EXPECT_NEAR(static_cast<double>(actual), expected, 0.03 * expected + 512) << what;
}

// A rank of N trained as the one rank of `reference` did: per-step loss and grad norm, every final
// weight, a forward after training (logits, and the loss through the hidden states and the head),
// and loading full parameters (what resuming does) reaching every parameter.
void expect_trains_as(const RankRun& run, const RankRun& reference) {
  ASSERT_EQ(run.error, "");
  ASSERT_EQ(run.losses.size(), static_cast<std::size_t>(kSteps));
  for (std::size_t s = 0; s < run.losses.size(); ++s) {
    EXPECT_NEAR(run.losses[s], reference.losses[s], 1e-5 * reference.losses[s]) << "step " << s + 1;
    EXPECT_NEAR(run.grad_norms[s], reference.grad_norms[s], 1e-4 * reference.grad_norms[s]) << "step " << s + 1;
  }
  ASSERT_EQ(run.weights.size(), reference.weights.size());
  for (const auto& [name, w] : reference.weights) {
    ASSERT_TRUE(run.weights.count(name)) << name;
    EXPECT_TRUE(run.weights.at(name).allclose(w, /*rtol=*/1e-4, /*atol=*/5e-5))
        << name << " differs by " << (run.weights.at(name) - w).abs().max().item<double>();
  }
  EXPECT_TRUE(run.eval_logits.allclose(reference.eval_logits, 1e-4, 1e-4));
  EXPECT_NEAR(run.eval_loss_from_hidden, run.eval_loss_from_logits, 1e-5 * run.eval_loss_from_logits)
      << "the output head must still be whole after a no-grad forward_hidden";
  EXPECT_NEAR(run.eval_loss_from_hidden, reference.eval_loss_from_hidden, 1e-4 * reference.eval_loss_from_hidden);
  EXPECT_TRUE(run.load_changes_the_model);
  EXPECT_TRUE(run.load_restores_the_model);
}

TEST_P(Strategies, MatchOneRankWithAsMuchAccumulation) {
  const Case c = GetParam();
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  const RankRun reference = run_ranks(components_yaml(data, ""), 1, kAccumPerRank * c.world).front();
  ASSERT_EQ(reference.error, "");
  const std::vector<RankRun> ranks = run_ranks(components_yaml(data, c.strategy), c.world, kAccumPerRank);

  const double full_bytes = static_cast<double>(reference.memory.parameters);
  const double optimizer_bytes = static_cast<double>(reference.memory.optimizer_state);
  const double n = static_cast<double>(c.world);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE(c.strategy + " rank " + std::to_string(r) + " of " + std::to_string(c.world));
    const RankRun& run = ranks[r];
    ASSERT_NO_FATAL_FAILURE(expect_trains_as(run, reference));

    // What each rank holds between steps: ddp everything, zero1 1/N of the optimizer state,
    // zero2 also 1/N of the gradients, fsdp also 1/N of the parameters.
    const bool sharded_optimizer = c.strategy != "ddp";
    const bool sharded_grads = c.strategy == "zero2" || c.strategy == "fsdp";
    const bool sharded_params = c.strategy == "fsdp";
    expect_about(run.memory.optimizer_state, sharded_optimizer ? optimizer_bytes / n : optimizer_bytes,
                 "optimizer state");
    expect_about(run.memory.parameters, sharded_params ? full_bytes / n : full_bytes, "parameters");
    // zero1 keeps whole gradients to accumulate into, plus the reduced shard.
    const double grads = sharded_grads ? full_bytes / n : c.strategy == "zero1" ? full_bytes * (1 + 1 / n) : full_bytes;
    expect_about(run.memory.gradients, grads, "gradients");
    EXPECT_EQ(run.blocks_freed_between_steps, sharded_params);
    // The reference copy is held as the parameters are (fsdp: each rank its shard).
    expect_about(run.reference_bytes, sharded_params ? full_bytes / n : full_bytes, "reference copy");
    EXPECT_TRUE(run.reference_computes_as_kept);
    EXPECT_TRUE(run.trained_weights_back);
    ASSERT_EQ(run.reference_weights.size(), run.weights.size());
    for (const auto& [name, w] : run.weights) EXPECT_TRUE(run.reference_weights.at(name).equal(w)) << name;
  }
}

// settings.precision: bf16 under every strategy: the forward and backward compute in bfloat16
// while the strategy's buffers, the reductions and the optimizer stay float32. N ranks then
// match one bf16 rank to bf16's precision (the reduction order of bf16 products differs), and
// bf16 stays near fp32.
TEST_P(Strategies, TrainWithBf16Compute) {
  const Case c = GetParam();
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  const RankRun fp32 = run_ranks(components_yaml(data, ""), 1, kAccumPerRank * c.world).front();
  const RankRun bf16 = run_ranks(components_yaml(data, ""), 1, kAccumPerRank * c.world, "bf16").front();
  ASSERT_EQ(fp32.error, "");
  ASSERT_EQ(bf16.error, "");
  // Also with the mixed-precision policy: gradients reduced in bf16, and under fsdp parameters
  // gathered in bf16 (the fp32 shards stay the master weights).
  const std::string policy = c.strategy == "fsdp" ? ", param_dtype: bf16, reduce_dtype: bf16" : ", reduce_dtype: bf16";
  for (const std::string& extra : {std::string(), policy}) {
  const std::vector<RankRun> ranks = run_ranks(components_yaml(data, c.strategy, extra), c.world, kAccumPerRank, "bf16");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE(c.strategy + extra + " rank " + std::to_string(r) + " of " + std::to_string(c.world));
    const RankRun& run = ranks[r];
    ASSERT_EQ(run.error, "");
    ASSERT_EQ(run.losses.size(), static_cast<std::size_t>(kSteps));
    for (std::size_t s = 0; s < run.losses.size(); ++s) {
      EXPECT_NE(bf16.losses[s], fp32.losses[s]) << "step " << s + 1 << ": bf16 computed exactly as fp32";
      EXPECT_NEAR(bf16.losses[s], fp32.losses[s], 0.02 * fp32.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(run.losses[s], bf16.losses[s], 0.01 * bf16.losses[s]) << "step " << s + 1;
    }
    for (const auto& [name, w] : run.weights) {
      EXPECT_EQ(w.scalar_type(), at::kFloat) << name << ": master weights must stay float32";
    }
    EXPECT_EQ(run.weights.size(), bf16.weights.size());
    // The forward after training ran without autocast: its dtype is that of the gathered weights.
    const bool gathers_bf16 = c.strategy == "fsdp" && !extra.empty();
    EXPECT_EQ(run.eval_logits.scalar_type(), gathers_bf16 ? at::kBFloat16 : at::kFloat);
  }
  }
}

INSTANTIATE_TEST_SUITE_P(GlooRanks, Strategies,
                         ::testing::Values(Case{"ddp", 2}, Case{"ddp", 3}, Case{"zero1", 2}, Case{"zero1", 3},
                                           Case{"zero2", 2}, Case{"zero2", 3}, Case{"fsdp", 2}, Case{"fsdp", 3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.strategy + "_" + std::to_string(info.param.world) + "_ranks";
                         });

// LoRA over the gpt (adapter/lora, rank 2, on the attention and the MLP's first projection):
// only the adapters train. fsdp shards the frozen base too, in units of its own that are gathered
// for compute and never reduced: each rank holds 1/N of every parameter, frozen or not, while
// the losses, norms and weights (base and adapters) equal one rank's.
const char* const kLoraAdapters =
    "adapters: [{component_key: adapter, variant_key: lora, config: {rank: 2, alpha: 4, target_modules: [c_attn, "
    "c_fc]}}]\n";

TEST(FsdpWithAdapters, ShardsTheFrozenBaseAndMatchesOneRank) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  for (const std::int64_t world : {2, 3}) {
    const RankRun reference =
        run_ranks(components_yaml(data, "") + kLoraAdapters, 1, kAccumPerRank * world).front();
    ASSERT_EQ(reference.error, "");
    const std::vector<RankRun> ranks = run_ranks(components_yaml(data, "fsdp") + kLoraAdapters, world, kAccumPerRank);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
      const RankRun& run = ranks[r];
      ASSERT_NO_FATAL_FAILURE(expect_trains_as(run, reference));
      int adapters = 0;
      for (const auto& item : run.weights) adapters += item.first.find(".lora_") != std::string::npos;
      EXPECT_EQ(adapters, 4 * 3) << "A and B of two layers in each of three blocks";
      // The frozen base is 1/N on each rank (one rank holds it whole), and a block's frozen weight
      // holds no memory between steps.
      expect_about(run.memory.parameters, static_cast<double>(reference.memory.parameters) / static_cast<double>(world),
                   "parameters");
      EXPECT_TRUE(run.blocks_freed_between_steps) << "h.1.mlp.c_fc.weight (frozen) is whole between steps";
    }
  }
}

// Forwards to a real communicator and counts what the strategy starts, so a test can see when
// collectives happen relative to backward.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  std::int64_t rank() const override { return rank_ >= 0 ? rank_ : inner_->rank(); }
  std::int64_t world_size() const override { return inner_->world_size(); }
  std::shared_ptr<PendingCollective> all_reduce_async(at::Tensor& t, ReduceOp op) override {
    ++all_reduces;
    return inner_->all_reduce_async(t, op);
  }
  std::shared_ptr<PendingCollective> all_gather_async(std::vector<at::Tensor>& out, const at::Tensor& in) override {
    ++all_gathers;
    return inner_->all_gather_async(out, in);
  }
  std::shared_ptr<PendingCollective> reduce_scatter_async(at::Tensor& out, std::vector<at::Tensor>& in,
                                                          ReduceOp op) override {
    ++reduce_scatters;
    return inner_->reduce_scatter_async(out, in, op);
  }
  std::shared_ptr<PendingCollective> all_to_all_async(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in) override {
    return inner_->all_to_all_async(out, in);
  }
  std::shared_ptr<PendingCollective> send_async(at::Tensor& t, std::int64_t peer, int tag) override {
    return inner_->send_async(t, peer, tag);
  }
  std::shared_ptr<PendingCollective> recv_async(at::Tensor& t, std::int64_t peer, int tag) override {
    return inner_->recv_async(t, peer, tag);
  }
  void broadcast(at::Tensor& t, std::int64_t root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  int all_reduces = 0, all_gathers = 0, reduce_scatters = 0;
  std::int64_t rank_ = -1;  // >= 0: the rank this communicator claims to be (the collectives stay the inner's)

 private:
  std::shared_ptr<Communicator> inner_;
};

struct Driven {
  core::BuiltComponents built;
  std::shared_ptr<Model> model;
  std::shared_ptr<ParallelStrategy> strategy;
  std::shared_ptr<CountingCommunicator> comm;
  at::Tensor batch = at::ones({2, 8}, at::kLong);
  void backward() { model->forward(batch).sum().backward(); }
};

Driven drive(const std::string& strategy, const std::string& device = "cpu", std::int64_t claimed_rank = -1,
             const std::string& more_components = "") {
  TempDir dir;
  Driven d;
  d.comm = std::make_shared<CountingCommunicator>(core::make_local_communicator());
  d.comm->rank_ = claimed_rank;
  RunContext context;
  context.communicator = d.comm;
  context.device = device;
  core::seed_everything(42, device);
  d.built = testing::build_components(components_yaml(uneven_token_file(dir), strategy) + more_components, context);
  d.model = testing::built<Model>(d.built, "model");
  d.model->to(c10::Device(device));
  d.batch = d.batch.to(c10::Device(device));
  d.strategy = testing::built<ParallelStrategy>(d.built, "parallel");
  d.strategy->setup(*d.model, *testing::built<Optimizer>(d.built, "optimizer"), *d.comm);
  return d;
}

TEST(StrategyCommunication, DdpReducesOnlyOnTheLastMicroBatchAndDuringBackward) {
  Driven d = drive("ddp");
  for (std::int64_t i = 0; i < 2; ++i) {
    d.strategy->begin_micro_batch(i, 3);
    d.backward();
  }
  d.strategy->finish_gradients();
  EXPECT_EQ(d.comm->all_reduces, 0) << "no communication on micro-batches that do not end the step";
  d.strategy->begin_micro_batch(2, 3);
  d.backward();
  const int buckets = static_cast<int>(d.strategy->gradients().size());
  EXPECT_GT(buckets, 2);
  // Every bucket's all-reduce has started from autograd hooks before backward returned.
  EXPECT_EQ(d.comm->all_reduces, buckets);
  d.strategy->finish_gradients();
  // One more, on the host: which parameters the step reached, agreed over the ranks.
  EXPECT_EQ(d.comm->all_reduces, buckets + 1);
}

// On a rank other than 0, ddp's share of the squared gradient norm is a zero (rank 0 counts the
// replicated gradient): made on the gradients' device, not copied there every step.
TEST(StrategyCommunication, DdpNormShareOfOtherRanksStaysOnTheCudaGradientsDevice) {
  if (!at::globalContext().hasCUDA() || c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount() == 0) {
    GTEST_SKIP() << "no CUDA GPU on this machine: this test runs on a GPU machine only";
  }
  Driven d = drive("ddp", "cuda:0", /*claimed_rank=*/1);
  d.strategy->begin_micro_batch(0, 1);
  d.backward();
  d.strategy->finish_gradients();
  const at::Tensor share = d.strategy->grad_norm_squared_share();
  EXPECT_TRUE(share.device().is_cuda()) << share.device();
  EXPECT_EQ(share.item<float>(), 0.0f);
}

TEST(StrategyCommunication, Zero1ScattersOnceAndZero2EveryBackward) {
  Driven zero1 = drive("zero1"), zero2 = drive("zero2");
  for (std::int64_t i = 0; i < 3; ++i) {
    zero1.strategy->begin_micro_batch(i, 3);
    zero1.backward();
    zero2.strategy->begin_micro_batch(i, 3);
    zero2.backward();
  }
  const int buckets = static_cast<int>(zero1.strategy->gradients().size());
  EXPECT_EQ(zero1.comm->reduce_scatters, buckets);
  EXPECT_EQ(zero2.comm->reduce_scatters, 3 * buckets);
  zero1.strategy->finish_gradients();
  zero2.strategy->finish_gradients();
  // Both hold the same summed gradient shard.
  for (int b = 0; b < buckets; ++b) {
    EXPECT_TRUE(zero1.strategy->gradients()[b].allclose(zero2.strategy->gradients()[b], 1e-5, 1e-6)) << "bucket " << b;
  }
}

TEST(StrategyCommunication, FsdpGathersEachUnitForForwardAndAgainForBackward) {
  Driven d = drive("fsdp");
  // Three blocks and the root (embeddings, final norm): four units.
  ASSERT_EQ(d.strategy->gradients().size(), 4u);
  d.strategy->begin_micro_batch(0, 1);
  at::Tensor logits = d.model->forward(d.batch);
  EXPECT_EQ(d.comm->all_gathers, 4) << "root and three blocks, once each";
  logits.sum().backward();
  EXPECT_EQ(d.comm->all_gathers, 7) << "each block again for its backward; the root stayed gathered";
  EXPECT_EQ(d.comm->reduce_scatters, 4);
  d.strategy->finish_gradients();
  for (const auto& p : d.model->parameters()) {
    EXPECT_EQ(p.storage().nbytes(), 0u) << "every unit is freed once its backward is done";
  }
}

// The frozen base of an adapted model: gathered for forward and again for backward like a trained
// unit, never reduced, and freed during backward once the unit's input has its gradient (a block's
// frozen weights are gone before the block below it runs its backward).
TEST(StrategyCommunication, FsdpGathersTheFrozenBaseForComputeAndNeverReducesIt) {
  Driven d = drive("fsdp", "cpu", -1, kLoraAdapters);
  // Trained: the three blocks' adapters (the root's embeddings and final norm are frozen).
  ASSERT_EQ(d.strategy->gradients().size(), 3u);
  const auto named = d.model->named_parameters();
  const at::Tensor first_adapter = named["h.0.attn.c_attn.lora_A.weight"];
  const at::Tensor last_block_weight = named["h.2.mlp.c_fc.weight"];
  bool last_block_freed_before_the_first_blocks_backward = false;
  at::Tensor(first_adapter).register_hook([&](const at::Tensor&) {
    last_block_freed_before_the_first_blocks_backward = last_block_weight.storage().nbytes() == 0;
  });
  d.strategy->begin_micro_batch(0, 1);
  at::Tensor logits = d.model->forward(d.batch);
  EXPECT_EQ(d.comm->all_gathers, 7) << "the frozen root, and each block's adapters and frozen weights";
  logits.sum().backward();
  EXPECT_EQ(d.comm->all_gathers, 13) << "each block's two units again for its backward";
  EXPECT_EQ(d.comm->reduce_scatters, 3) << "the adapters' units alone";
  EXPECT_TRUE(last_block_freed_before_the_first_blocks_backward);
  d.strategy->finish_gradients();
  for (const auto& item : d.model->named_parameters()) {
    EXPECT_EQ(item.value().storage().nbytes(), 0u) << item.key() << ": every unit is freed once backward is done";
  }
}

// A generation phase (rollouts, a sampled text) under fsdp: every unit gathered once before it,
// nothing moved during its passes (so ranks may run different numbers of them), every unit freed
// after it; the tokens are those of passes that gather unit by unit.
TEST(StrategyCommunication, FsdpGathersEveryUnitOnceForAWholeGenerationPhase) {
  Driven d = drive("fsdp");
  GenerationRequest request;
  request.prompt_ids = {1, 2, 3};
  request.max_new_tokens = 6;
  request.sampling.temperature = 0;
  const std::vector<GenerationResult> unit_by_unit = generate(*d.model, {request}, {});
  EXPECT_GE(d.comm->all_gathers, 3 * 6) << "each block gathered again for each of the six passes";
  for (const auto& item : d.model->named_parameters()) {
    if (item.key().rfind("h.", 0) == 0) EXPECT_EQ(item.value().storage().nbytes(), 0u) << item.key();
  }
  const int before = d.comm->all_gathers;
  int at_start = -1, at_end = -1;
  std::vector<GenerationResult> phase;
  d.strategy->with_whole_parameters(*d.model, [&] {
    at_start = d.comm->all_gathers;
    phase = generate(*d.model, {request, request}, {});
    at_end = d.comm->all_gathers;
  });
  EXPECT_LE(at_start - before, 4) << "each of the four units gathered at most once";
  EXPECT_GE(at_start - before, 3) << "the three blocks, freed after the last pass, gathered again";
  EXPECT_EQ(at_end, at_start) << "no collective inside the phase";
  ASSERT_EQ(phase.size(), 2u);
  for (const auto& result : phase) {
    EXPECT_EQ(result.completion_ids, unit_by_unit[0].completion_ids);
    EXPECT_EQ(result.logprobs, unit_by_unit[0].logprobs);
  }
  for (const auto& p : d.model->parameters()) EXPECT_EQ(p.storage().nbytes(), 0u) << "every unit freed after the phase";
  // The weights are the model's after the phase: a forward gathers them again as before.
  EXPECT_EQ(generate(*d.model, {request}, {})[0].completion_ids, unit_by_unit[0].completion_ids);
}

// Under fsdp each rank generates its own prompts in one phase (RL rollouts): rank 0 two tokens,
// rank 1 seven, so their passes differ in number; each equals what the whole model generates on
// one rank. Gathering unit by unit, the ranks' collectives would not pair up.
TEST(FsdpGeneration, EachRankGeneratesItsOwnPromptsInOnePhase) {
  TempDir dir;
  const std::string data = uneven_token_file(dir);
  std::vector<std::vector<GenerationResult>> got(2), expected(2);
  const auto errors = testing::run_on_gloo_ranks(2, [&](std::int64_t rank, std::shared_ptr<Communicator> comm) {
    core::BuiltComponents built, plain;
    {
      std::lock_guard<std::mutex> lock(build_mutex);
      core::seed_everything(42 + static_cast<std::uint64_t>(rank), "cpu");
      built = testing::build_components(components_yaml(data, "fsdp"), testing::rank_context(comm, 42));
      plain = testing::build_components(components_yaml(data, ""), testing::rank_context(core::make_local_communicator(), 42));
    }
    auto model = testing::built<Model>(built, "model");
    auto strategy = testing::built<ParallelStrategy>(built, "parallel");
    strategy->setup(*model, *testing::built<Optimizer>(built, "optimizer"), *comm);
    // The whole model on one rank, with the weights fsdp shards (rank 0's, broadcast by setup).
    auto whole = testing::built<Model>(plain, "model");
    {
      c10::NoGradGuard no_grad;
      const StateDict weights = strategy->full_parameters(*model);
      for (auto& item : whole->named_parameters()) item.value().copy_(weights.at(item.key()));
    }
    GenerationRequest request;
    request.prompt_ids = rank == 0 ? std::vector<std::int64_t>{1, 2, 3} : std::vector<std::int64_t>{4, 5};
    request.max_new_tokens = rank == 0 ? 2 : 7;
    request.sampling.temperature = 0;
    const auto r = static_cast<std::size_t>(rank);
    expected[r] = generate(*whole, {request}, {});
    strategy->with_whole_parameters(*model, [&] { got[r] = generate(*model, {request}, {}); });
  });
  for (std::size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].size(), 1u);
    EXPECT_EQ(got[r][0].completion_ids, expected[r][0].completion_ids) << "rank " << r;
    ASSERT_EQ(got[r][0].logprobs.size(), expected[r][0].logprobs.size());
    for (std::size_t t = 0; t < got[r][0].logprobs.size(); ++t) {
      EXPECT_NEAR(got[r][0].logprobs[t], expected[r][0].logprobs[t], 1e-6) << "rank " << r;
    }
  }
  EXPECT_EQ(got[0][0].completion_ids.size(), 2u);
  EXPECT_EQ(got[1][0].completion_ids.size(), 7u);
}

}  // namespace strategies_test
}  // namespace tessera
