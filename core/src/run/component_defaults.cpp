#include "tessera/core/run/component_defaults.hpp"

#include <string>

namespace tessera::core {
namespace {

// Every component of kind dataset below `node` (inline ones inside other components too).
void each_dataset(ConfigNode& node, const std::function<void(ConfigNode&)>& visit) {
  if (node.is_map()) {
    const ConfigNode* kind = node.find("component_key");
    if (kind && kind->is_scalar() && kind->scalar() == "dataset") visit(node);
    for (auto& entry : node.entries()) each_dataset(entry.value, visit);
  } else if (node.is_sequence()) {
    for (auto& item : node.items()) each_dataset(item, visit);
  }
}

}  // namespace

void give_datasets_the_model_vocabulary(ConfigNode& components, const Registry& registry) {
  if (!components.is_map()) return;
  const ConfigNode* model = components.find("model");
  const ConfigNode* model_config = model && model->is_map() ? model->find("config") : nullptr;
  const ConfigNode* vocab = model_config && model_config->is_map() ? model_config->find("vocab_size") : nullptr;
  // Only a vocabulary the spec states: one init_from settles is known when the model is built.
  if (!vocab || !vocab->is_scalar()) return;
  const ConfigNode copy = *vocab;
  each_dataset(components, [&](ConfigNode& dataset) {
    const ConfigNode* variant = dataset.find("variant_key");
    if (!variant || !variant->is_scalar()) return;
    const ComponentInfo* info = registry.find("dataset", variant->scalar());
    if (!info || !info->schema.find("vocab_size")) return;
    ConfigNode* config = dataset.find("config");
    if (!config) config = &dataset.set("config", ConfigNode::make_map(dataset.pos()));
    if (!config->is_map() || config->find("vocab_size")) return;
    config->set("vocab_size", copy);
  });
}

}  // namespace tessera::core
