// How a family plugin makes its model (tessera/nn/family.hpp): its factory, which settles
// init_from and checks the mesh, and its config.json writers from its table.
#pragma once

#include <memory>
#include <optional>

#include "tessera/components/model.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/family.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/context.hpp"

namespace tessera::nn {

// The family's config.json writers from its table (tessera/nn/hf_fields.hpp): the architecture
// record, and the export's config.json carrying the imported checkpoint's special token ids.
template <class Config>
void describe_by_table(FamilySpec& f, const HfFieldTable<Config>& table, const Config& c) {
  f.architecture_json = [&table, c] { return table.architecture(c).dump(); };
  f.hf_config_json = [&table, c](const std::string& special_ids) {
    nlohmann::ordered_json out = table.hf_config(c);
    hf_import::carry_special_token_ids(out, special_ids);
    return out.dump(2) + "\n";
  };
}

// A family's model: the run's tensor-, context- and expert-parallel groups, the YAML's config
// with what init_from's config.json settles (`settle`) checked against the mesh as `tessera
// validate` checked it (`check_mesh`), and FamilyDecoder built from `spec_of(settled config)`
// (tessera/nn/family.hpp): whole when it reads weights at construction, a Hugging Face folder
// read once.
template <class Config, class Settle, class CheckMesh, class SpecOf>
std::shared_ptr<Model> build_family(const Config& yaml, const RunContext& run, Settle settle, CheckMesh check_mesh,
                                    SpecOf spec_of) {
  const TensorParallel tp = TensorParallel::of(run);
  const ContextParallel cp = ContextParallel::of(run);
  const ExpertParallel ep = ExpertParallel::of(run);
  const auto c = settle(yaml);
  check_mesh(c, run, yaml);
  std::optional<DeferredInitSuspension> whole;
  if (!yaml.init_from.empty()) whole.emplace();
  if (!is_hf_checkpoint(yaml.init_from)) {
    return std::make_shared<FamilyDecoder>(spec_of(c), nullptr, yaml.init_from, tp, cp, ep, run);
  }
  const HfCheckpoint hf = hf_import::at_init_from([&] { return read_hf_checkpoint(yaml.init_from); });
  return std::make_shared<FamilyDecoder>(spec_of(c), &hf, yaml.init_from, tp, cp, ep, run);
}

// The registered factory of a family's model: build_family with these.
template <class Config, class Settle, class CheckMesh, class SpecOf>
auto family_factory(Settle settle, CheckMesh check_mesh, SpecOf spec_of) {
  return [=](const Config& yaml, const RunContext& run) { return build_family(yaml, run, settle, check_mesh, spec_of); };
}

}  // namespace tessera::nn
