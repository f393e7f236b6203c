#include "tessera/run/metric_value.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <mutex>
#include <optional>

namespace tessera {

struct AsyncValues::Impl {
  at::Tensor host;                 // float64 on the host (pinned when the values were on a GPU)
  std::optional<c10::Event> done;  // recorded after the copy on the device's current stream
  mutable std::once_flag waited;
};

AsyncValues::AsyncValues(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AsyncValues::~AsyncValues() = default;

std::shared_ptr<const AsyncValues> AsyncValues::copy_of(const at::Tensor& values) {
  auto impl = std::make_unique<Impl>();
  const at::Tensor flat = values.reshape({-1});
  if (flat.device().is_cpu()) {
    impl->host = flat.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  } else {
    // Converted on the device, then one small copy into page-locked memory that the host does
    // not wait for; the event says when it has landed.
    const at::Tensor on_device = flat.to(at::kDouble);
    impl->host = at::empty({flat.numel()}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    impl->host.copy_(on_device, /*non_blocking=*/true);
    const c10::impl::VirtualGuardImpl guard(flat.device().type());
    impl->done.emplace(flat.device().type());
    impl->done->record(guard.getStream(flat.device()));
  }
  return std::shared_ptr<const AsyncValues>(new AsyncValues(std::move(impl)));
}

bool AsyncValues::ready() const { return !impl_->done || impl_->done->query(); }

double AsyncValues::at(std::size_t i) const {
  std::call_once(impl_->waited, [&] {
    if (impl_->done) impl_->done->synchronize();
  });
  return impl_->host.data_ptr<double>()[i];
}

}  // namespace tessera
