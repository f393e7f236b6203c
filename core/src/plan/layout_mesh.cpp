// A device mesh for planning: every group is a communicator that knows this rank's place and the
// group's size (all a model reads while it is built) and throws if asked to move data.
#include <string>

#include "plan_parts.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/error.hpp"

namespace tessera::core::plan {
namespace {

class LayoutCommunicator final : public Communicator {
 public:
  LayoutCommunicator(std::int64_t rank, std::int64_t size) : rank_(rank), size_(size) {}
  std::int64_t rank() const override { return rank_; }
  std::int64_t world_size() const override { return size_; }
  std::shared_ptr<PendingCollective> all_reduce_async(at::Tensor&, ReduceOp) override { return refuse(); }
  std::shared_ptr<PendingCollective> all_gather_async(std::vector<at::Tensor>&, const at::Tensor&) override {
    return refuse();
  }
  std::shared_ptr<PendingCollective> reduce_scatter_async(at::Tensor&, std::vector<at::Tensor>&, ReduceOp) override {
    return refuse();
  }
  std::shared_ptr<PendingCollective> all_to_all_async(std::vector<at::Tensor>&, std::vector<at::Tensor>&) override {
    return refuse();
  }
  std::shared_ptr<PendingCollective> send_async(at::Tensor&, std::int64_t, int) override { return refuse(); }
  std::shared_ptr<PendingCollective> recv_async(at::Tensor&, std::int64_t, int) override { return refuse(); }
  void broadcast(at::Tensor&, std::int64_t) override { refuse(); }
  void barrier() override { refuse(); }

 private:
  [[noreturn]] std::shared_ptr<PendingCollective> refuse() const {
    throw Error("tessera plan: a component moved data while it was built for planning (a mesh of " +
                std::to_string(size_) + " ranks that does not exist); plan needs models that build without collectives");
  }
  std::int64_t rank_;
  std::int64_t size_;
};

}  // namespace

std::shared_ptr<DeviceMesh> make_layout_mesh(const ParallelDims& dims, std::int64_t rank) {
  auto world = std::make_shared<LayoutCommunicator>(rank, dims.world_size());
  return make_device_mesh(world, dims, [rank](const std::string&, const std::vector<std::int64_t>& members) {
    std::int64_t place = 0;
    while (place < static_cast<std::int64_t>(members.size()) && members[place] != rank) ++place;
    return std::make_shared<LayoutCommunicator>(place, static_cast<std::int64_t>(members.size()));
  });
}

}  // namespace tessera::core::plan
