// What the host checks of components.adapters against the rest of a run (docs/finetuning.md):
// the mesh axes adapters train under, the export formats they can be written in, and where the
// weights they and their model start from are.
#pragma once

#include <set>
#include <string>

#include "tessera/core/config/config_tree.hpp"
#include "tessera/core/run/run_plan.hpp"

namespace tessera::core {

class Trainer;

// Adapters wrap whole layers of one model (a pipeline stage's are whole), not yet a
// tensor-parallel part of a layer. Throws ConfigIssue at components.adapters.
void check_adapter_splits(const RunPlan& plan);

// An export format the run's adapters can be written in, before training starts: a PEFT folder
// holds one adapter that has a PEFT form, over a model with Hugging Face names; a merged Hugging
// Face folder needs adapters that merge. `trainer` null: what the spec alone tells (validation).
void check_export_of_adapters(const RunPlan& plan, Trainer* trainer);

// The model's config.init_from, absolute ("" without one): where a PEFT export says its base is.
std::string model_init_from(const RunPlan& plan);

// Whether the weights the model and the adapters start from (their init_from) are all here.
bool adapter_weights_present(const RunPlan& plan);

// The top-level components `node` refers to ({instance_key: NAME}), and those they refer to.
void referenced_instances(const ConfigNode& node, const ConfigNode& components, std::set<std::string>& names);
// Sets in `into` (a components map built for part of the spec) every top-level component that
// `node` refers to, and those they refer to: what that part needs to build alone.
void add_referenced_instances(const ConfigNode& node, const ConfigNode& components, ConfigNode& into);

}  // namespace tessera::core
