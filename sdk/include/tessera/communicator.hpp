// How a component reaches the other ranks of a run: its rank, the world size and the collectives
// data-parallel training needs. The host backs it with LibTorch's c10d (Gloo on CPU); a run of
// one process gets a communicator whose collectives return at once. Plugins never see c10d.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/export.hpp"

namespace tessera {

enum class ReduceOp { sum, max, min };

class TESSERA_API Communicator {
 public:
  virtual ~Communicator();
  virtual std::int64_t rank() const = 0;
  virtual std::int64_t world_size() const = 0;

  // Every collective blocks until it is done (or the run's collective timeout expires, which
  // throws). In place: every rank ends with the reduction of all ranks' tensors.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // outputs[r] receives rank r's input; all inputs have one shape.
  virtual void all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) = 0;
  // Rank r's output receives the reduction over ranks of their inputs[r].
  virtual void reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs,
                              ReduceOp op = ReduceOp::sum) = 0;
  virtual void broadcast(at::Tensor& tensor, std::int64_t root) = 0;
  virtual void barrier() = 0;
};

}  // namespace tessera
