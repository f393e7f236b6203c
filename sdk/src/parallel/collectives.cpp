// The autograd collectives of tessera/parallel/collectives.hpp: each a custom function holding
// its group in a capsule for the backward pass.
#include "tessera/parallel/collectives.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/error.hpp"

namespace tessera::collectives {
namespace {

struct Group : torch::CustomClassHolder {
  explicit Group(std::shared_ptr<Communicator> g, std::int64_t d = 0) : group(std::move(g)), dim(d) {}
  std::shared_ptr<Communicator> group;
  std::int64_t dim;
};

std::int64_t wrap_dim(const at::Tensor& x, std::int64_t dim) { return dim < 0 ? dim + x.dim() : dim; }

void check_divides(const at::Tensor& x, std::int64_t dim, Communicator& group, const char* what) {
  if (x.size(dim) % group.world_size() != 0) {
    throw Error(std::string("collectives::") + what + ": dimension " + std::to_string(dim) + " has size " +
                std::to_string(x.size(dim)) + ", not divisible by the group's " + std::to_string(group.world_size()) +
                " ranks");
  }
}

at::Tensor all_reduced(const at::Tensor& x, Communicator& group) {
  at::Tensor out = x.contiguous().clone();
  group.all_reduce(out);
  return out;
}

at::Tensor chunk_of(const at::Tensor& x, std::int64_t dim, Communicator& group) {
  check_divides(x, dim, group, "split");
  return x.chunk(group.world_size(), dim)[group.rank()].contiguous();
}

c10::intrusive_ptr<Group> capsule_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Group>(ctx->saved_data["group"].toCapsule());
}

void keep(torch::autograd::AutogradContext* ctx, const std::shared_ptr<Communicator>& group, std::int64_t dim) {
  ctx->saved_data["group"] = at::IValue::make_capsule(c10::make_intrusive<Group>(group, dim));
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::shared_ptr<Communicator> g) {
    keep(ctx, g, 0);
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_reduced(grads[0], *capsule_of(ctx)->group), at::Tensor()};
  }
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, std::shared_ptr<Communicator> g) {
    return all_reduced(x, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct SplitTo : torch::autograd::Function<SplitTo> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t dim,
                            std::shared_ptr<Communicator> g) {
    keep(ctx, g, dim);
    return chunk_of(x, dim, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    return {all_gather_along(grads[0], c->dim, *c->group), at::Tensor(), at::Tensor()};
  }
};

struct GatherFrom : torch::autograd::Function<GatherFrom> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t dim,
                            std::shared_ptr<Communicator> g) {
    keep(ctx, g, dim);
    return all_gather_along(x, dim, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    return {chunk_of(grads[0], c->dim, *c->group), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterTo : torch::autograd::Function<ReduceScatterTo> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t dim,
                            std::shared_ptr<Communicator> g) {
    keep(ctx, g, dim);
    return reduce_scatter_along(x, dim, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    return {all_gather_along(grads[0], c->dim, *c->group), at::Tensor(), at::Tensor()};
  }
};

struct AllGatherFrom : torch::autograd::Function<AllGatherFrom> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t dim,
                            std::shared_ptr<Communicator> g) {
    keep(ctx, g, dim);
    return all_gather_along(x, dim, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    return {reduce_scatter_along(grads[0], c->dim, *c->group), at::Tensor(), at::Tensor()};
  }
};

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t scatter_dim,
                            std::int64_t gather_dim, std::shared_ptr<Communicator> g) {
    keep(ctx, g, scatter_dim);
    ctx->saved_data["gather_dim"] = gather_dim;
    return all_to_all_along(x, scatter_dim, gather_dim, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    const std::int64_t gather_dim = ctx->saved_data["gather_dim"].toInt();
    return {all_to_all_along(grads[0], gather_dim, c->dim, *c->group), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Uneven rows: rows.split(send) to the ranks, the pieces received joined; the inverse backward.
at::Tensor exchange_rows(const at::Tensor& rows, const std::vector<std::int64_t>& send,
                         const std::vector<std::int64_t>& recv, Communicator& group) {
  std::vector<at::Tensor> inputs, outputs;
  std::int64_t offset = 0;
  for (std::size_t r = 0; r < send.size(); ++r) {
    inputs.push_back(rows.narrow(0, offset, send[r]).contiguous());
    offset += send[r];
  }
  std::vector<std::int64_t> shape = rows.sizes().vec();
  for (std::size_t r = 0; r < recv.size(); ++r) {
    shape[0] = recv[r];
    outputs.push_back(at::empty(shape, rows.options()));
  }
  group.all_to_all(outputs, inputs);
  return at::cat(outputs, 0);
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows, std::vector<std::int64_t> send,
                            std::vector<std::int64_t> recv, std::shared_ptr<Communicator> g) {
    keep(ctx, g, 0);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange_rows(rows, send, recv, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto c = capsule_of(ctx);
    const auto send = ctx->saved_data["send"].toIntVector(), recv = ctx->saved_data["recv"].toIntVector();
    return {exchange_rows(grads[0].contiguous(), recv, send, *c->group), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool alone(const std::shared_ptr<Communicator>& group) { return !group || group->world_size() == 1; }

}  // namespace

at::Tensor all_gather_along(const at::Tensor& x, std::int64_t dim, Communicator& group) {
  if (group.world_size() == 1) return x;
  dim = wrap_dim(x, dim);
  const at::Tensor input = x.contiguous();
  std::vector<at::Tensor> parts;
  for (std::int64_t r = 0; r < group.world_size(); ++r) parts.push_back(at::empty_like(input));
  group.all_gather(parts, input);
  return at::cat(parts, dim);
}

std::vector<at::Tensor> all_gather_uneven(const at::Tensor& x, Communicator& group, const c10::Device& device) {
  if (x.dim() != 1) throw Error("all_gather_uneven: a 1-D tensor, not " + std::to_string(x.dim()) + "-D");
  const at::Tensor length = at::tensor({x.numel()}, at::kLong).to(device);
  std::vector<at::Tensor> lengths;
  for (std::int64_t r = 0; r < group.world_size(); ++r) lengths.push_back(at::empty_like(length));
  group.all_gather(lengths, length);
  std::vector<std::int64_t> sizes;
  for (const at::Tensor& l : lengths) sizes.push_back(l.item<std::int64_t>());
  // One element at least: a collective of empty tensors is not every backend's.
  const std::int64_t longest = std::max<std::int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  at::Tensor padded = at::zeros({longest}, x.options().device(at::kCPU));
  padded.narrow(0, 0, x.numel()).copy_(x);
  padded = padded.to(device);
  std::vector<at::Tensor> all;
  for (std::int64_t r = 0; r < group.world_size(); ++r) all.push_back(at::empty_like(padded));
  group.all_gather(all, padded);
  std::vector<at::Tensor> out;
  for (std::size_t r = 0; r < all.size(); ++r) out.push_back(all[r].narrow(0, 0, sizes[r]).to(at::kCPU));
  return out;
}

at::Tensor reduce_scatter_along(const at::Tensor& x, std::int64_t dim, Communicator& group) {
  if (group.world_size() == 1) return x;
  dim = wrap_dim(x, dim);
  check_divides(x, dim, group, "reduce_scatter");
  std::vector<at::Tensor> chunks;
  for (const at::Tensor& c : x.chunk(group.world_size(), dim)) chunks.push_back(c.contiguous());
  at::Tensor out = at::empty_like(chunks.front());
  group.reduce_scatter(out, chunks);
  return out;
}

at::Tensor all_to_all_along(const at::Tensor& x, std::int64_t scatter_dim, std::int64_t gather_dim,
                            Communicator& group) {
  if (group.world_size() == 1) return x;
  scatter_dim = wrap_dim(x, scatter_dim);
  gather_dim = wrap_dim(x, gather_dim);
  check_divides(x, scatter_dim, group, "all_to_all");
  std::vector<at::Tensor> inputs, outputs;
  for (const at::Tensor& c : x.chunk(group.world_size(), scatter_dim)) {
    inputs.push_back(c.contiguous());
    outputs.push_back(at::empty_like(inputs.back()));  // every rank sends chunks of one shape
  }
  group.all_to_all(outputs, inputs);
  return at::cat(outputs, gather_dim);
}

at::Tensor all_to_all(const at::Tensor& x, std::int64_t scatter_dim, std::int64_t gather_dim,
                      const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : AllToAll::apply(x, wrap_dim(x, scatter_dim), wrap_dim(x, gather_dim), group);
}

at::Tensor all_to_all_rows(const at::Tensor& rows, const std::vector<std::int64_t>& send_rows,
                           const std::vector<std::int64_t>& recv_rows, const std::shared_ptr<Communicator>& group) {
  if (alone(group)) return rows;
  return AllToAllRows::apply(rows, send_rows, recv_rows, group);
}

at::Tensor copy_to(const at::Tensor& x, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : CopyTo::apply(x, group);
}
at::Tensor reduce_from(const at::Tensor& x, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : ReduceFrom::apply(x, group);
}
at::Tensor split_to(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : SplitTo::apply(x, wrap_dim(x, dim), group);
}
at::Tensor gather_from(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : GatherFrom::apply(x, wrap_dim(x, dim), group);
}
at::Tensor reduce_scatter_to(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : ReduceScatterTo::apply(x, wrap_dim(x, dim), group);
}
at::Tensor all_gather_from(const at::Tensor& x, std::int64_t dim, const std::shared_ptr<Communicator>& group) {
  return alone(group) ? x : AllGatherFrom::apply(x, wrap_dim(x, dim), group);
}

}  // namespace tessera::collectives
