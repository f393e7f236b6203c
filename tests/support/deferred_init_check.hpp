// The check every kit model's tests make of sharded initialisation: a model built as the host
// builds it (meta parameters, tessera/nn/deferred_init.hpp), given storage and initialised in
// reverse order, has exactly the weights of the same model built whole from the same seed.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "test_support.hpp"

namespace tessera::testing {

inline void expect_deferred_init_gives_whole_weights(const std::string& yaml, std::uint64_t seed) {
  core::seed_everything(seed, "cpu");
  const auto whole = built<Model>(build_components(yaml), "model");
  core::seed_everything(seed, "cpu");
  std::shared_ptr<Model> deferred;
  {
    DeferredInitScope scope;
    deferred = built<Model>(build_components(yaml), "model");
  }
  ASSERT_TRUE(deferred->has_deferred_parameters());
  std::vector<at::Tensor> params = deferred->parameters();
  for (const at::Tensor& p : params) materialize_parameter(p, at::empty(p.sizes(), at::kFloat));
  std::reverse(params.begin(), params.end());
  deferred->initialize_parameters(params);
  const auto expected = whole->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(item.value().equal(expected[item.key()])) << item.key();
  }
}

}  // namespace tessera::testing
