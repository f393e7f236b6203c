// The compute plane on a GPU. Built always; each test skips with a message where there is no GPU
// (CI has none): run them on a machine with one (docs/benchmarks.md says when they last ran).
//   - a training step makes no host synchronisation in steady state: steps run under LibTorch's
//     CUDA sync-debug mode set to error (any synchronising call throws), and a step returns
//     while the device still runs it (no wait on an event either);
//   - bf16 training on the GPU: fused AdamW, prefetched pinned batches, chunked loss, activation
//     checkpointing, the metrics read a step later;
//   - fsdp with NCCL and the bf16 mixed-precision policy trains on one GPU like the local run;
//   - ddp over NCCL makes no host synchronisation either: the step's host numbers (token counts,
//     skip flags) travel on the Gloo group beside NCCL, not through the device;
//   - trainer.cuda_graph replays captured micro-batches, training as the eager step does.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#endif

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/components/strategy.hpp"
#include "gloo_ranks.hpp"
#include "trainer_parts.hpp"
#include "test_support.hpp"

namespace tessera {
namespace cuda_step_test {

using testing::TempDir;

bool have_gpu() { return at::globalContext().hasCUDA() && c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount() > 0; }

#define SKIP_WITHOUT_GPU()                                                                             \
  do {                                                                                                 \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine: this test runs on a GPU machine only"; \
  } while (0)

std::string token_file(const TempDir& dir) {
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 20000; ++i) tokens.push_back(static_cast<std::uint16_t>((i * 31 + i / 7) % 97));
  const std::string path = dir.file("tokens.bin");
  testing::write_token_file(path, tokens);
  return path;
}

const char* kDropoutAndCheckpointing = "dropout: 0.1, activation_checkpointing: true";

std::string spec(const std::string& data, const std::string& parallel = "",
                 const std::string& model_options = kDropoutAndCheckpointing) {
  return "model: {component_key: model, variant_key: gpt,\n"
         "        config: {vocab_size: 128, n_layer: 2, n_head: 4, n_embd: 64, max_seq_len: 64, " + model_options + "}}\n"
         "train_data: {component_key: dataset, variant_key: tokens, config: {path: " + data + ", seq_len: 64}}\n"
         "loss: {component_key: loss, variant_key: cross_entropy, config: {chunk_size: 96}}\n"
         "optimizer: {component_key: optimizer, variant_key: adamw,\n"
         "            config: {lr: 0.003, weight_decay: 0.1, implementation: fused, model: {instance_key: model}}}\n" +
         parallel;
}

std::unique_ptr<core::Trainer> make_gpu_trainer(core::BuiltComponents& built, const std::string& yaml,
                                                std::shared_ptr<Communicator> comm, bool cuda_graph = false,
                                                std::vector<std::shared_ptr<Callback>> callbacks = {}) {
  RunContext context;
  context.seed = 3;
  context.device = "cuda:0";
  context.precision = "bf16";
  context.communicator = std::move(comm);
  core::seed_everything(context.seed, context.device);
  built = testing::build_components(yaml, context);
  core::TrainerParts parts = testing::trainer_parts(built);
  for (auto& cb : callbacks) parts.callbacks.push_back(std::move(cb));
  core::TrainerSettings settings;
  settings.micro_batch_size = 8;
  settings.grad_accum = 2;
  settings.max_steps = 100;
  settings.clip_grad_norm = 1.0;
  settings.prefetch = 2;  // the non-finite guard stays on (skip): fused AdamW skips on the device
  settings.cuda_graph = cuda_graph;
  return std::make_unique<core::Trainer>(std::move(parts), settings, context);
}

// Runs `body` with LibTorch's CUDA sync-debug mode set to error: any synchronising call throws.
// What the mode cannot see, by its design: waits on a CUDA event and NCCL's blocking wait, which
// polls the work's events (TORCH_NCCL_BLOCKING_WAIT, docs/distributed.md); tests below check
// that a step and a wait for an NCCL collective make neither.
template <class Body>
void without_host_synchronisation(Body&& body) {
#ifdef TESSERA_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  try {
    body();
  } catch (...) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    throw;
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#else
  body();
#endif
}

TEST(CudaStep, SteadyStateStepsMakeNoHostSynchronisation) {
  SKIP_WITHOUT_GPU();
#ifdef TESSERA_WITH_CUDA
  TempDir dir;
  core::BuiltComponents built;
  auto trainer = make_gpu_trainer(built, spec(token_file(dir)), core::make_local_communicator());
  // The first steps allocate, create optimizer state and measure memory once.
  for (int i = 0; i < 3; ++i) trainer->step();
  std::vector<StepMetrics> steps;
  without_host_synchronisation([&] {
    for (int i = 0; i < 5; ++i) steps.push_back(trainer->step());
  });
  for (const auto& m : steps) {
    EXPECT_TRUE(std::isfinite(m.loss.value()));
    EXPECT_GT(m.grad_norm.value(), 0);
  }
  EXPECT_LT(steps.back().loss.value(), std::log(128.0));
#endif
}

// Keeps the device busy for about a second before each optimizer step (a kernel that spins),
// so that a host that waited for anything the step queued would return after it.
class DeviceDelay final : public Callback {
 public:
  void on_before_optimizer_step(CallbackContext&, const BeforeOptimizerStep&) override {
#ifdef TESSERA_WITH_CUDA
    if (enabled) at::cuda::sleep(2'000'000'000);  // cycles: about a second at GPU clocks
#endif
  }
  bool enabled = false;
};

// A step waits for nothing it queued, not even with an event (which sync-debug cannot see): its
// loss, gradient norm and non-finite flag are still on their way when step() returns, while the
// device still spins before the update. The values land later, and they are right.
TEST(CudaStep, AStepReturnsWhileTheDeviceStillRunsIt) {
  SKIP_WITHOUT_GPU();
#ifdef TESSERA_WITH_CUDA
  TempDir dir;
  core::BuiltComponents built;
  auto delay = std::make_shared<DeviceDelay>();
  auto trainer = make_gpu_trainer(built, spec(token_file(dir)), core::make_local_communicator(), false, {delay});
  for (int i = 0; i < 3; ++i) trainer->step();
  delay->enabled = true;
  const StepMetrics m = trainer->step();
  EXPECT_FALSE(m.skipped.ready()) << "the step waited for its non-finite flag";
  EXPECT_FALSE(m.loss.ready()) << "the step waited for its loss";
  delay->enabled = false;
  const StepMetrics next = trainer->step();
  EXPECT_FALSE(next.skipped);  // waits for the copy: the flag of a healthy step is 0
  EXPECT_TRUE(std::isfinite(m.loss.value()));
  EXPECT_EQ(next.extra.count("nonfinite_steps"), 0u);
#endif
}

// trainer.cuda_graph: two eager steps, then each micro-batch's forward and backward (chunked
// loss, bf16 autocast, accumulation over two micro-batches) replayed from one captured graph.
// The losses follow the eager run's (the same kernels, except that autocast recasts weights where
// eager reuses its cache), the replays read each new batch, and the replayed steps make no host
// synchronisation. No dropout: a graph's random offsets need not be eager's. No activation
// checkpointing: it reads the generator's state on the host.
TEST(CudaStep, GraphedMicroBatchesTrainAsEagerOnesWithoutHostSynchronisation) {
  SKIP_WITHOUT_GPU();
#ifdef TESSERA_WITH_CUDA
  TempDir dir;
  const std::string yaml = spec(token_file(dir), "", "dropout: 0.0");
  core::BuiltComponents eager_built, graph_built;
  auto eager = make_gpu_trainer(eager_built, yaml, core::make_local_communicator());
  auto graphed = make_gpu_trainer(graph_built, yaml, core::make_local_communicator(), /*cuda_graph=*/true);
  std::vector<StepMetrics> eager_steps, graph_steps;
  for (int i = 0; i < 3; ++i) {
    eager_steps.push_back(eager->step());
    graph_steps.push_back(graphed->step());  // the third captures
  }
  without_host_synchronisation([&] {
    for (int i = 0; i < 5; ++i) graph_steps.push_back(graphed->step());
  });
  for (int i = 0; i < 5; ++i) eager_steps.push_back(eager->step());
  for (std::size_t i = 0; i < graph_steps.size(); ++i) {
    const double a = eager_steps[i].loss.value(), b = graph_steps[i].loss.value();
    EXPECT_NEAR(b, a, 1e-3 * a) << "step " << i + 1;
    if (i > 0) EXPECT_NE(b, graph_steps[i - 1].loss.value()) << "step " << i + 1 << " replayed the same batch";
  }
  // Steps 3 to 8, two micro-batches each, came from the graph; eager runs have no such count.
  EXPECT_EQ(graph_steps.back().extra.at("cuda_graph_replays"), 12.0);
  EXPECT_EQ(graph_steps[1].extra.at("cuda_graph_replays"), 0.0);
  EXPECT_EQ(eager_steps.back().extra.count("cuda_graph_replays"), 0u);
  EXPECT_LT(graph_steps.back().loss.value(), std::log(128.0));
#endif
}

// One NCCL rank on the GPU with fsdp's bf16 gather and reduce against the local strategy: the
// same bf16 run within bf16's rounding, master weights float32.
TEST(CudaStep, FsdpOverNcclWithBf16GatherAndReduceTrains) {
  SKIP_WITHOUT_GPU();
  if (!core::nccl_available()) GTEST_SKIP() << "this LibTorch has no NCCL";
  TempDir dir;
  const std::string data = token_file(dir);
  core::BuiltComponents local_built, fsdp_built;
  // No dropout: the two runs interleave their steps on one generator, so their masks would differ.
  const char* no_dropout = "dropout: 0.0, activation_checkpointing: true";
  auto local = make_gpu_trainer(local_built, spec(data, "", no_dropout), core::make_local_communicator());
  core::DistributedEnv env;
  env.world_size = 1;
  env.master_port = testing::free_loopback_port();
  auto nccl = core::make_nccl_communicator(env, std::chrono::seconds(60), c10::Device("cuda:0"));
  auto sharded = make_gpu_trainer(
      fsdp_built,
      spec(data, "parallel: {component_key: parallel, variant_key: fsdp, config: {param_dtype: bf16, reduce_dtype: bf16}}\n",
           no_dropout),
      nccl);
  for (int i = 0; i < 4; ++i) {
    const double a = local->step().loss.value(), b = sharded->step().loss.value();
    EXPECT_NEAR(b, a, 0.02 * a) << "step " << i + 1;
  }
  for (const auto& p : sharded->model().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16) << "gathered in bf16";
}

TEST(CudaStep, DdpOverNcclStepsMakeNoHostSynchronisation) {
  SKIP_WITHOUT_GPU();
  if (!core::nccl_available()) GTEST_SKIP() << "this LibTorch has no NCCL";
  TempDir dir;
  core::DistributedEnv env;
  env.world_size = 1;
  env.master_port = testing::free_loopback_port();
  auto nccl = core::make_nccl_communicator(env, std::chrono::seconds(60), c10::Device("cuda:0"));
  // The host group's own collectives first: host numbers come back reduced without a device copy.
  at::Tensor counts = at::tensor({3, 4, 5}, at::kLong);
  without_host_synchronisation([&] {
    nccl->all_reduce(counts);
    nccl->barrier();
  });
  EXPECT_TRUE(counts.equal(at::tensor({3, 4, 5}, at::kLong)));
  core::BuiltComponents built;
  auto trainer = make_gpu_trainer(built, spec(token_file(dir), "parallel: {component_key: parallel, variant_key: ddp, config: {}}\n"),
                                  nccl);
  for (int i = 0; i < 3; ++i) trainer->step();
  std::vector<StepMetrics> steps;
  without_host_synchronisation([&] {
    for (int i = 0; i < 5; ++i) steps.push_back(trainer->step());
  });
  for (const auto& m : steps) EXPECT_TRUE(std::isfinite(m.loss.value()));
  EXPECT_LT(steps.back().loss.value(), std::log(128.0));
}

// Waiting for an NCCL collective of device tensors orders the compute stream after it and
// returns: the host does not wait for the GPU, as it would with TORCH_NCCL_BLOCKING_WAIT=1 (which
// polls the work until it is done). What the stream runs next sees the result.
TEST(CudaStep, WaitingForAnNcclCollectiveDoesNotHoldTheHost) {
  SKIP_WITHOUT_GPU();
  if (!core::nccl_available()) GTEST_SKIP() << "this LibTorch has no NCCL";
  if (const char* blocking = std::getenv("TORCH_NCCL_BLOCKING_WAIT"); blocking && std::string(blocking) == "1") {
    GTEST_SKIP() << "TORCH_NCCL_BLOCKING_WAIT=1 is set: waits hold the host by request";
  }
#ifdef TESSERA_WITH_CUDA
  core::DistributedEnv env;
  env.world_size = 1;
  env.master_port = testing::free_loopback_port();
  auto nccl = core::make_nccl_communicator(env, std::chrono::seconds(60), c10::Device("cuda:0"));
  at::Tensor x = at::full({1024}, 2.0, at::TensorOptions().device("cuda:0"));
  nccl->all_reduce(x);  // the first collective sets NCCL's communicator up
  c10::cuda::device_synchronize();
  at::cuda::sleep(2'000'000'000);  // about a second of device time before the collective runs
  auto pending = nccl->all_reduce_async(x);
  pending->wait();
  EXPECT_FALSE(c10::cuda::getCurrentCUDAStream().query()) << "wait() held the host until the GPU had done the collective";
  EXPECT_TRUE(x.mul(3).cpu().equal(at::full({1024}, 6.0)));
  core::shut_down(*nccl);
#endif
}

#ifdef TESSERA_WITH_CUDA
class WarningCollector final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  bool mentions(const std::string& text) const {
    for (const auto& m : messages) {
      if (m.find(text) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> messages;
};
#endif

// A run that ended shuts its NCCL group down (core::shut_down, called by TrainingRun): the group
// destroys its communicators instead of its destructor aborting them with LibTorch's warning that
// destroy_process_group() was not called. The second group, never shut down, shows that the
// warning would have been seen (LibTorch gives it once per process: WarnAlways makes it every
// time, so the test holds after other tests' groups in the same process).
TEST(CudaStep, AnNcclGroupShutDownAtTheEndIsNotAbortedByItsDestructor) {
  SKIP_WITHOUT_GPU();
  if (!core::nccl_available()) GTEST_SKIP() << "this LibTorch has no NCCL";
#ifdef TESSERA_WITH_CUDA
  WarningCollector warnings;
  c10::WarningUtils::WarningHandlerGuard collecting(&warnings);
  c10::WarningUtils::WarnAlways every_time(true);
  auto one_collective = [](bool shut) {
    core::DistributedEnv env;
    env.world_size = 1;
    env.master_port = testing::free_loopback_port();
    auto nccl = core::make_nccl_communicator(env, std::chrono::seconds(60), c10::Device("cuda:0"));
    at::Tensor x = at::full({16}, 1.0, at::TensorOptions().device("cuda:0"));
    nccl->all_reduce(x);
    if (shut) core::shut_down(*nccl);
  };
  one_collective(/*shut=*/true);
  EXPECT_FALSE(warnings.mentions("destroy_process_group")) << "the group shut down was still aborted at destruction";
  one_collective(/*shut=*/false);
  EXPECT_TRUE(warnings.mentions("destroy_process_group"))
      << "LibTorch no longer warns about a group destroyed without a shut down: the check above sees nothing";
#endif
}

}  // namespace cuda_step_test
}  // namespace tessera
