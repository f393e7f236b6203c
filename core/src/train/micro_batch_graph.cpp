// The CUDA side of trainer.cuda_graph. Without CUDA in LibTorch the graph cannot be made and
// says so; MicroBatchInputs serves the eager step on every device.
#include "tessera/core/train/micro_batch_graph.hpp"

#include <ATen/ops/scalar_tensor.h>

#include <exception>
#include <string>
#include <utility>

#include "tessera/error.hpp"
#include "tessera/log.hpp"

#ifdef TESSERA_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/util/Exception.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#endif

namespace tessera::core {
MicroBatchInputs MicroBatchInputs::copied_to(const c10::Device& device, const Batch& batch, double inv_tokens) {
  MicroBatchInputs in;
  in.input_ids = batch.input_ids.to(device, /*non_blocking=*/true);
  in.labels = batch.labels.to(device, /*non_blocking=*/true);
  if (batch.document_ids.defined()) in.document_ids = batch.document_ids.to(device, /*non_blocking=*/true);
  in.inv_tokens = at::scalar_tensor(inv_tokens, at::TensorOptions().dtype(at::kFloat).device(device));
  return in;
}

#ifdef TESSERA_WITH_CUDA

namespace {

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type()));
}

}  // namespace

struct MicroBatchGraph::Impl {
  explicit Impl(const c10::Device& d)
      : device(d.has_index() ? d : c10::Device(c10::kCUDA, c10::cuda::current_device())),
        stream(at::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())),
        caller(at::cuda::getCurrentCUDAStream(device.index())) {}

  // The step's micro-batches start after the caller's queued work and end before its next.
  void enter() {
    caller = at::cuda::getCurrentCUDAStream(device.index());
    ready.record(caller);
    ready.block(stream);
    on_stream.emplace(stream);
  }
  void leave() {
    on_stream.reset();
    done.record(stream);
    done.block(caller);
  }

  bool matches(const Batch& batch) const {
    return same_layout(inputs.input_ids, batch.input_ids) && same_layout(inputs.labels, batch.labels) &&
           same_layout(inputs.document_ids, batch.document_ids);
  }

  at::Tensor capture(const Batch& batch, double inv_tokens, const Body& body) {
    inputs = MicroBatchInputs::copied_to(device, batch, inv_tokens);  // before the capture: fixed addresses
    graph = std::make_unique<at::cuda::CUDAGraph>();
    // Autocast's cache of casted weights would hand the capture's casts to later eager code;
    // inside the graph every cast is recomputed at each replay anyway.
    const bool autocast_cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      // Thread-local mode: the prefetching thread may pin host memory meanwhile, which the global
      // mode would forbid to every thread of the process.
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        loss = body(inputs);
      } catch (...) {
        try {
          graph->capture_end();  // leaves capture mode; fails as the capture is invalid
        } catch (...) {
        }
        throw;
      }
      graph->capture_end();
    } catch (const c10::Error& e) {  // LibTorch's own (capture_begin/end): without its C++ backtrace
      abandon_capture(autocast_cache, e.what_without_backtrace());
    } catch (const std::exception& e) {  // the body's faults come named (in_component)
      abandon_capture(autocast_cache, e.what());
    }
    at::autocast::set_autocast_cache_enabled(autocast_cache);
    graph->replay();  // a capture records the work without running it
    return loss;
  }

  [[noreturn]] void abandon_capture(bool autocast_cache, const std::string& why) {
    at::autocast::set_autocast_cache_enabled(autocast_cache);
    graph.reset();
    loss = at::Tensor();
    inputs = MicroBatchInputs{};
    throw Error("trainer.cuda_graph: capturing the forward and backward of a micro-batch failed: " + why +
                ". Everything in them must run on the GPU without waiting for the host (no .item(), no "
                "data-dependent shapes: gpt_moe's routing and activation checkpointing's generator state do); "
                "set trainer.cuda_graph: false for this model");
  }

  at::Tensor replay(const Batch& batch, double inv_tokens) {
    inputs.input_ids.copy_(batch.input_ids, /*non_blocking=*/true);
    inputs.labels.copy_(batch.labels, /*non_blocking=*/true);
    if (batch.document_ids.defined()) inputs.document_ids.copy_(batch.document_ids, /*non_blocking=*/true);
    inputs.inv_tokens.fill_(inv_tokens);
    graph->replay();
    return loss;
  }

  c10::Device device;
  at::cuda::CUDAStream stream, caller;
  at::cuda::CUDAEvent ready, done;
  std::optional<c10::cuda::CUDAStreamGuard> on_stream;  // while a step's micro-batches run
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  MicroBatchInputs inputs;  // what the graph reads
  at::Tensor loss;          // what it writes: the micro-batch's summed loss
};

at::Tensor MicroBatchGraph::run(const Batch& batch, double inv_tokens, const Body& body) {
  const bool warming_up = steps_begun_ <= warmup_steps_;
  if (!warming_up && !impl_->graph) {
    ++replays_;
    return impl_->capture(batch, inv_tokens, body);
  }
  if (warming_up || !impl_->matches(batch)) {
    if (!warming_up && !warned_shapes_) {
      log::info("trainer.cuda_graph: a micro-batch of shape ", c10::str(batch.input_ids.sizes()),
                " differs from the captured ", c10::str(impl_->inputs.input_ids.sizes()),
                " (or in its labels or document ids); such micro-batches run eagerly");
      warned_shapes_ = true;
    }
    return body(MicroBatchInputs::copied_to(impl_->device, batch, inv_tokens));
  }
  ++replays_;
  return impl_->replay(batch, inv_tokens);
}

MicroBatchGraph::StepScope::StepScope(MicroBatchGraph& graph) : graph_(graph) {
  ++graph_.steps_begun_;
  graph_.impl_->enter();
}

MicroBatchGraph::StepScope::~StepScope() { graph_.impl_->leave(); }

#else  // LibTorch without CUDA

struct MicroBatchGraph::Impl {};

// Unreachable: the constructor throws without CUDA.
at::Tensor MicroBatchGraph::run(const Batch&, double, const Body&) { return {}; }
MicroBatchGraph::StepScope::StepScope(MicroBatchGraph& graph) : graph_(graph) {}
MicroBatchGraph::StepScope::~StepScope() = default;

#endif

MicroBatchGraph::MicroBatchGraph(const c10::Device& device, std::int64_t warmup_steps) : warmup_steps_(warmup_steps) {
  if (!device.is_cuda()) {
    throw Error("trainer.cuda_graph: needs a CUDA device (settings.device: cuda), not " + device.str());
  }
#ifdef TESSERA_WITH_CUDA
  impl_ = std::make_unique<Impl>(device);
#else
  throw Error("trainer.cuda_graph: this build's LibTorch has no CUDA; set trainer.cuda_graph: false");
#endif
}

MicroBatchGraph::~MicroBatchGraph() = default;

}  // namespace tessera::core
