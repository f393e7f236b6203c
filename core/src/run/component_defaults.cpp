#include "tessera/core/run/component_defaults.hpp"

#include <string>

namespace tessera::core {
namespace {

template <class Node, class Visit>
void walk(Node& node, const std::string& kind, const std::string& path, const Visit& visit) {
  if (node.is_map()) {
    const ConfigNode* key = node.find("component_key");
    if (key && key->is_scalar() && key->scalar() == kind) visit(node, path);
    for (auto& entry : node.entries()) walk(entry.value, kind, join_path(path, entry.key), visit);
  } else if (node.is_sequence()) {
    for (std::size_t i = 0; i < node.items().size(); ++i) walk(node.items()[i], kind, index_path(path, i), visit);
  }
}

}  // namespace

void for_each_component(const ConfigNode& components, const std::string& kind,
                        const std::function<void(const ConfigNode&, const std::string&)>& visit) {
  walk(components, kind, "components", visit);
}

void give_datasets_the_model_vocabulary(ConfigNode& components, const Registry& registry) {
  if (!components.is_map()) return;
  const ConfigNode* model = components.find("model");
  const ConfigNode* model_config = model && model->is_map() ? model->find("config") : nullptr;
  const ConfigNode* vocab = model_config && model_config->is_map() ? model_config->find("vocab_size") : nullptr;
  // Only a vocabulary the spec states: one init_from settles is known when the model is built.
  if (!vocab || !vocab->is_scalar()) return;
  const ConfigNode copy = *vocab;
  walk(components, "dataset", "components", [&](ConfigNode& dataset, const std::string&) {
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
