// Communication inside a model's forward pass, as autograd functions whose backward is the
// collective that keeps gradients right (Megatron-LM's mappings). All model parallelism is built
// from these; `group` is one of the run's mesh groups (DeviceMesh::tensor_parallel(), ...), and
// with a group of one rank every function returns its input.
//
//   function            forward                      backward
//   copy_to             identity                     all-reduce (sum)
//   reduce_from         all-reduce (sum)             identity
//   split_to            this rank's chunk of dim     all-gather along dim
//   gather_from         all-gather along dim         this rank's chunk of the gradient
//   reduce_scatter_to   reduce-scatter along dim     all-gather along dim
//   all_gather_from     all-gather along dim         reduce-scatter along dim
//   all_to_all          chunk j of scatter_dim to    the inverse all-to-all
//                       rank j, received pieces
//                       joined along gather_dim
//
// Chunks along `dim` are equal: the size of `dim` must divide by the group's size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/export.hpp"

namespace tessera::collectives {

TESSERA_API at::Tensor copy_to(const at::Tensor& x, const std::shared_ptr<Communicator>& group);
TESSERA_API at::Tensor reduce_from(const at::Tensor& x, const std::shared_ptr<Communicator>& group);
TESSERA_API at::Tensor split_to(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group);
TESSERA_API at::Tensor gather_from(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group);
TESSERA_API at::Tensor reduce_scatter_to(const at::Tensor& x, std::int64_t dim,
                                         const std::shared_ptr<Communicator>& group);
TESSERA_API at::Tensor all_gather_from(const at::Tensor& x, std::int64_t dim,
                                       const std::shared_ptr<Communicator>& group);

TESSERA_API at::Tensor all_to_all(const at::Tensor& x, std::int64_t scatter_dim, std::int64_t gather_dim,
                                  const std::shared_ptr<Communicator>& group);

// Rows of `rows` sent to each rank (send_rows[r] of them to rank r, in rank order), the rows
// every rank sends this one received (recv_rows[r] from rank r, in rank order): an all-to-all of
// uneven parts (an MoE's tokens to their experts). The gradient goes back the same way.
TESSERA_API at::Tensor all_to_all_rows(const at::Tensor& rows, const std::vector<std::int64_t>& send_rows,
                                       const std::vector<std::int64_t>& recv_rows,
                                       const std::shared_ptr<Communicator>& group);

// The same collectives on plain tensors (no autograd): the whole of `x` gathered along `dim`, and
// the sum over the group scattered along `dim`.
TESSERA_API at::Tensor all_gather_along(const at::Tensor& x, std::int64_t dim, Communicator& group);
TESSERA_API at::Tensor reduce_scatter_along(const at::Tensor& x, std::int64_t dim, Communicator& group);
TESSERA_API at::Tensor all_to_all_along(const at::Tensor& x, std::int64_t scatter_dim, std::int64_t gather_dim,
                                        Communicator& group);
// Every rank's 1-D `x` of its own length (one dtype on every rank), in rank order, on the host:
// the lengths gathered first, then the tensors padded to the longest. For host data a run moves
// now and then (rows of text, packed results), travelling on `device` as the group's tensors do.
TESSERA_API std::vector<at::Tensor> all_gather_uneven(const at::Tensor& x, Communicator& group, const c10::Device& device);

}  // namespace tessera::collectives
