// FlatUnit directly (compiled into the unit tests): parameters still on the meta device (a model
// that defers its initialisation) and parameters with storage (an adapter's) in one fsdp unit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "flat_unit.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/nn/deferred_init.hpp"

namespace tessera_plugins {
namespace flat_unit_test {

TEST(FlatUnit, DeferredAndMaterialisedParametersShareAUnit) {
  const auto comm = tessera::core::make_local_communicator();
  at::Tensor deferred_param;
  {
    tessera::DeferredInitScope scope;
    deferred_param = tessera::new_parameter({3});
  }
  ASSERT_TRUE(deferred_param.is_meta());
  const at::Tensor own = at::full({2}, 5.0);
  std::vector<at::Tensor> initialised;
  DeferredUnitInit init;
  init.initialize = [&](const std::vector<at::Tensor>& params) {
    initialised = params;
    for (const auto& p : params) p.fill_(7.0);
  };
  FlatUnit unit({deferred_param, own}, *comm, GradReduction::reduce_scatter_each, /*shard_parameters=*/true, {}, &init);
  ASSERT_EQ(initialised.size(), 1u) << "only the deferred parameter is the model's to initialise";
  EXPECT_TRUE(initialised[0].is_same(deferred_param));
  unit.gather();
  EXPECT_TRUE(at::equal(deferred_param, at::full({3}, 7.0)));
  EXPECT_TRUE(at::equal(own, at::full({2}, 5.0))) << "the materialised parameter keeps its values";
}

}  // namespace flat_unit_test
}  // namespace tessera_plugins
