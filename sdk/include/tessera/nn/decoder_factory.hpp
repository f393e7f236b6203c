// The factory of a kit model that may start from `init_from`: the run's tensor-, context- and
// expert-parallel groups, the YAML's config with what init_from's config.json settles (`settle`)
// checked against the mesh as `tessera validate` checked it (`check_mesh`), the model built whole
// when weights are read at construction, a Hugging Face folder read once. `ModelT` is built as
// ModelT(config, const HfCheckpoint* or nullptr, tp, cp, ep, run).
#pragma once

#include <memory>
#include <optional>

#include "tessera/components/model.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/context.hpp"

namespace tessera::nn {

template <class ModelT, class Config, class Settle, class CheckMesh>
std::shared_ptr<Model> build_decoder(const Config& yaml, const RunContext& run, Settle settle, CheckMesh check_mesh) {
  const TensorParallel tp = TensorParallel::of(run);
  const ContextParallel cp = ContextParallel::of(run);
  const ExpertParallel ep = ExpertParallel::of(run);
  const auto c = settle(yaml);
  check_mesh(c, run, yaml);
  std::optional<DeferredInitSuspension> whole;
  if (!yaml.init_from.empty()) whole.emplace();
  if (!is_hf_checkpoint(yaml.init_from)) return std::make_shared<ModelT>(c, nullptr, tp, cp, ep, run);
  const HfCheckpoint hf = hf_import::at_init_from([&] { return read_hf_checkpoint(yaml.init_from); });
  return std::make_shared<ModelT>(c, &hf, tp, cp, ep, run);
}

}  // namespace tessera::nn
