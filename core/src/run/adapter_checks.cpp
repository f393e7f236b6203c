#include "tessera/core/run/adapter_checks.hpp"

#include <filesystem>
#include <utility>
#include <vector>

#include "tessera/components/adapter.hpp"
#include "tessera/core/train/trainer.hpp"

namespace fs = std::filesystem;

namespace tessera::core {

void check_adapter_splits(const RunPlan& plan) {
  const ConfigNode* adapters = plan.components().find("adapters");
  if (!adapters || !adapters->is_sequence() || adapters->items().empty()) return;
  const ParallelDims& dims = plan.context.parallel;
  if (dims.tp == 1) return;
  throw ConfigIssue(adapters->pos(), "components.adapters",
                    "adapters train with the data-parallel strategies, context, expert and pipeline parallelism, "
                    "not yet with parallelism.tp " +
                        std::to_string(dims.tp) + "; set parallelism.tp: 1 (fsdp shards the model instead)");
}

namespace {

// A component's config.init_from, absolute ("" without one).
std::string init_from_of(const ConfigNode* component) {
  const ConfigNode* config = component && component->is_map() ? component->find("config") : nullptr;
  const ConfigNode* from = config && config->is_map() ? config->find("init_from") : nullptr;
  if (!from || !from->is_scalar() || from->scalar().empty()) return {};
  return fs::absolute(from->scalar()).lexically_normal().string();
}

}  // namespace

std::string model_init_from(const RunPlan& plan) { return init_from_of(plan.components().find("model")); }

void referenced_instances(const ConfigNode& node, const ConfigNode& components, std::set<std::string>& names) {
  if (node.is_map()) {
    const ConfigNode* key = node.find("instance_key");
    if (key && key->is_scalar()) {
      const ConfigNode* target = components.find(key->scalar());
      if (target && names.insert(key->scalar()).second) referenced_instances(*target, components, names);
      return;
    }
    for (const auto& e : node.entries()) referenced_instances(e.value, components, names);
  } else if (node.is_sequence()) {
    for (const auto& item : node.items()) referenced_instances(item, components, names);
  }
}

void add_referenced_instances(const ConfigNode& node, const ConfigNode& components, ConfigNode& into) {
  std::set<std::string> names;
  referenced_instances(node, components, names);
  for (const std::string& name : names) into.set(name, *components.find(name));
}

void check_export_of_adapters(const RunPlan& plan, Trainer* trainer) {
  const std::string& format = plan.checkpoint.export_format;
  const ConfigNode* section = plan.spec.find("checkpoint");
  const ConfigNode* node = section ? section->find("export_format") : nullptr;
  const SourcePos& at = node ? node->pos() : plan.spec.pos();
  if (trainer) {
    for (std::size_t i = 0; i < trainer->adapters().size(); ++i) {
      const Adapter& adapter = *trainer->adapters()[i];
      const std::string which = "components.adapters[" + std::to_string(i) + "]";
      if (format == "hf" && !adapter.merges()) {
        throw ConfigIssue(at, "checkpoint.export_format",
                          which + " cannot be merged into the base weights; use export_format: tessera");
      }
      if (format == "peft" && !adapter.exports_peft()) {
        throw ConfigIssue(at, "checkpoint.export_format",
                          which + " has no PEFT form; use export_format: tessera");
      }
    }
  }
  if (format != "peft") return;
  const ConfigNode* adapters = plan.components().find("adapters");
  const std::size_t count = adapters && adapters->is_sequence() ? adapters->items().size() : 0;
  if (count != 1) {
    throw ConfigIssue(at, "checkpoint.export_format",
                      "peft writes the one adapter of a run, and components.adapters has " + std::to_string(count) +
                          "; use export_format: tessera (adapters apart from the base) or hf (merged)");
  }
  if (trainer && !trainer->model().exports_hugging_face()) {
    throw ConfigIssue(at, "checkpoint.export_format",
                      "a PEFT folder names the layers as the model's Hugging Face format does, and this model has "
                      "none (model/gpt and model/llama have one); use export_format: tessera");
  }
}

bool adapter_weights_present(const RunPlan& plan) {
  std::vector<std::string> paths{model_init_from(plan)};
  if (const ConfigNode* adapters = plan.components().find("adapters"); adapters && adapters->is_sequence()) {
    for (const ConfigNode& adapter : adapters->items()) paths.push_back(init_from_of(&adapter));
  }
  for (const std::string& path : paths) {
    if (!path.empty() && !fs::exists(path)) return false;
  }
  return true;
}

}  // namespace tessera::core
