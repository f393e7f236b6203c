// How a component reaches the other ranks of a run (or of one group of its device mesh,
// tessera/parallel/device_mesh.hpp): its rank, the group's size and the collectives data and
// model parallelism need. The host backs it with LibTorch's c10d (Gloo on CPU, NCCL on
// CUDA); a run of one process gets a communicator whose collectives return at once. Plugins
// never see c10d.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

enum class ReduceOp { sum, max, min };

// A collective that has been started. Its tensors must stay alive and untouched until wait()
// returns; wait() throws when the collective failed or the run's collective timeout expired.
// For GPU tensors under NCCL, wait() orders the current CUDA stream after the collective and
// returns without waiting for the GPU: work queued on that stream afterwards sees the result (a
// failure there is reported by the run's next host collective, docs/distributed.md).
class TESSERA_API PendingCollective {
 public:
  virtual ~PendingCollective();
  virtual void wait() = 0;
};

// The most bytes a collective an NCCL run hands to its Gloo group carries (host tensors): larger
// messages travel in pieces of this size, or on the device.
inline constexpr std::int64_t kHostGroupMaxBytes = 1 << 20;

class TESSERA_API Communicator {
 public:
  virtual ~Communicator();
  virtual std::int64_t rank() const = 0;
  virtual std::int64_t world_size() const = 0;

  // Started collectives run in the background (overlapping computation) and complete in the
  // order started. Every rank must start the same collectives in the same order.
  // In place: every rank ends with the reduction of all ranks' tensors.
  virtual std::shared_ptr<PendingCollective> all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // outputs[r] receives rank r's input; all inputs have one shape.
  virtual std::shared_ptr<PendingCollective> all_gather_async(std::vector<at::Tensor>& outputs,
                                                              const at::Tensor& input) = 0;
  // Rank r's output receives the reduction over ranks of their inputs[r].
  virtual std::shared_ptr<PendingCollective> reduce_scatter_async(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                                  ReduceOp op = ReduceOp::sum) = 0;
  // outputs[r] receives rank r's inputs[this rank]: every rank sends inputs[r] to rank r. Sizes
  // may differ per pair (an MoE's tokens per expert), but outputs[r] must have the shape of what
  // rank r sends this one. One tensor per rank in each list.
  virtual std::shared_ptr<PendingCollective> all_to_all_async(std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs) = 0;
  // Point to point with rank `peer` of this communicator: a send is matched by the peer's
  // receive with the same tag, in order. Not a collective: only the two ranks take part.
  virtual std::shared_ptr<PendingCollective> send_async(at::Tensor& tensor, std::int64_t peer, int tag = 0) = 0;
  virtual std::shared_ptr<PendingCollective> recv_async(at::Tensor& tensor, std::int64_t peer, int tag = 0) = 0;
  virtual void broadcast(at::Tensor& tensor, std::int64_t root) = 0;
  virtual void barrier() = 0;
  // Seconds this process has spent blocked waiting for collectives to finish (the part of
  // communication not hidden behind computation), since the communicator was made.
  virtual double wait_seconds() const { return 0; }
  // Payload bytes of the collectives and sends this process started here, since the
  // communicator was made: each collective's tensor bytes (an all-reduce's buffer, an
  // all-gather's whole output, a reduce-scatter's whole input; what travels over the wire is
  // about 2 (n - 1) / n of that for a ring all-reduce, (n - 1) / n for the others).
  virtual std::int64_t bytes_communicated() const { return 0; }

  // The same collectives, waited for.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum);
  void all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input);
  void reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, ReduceOp op = ReduceOp::sum);
  void all_to_all(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs);
};

// A communicator of one rank: collectives return at once (all_gather and reduce_scatter copy,
// all_to_all copies its one tensor); point to point has no peer and throws.
TESSERA_API std::shared_ptr<Communicator> make_single_rank_communicator();

}  // namespace tessera
