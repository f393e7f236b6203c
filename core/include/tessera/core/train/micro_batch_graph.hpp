// trainer.cuda_graph: the forward and backward of one micro-batch, captured once in a CUDA graph
// and replayed for every later micro-batch of the same shapes, so the host launches one graph
// where eager execution launches hundreds of kernels. The rest of the step (the reductions,
// clipping, the fused optimizer, the callbacks and the host's decisions) stays eager.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "tessera/run/batch.hpp"

namespace tessera::core {

// What one micro-batch reads on the device: its batch and the loss scale of the step.
struct MicroBatchInputs {
  at::Tensor input_ids, labels;
  at::Tensor document_ids;  // undefined when the batch has none
  at::Tensor inv_tokens;    // float32 scalar: 1 / the target tokens of the whole step

  // The batch copied to `device` (non-blocking from pinned memory) and the scale made there.
  static MicroBatchInputs copied_to(const c10::Device& device, const Batch& batch, double inv_tokens);
};

class MicroBatchGraph {
 public:
  // Forward, loss and backward of one micro-batch (gradients accumulate into the parameters'
  // .grad, which must exist and stay in place: zero them, never reset them); returns the
  // micro-batch's summed loss, detached. Must not synchronise with the host.
  using Body = std::function<at::Tensor(const MicroBatchInputs&)>;

  // `warmup_steps`: steps run eagerly (on the graph's stream) before the capture, so lazy
  // initialisation (cuBLAS workspaces, kernels' first calls, gradients) happens outside it.
  // Throws when this LibTorch has no CUDA or `device` is not a CUDA device.
  MicroBatchGraph(const c10::Device& device, std::int64_t warmup_steps);
  ~MicroBatchGraph();
  MicroBatchGraph(const MicroBatchGraph&) = delete;
  MicroBatchGraph& operator=(const MicroBatchGraph&) = delete;

  // The micro-batches of one step run on the graph's own stream (a capture must be off the
  // default stream, and warm-up must happen where the capture will); the caller's stream waits
  // for them when the scope ends.
  class StepScope {
   public:
    explicit StepScope(MicroBatchGraph& graph);
    ~StepScope();
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;

   private:
    MicroBatchGraph& graph_;
  };

  // One micro-batch: eagerly during warm-up and for batches whose shapes differ from the
  // captured ones; otherwise the batch is copied into the graph's inputs and the graph replayed
  // (captured first, at the first micro-batch after warm-up). Returns the summed loss; a
  // replay's is the graph's own output, overwritten by the next replay.
  at::Tensor run(const Batch& batch, double inv_tokens, const Body& body);

  // Micro-batches replayed from the graph so far (the capture's own run included).
  std::int64_t replays() const { return replays_; }

 private:
  struct Impl;  // the CUDA side (micro_batch_graph.cpp)
  std::unique_ptr<Impl> impl_;
  std::int64_t warmup_steps_;
  std::int64_t steps_begun_ = 0;
  std::int64_t replays_ = 0;
  bool warned_shapes_ = false;
};

}  // namespace tessera::core
