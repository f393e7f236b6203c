// Moving a StateDict between ranks: how the pipeline stages' parts of a model come together on
// rank 0 for a checkpoint or an export (each stage holds its own blocks' parameters).
#include "tessera/parallel/placement.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/error.hpp"

namespace tessera {

namespace {

// One message: a header line per tensor (name, dtype, sizes) and their bytes back to back.
struct Packed {
  at::Tensor header, data;  // uint8
};

at::Tensor bytes_of(const std::string& text) {
  at::Tensor out = at::empty({static_cast<std::int64_t>(text.size())}, at::kByte);
  if (!text.empty()) std::memcpy(out.data_ptr(), text.data(), text.size());
  return out;
}

Packed pack(const StateDict& state) {
  std::ostringstream header;
  std::int64_t total = 0;
  for (const auto& [name, t] : state) {
    header << name << '\t' << static_cast<int>(t.scalar_type()) << '\t' << t.dim();
    for (const auto d : t.sizes()) header << '\t' << d;
    header << '\n';
    total += static_cast<std::int64_t>(t.nbytes());
  }
  Packed p{bytes_of(header.str()), at::empty({total}, at::kByte)};
  auto* out = static_cast<char*>(p.data.data_ptr());
  for (const auto& [name, t] : state) {
    const at::Tensor c = t.contiguous().cpu();
    if (c.nbytes() > 0) std::memcpy(out, c.data_ptr(), c.nbytes());
    out += c.nbytes();
  }
  return p;
}

StateDict unpack(const at::Tensor& header, const at::Tensor& data) {
  StateDict state;
  std::istringstream lines(std::string(static_cast<const char*>(header.data_ptr()), static_cast<std::size_t>(header.numel())));
  const auto* in = static_cast<const char*>(data.data_ptr());
  std::int64_t offset = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name;
    int dtype = 0;
    std::int64_t dims = 0;
    std::getline(fields, name, '\t');
    fields >> dtype >> dims;
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(dims));
    for (auto& d : sizes) fields >> d;
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)));
    if (offset + static_cast<std::int64_t>(t.nbytes()) > data.numel()) throw Error("gather_state_dicts: a short message");
    if (t.nbytes() > 0) std::memcpy(t.data_ptr(), in + offset, t.nbytes());
    offset += static_cast<std::int64_t>(t.nbytes());
    state[name] = std::move(t);
  }
  return state;
}

// A stage's whole state in pieces the host group carries (an NCCL run's Gloo group): one
// message of it would be staged whole onto the GPU of both ranks.
void send_in_pieces(Communicator& group, const at::Tensor& bytes, std::int64_t to, int tag) {
  for (std::int64_t offset = 0; offset < bytes.numel(); offset += kHostGroupMaxBytes) {
    at::Tensor piece = bytes.narrow(0, offset, std::min(kHostGroupMaxBytes, bytes.numel() - offset));
    group.send_async(piece, to, tag)->wait();
  }
}

void receive_in_pieces(Communicator& group, at::Tensor& bytes, std::int64_t from, int tag) {
  for (std::int64_t offset = 0; offset < bytes.numel(); offset += kHostGroupMaxBytes) {
    at::Tensor piece = at::empty({std::min(kHostGroupMaxBytes, bytes.numel() - offset)}, at::kByte);
    group.recv_async(piece, from, tag)->wait();
    bytes.narrow(0, offset, piece.numel()).copy_(piece);
  }
}

}  // namespace

StateDict gather_state_dicts(const StateDict& local, Communicator& group) {
  if (group.world_size() == 1) return local;
  if (group.rank() != 0) {
    Packed p = pack(local);
    at::Tensor sizes = at::tensor({p.header.numel(), p.data.numel()}, at::kLong);
    group.send_async(sizes, 0, 1)->wait();
    send_in_pieces(group, p.header, 0, 2);
    send_in_pieces(group, p.data, 0, 3);
    return {};
  }
  StateDict whole = local;
  for (std::int64_t r = 1; r < group.world_size(); ++r) {
    at::Tensor sizes = at::empty({2}, at::kLong);
    group.recv_async(sizes, r, 1)->wait();
    at::Tensor header = at::empty({sizes[0].item<std::int64_t>()}, at::kByte);
    at::Tensor data = at::empty({sizes[1].item<std::int64_t>()}, at::kByte);
    receive_in_pieces(group, header, r, 2);
    receive_in_pieces(group, data, r, 3);
    for (auto& [name, t] : unpack(header, data)) whole.emplace(name, std::move(t));  // the lower rank's stays
  }
  return whole;
}

}  // namespace tessera
