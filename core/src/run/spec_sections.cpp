#include "tessera/core/run/spec_sections.hpp"

#include "tessera/config/config_fields.hpp"
#include "tessera/core/checkpoint/checkpoint_settings.hpp"
#include "tessera/core/run/parallelism_settings.hpp"
#include "tessera/core/run/run_settings.hpp"
#include "tessera/core/train/trainer_settings.hpp"

namespace tessera::core {

const std::vector<std::string>& top_level_keys() {
  static const std::vector<std::string> keys = {"name", "plugins", "settings", "components", "trainer", "checkpoint",
                                                "parallelism"};
  return keys;
}

const std::vector<ComponentRole>& trainer_roles() {
  static const std::vector<ComponentRole> roles = {
      {"model", "model", true, false, "the model being trained"},
      {"adapters", "adapter", false, true,
       "applied to the model in list order before anything else sees it; only their parameters train"},
      {"train_data", "dataset", true, false, "where training batches come from (the trainer's alone: no component may refer to it)"},
      {"loss", "loss", true, false, "the training loss"},
      {"optimizer", "optimizer", true, false, "updates the model's parameters"},
      {"scheduler", "scheduler", false, false, "learning-rate multiplier per step (default: constant 1)"},
      {"parallel", "parallel", false, false,
       "how the data-parallel ranks share a step: ddp, zero1, zero2 or fsdp (default: ddp when there are several)"},
      {"callbacks", "callback", false, true, "called at the loop's events, in list order"},
  };
  return roles;
}

void check_trainer_roles(const ConfigNode* components, const SourcePos& top, bool model_only) {
  for (const auto& role : trainer_roles()) {
    if (model_only && std::string(role.name) != "model" && std::string(role.name) != "adapters") continue;
    const ConfigNode::Entry* entry = components && components->is_map() ? components->find_entry(role.name) : nullptr;
    const std::string role_path = join_path("components", role.name);
    if (!entry) {
      if (role.required) {
        throw ConfigIssue(components ? components->pos() : top, role_path,
                          std::string("missing: the trainer needs a ") + role.kind + " here (" + role.doc + ")");
      }
      continue;
    }
    if (role.list != entry->value.is_sequence()) {
      throw ConfigIssue(entry->value.pos(), role_path,
                        role.list ? "expected a list of components" : "expected one component, not a list");
    }
    auto check_kind = [&](const ConfigNode& node, const std::string& node_path) {
      const ConfigNode* key = node.is_map() ? node.find("component_key") : nullptr;
      if (key && key->is_scalar() && key->scalar() != role.kind) {
        throw ConfigIssue(key->pos(), join_path(node_path, "component_key"),
                          std::string("the trainer uses ") + role_path + " as its " + role.kind + ", got kind " +
                              key->scalar());
      }
    };
    if (role.list) {
      for (size_t i = 0; i < entry->value.items().size(); ++i) {
        check_kind(entry->value.items()[i], index_path(role_path, i));
      }
    } else {
      check_kind(entry->value, role_path);
    }
  }
}

namespace {

// The trainer reads components.train_data alone: another component holding it by reference
// would move the training position (which checkpoints record) and call it while the trainer's
// read-ahead thread does.
void reject_references_to_train_data(const ConfigNode& node, const std::string& path) {
  if (node.is_map()) {
    const ConfigNode* key = node.find("instance_key");
    if (key && key->is_scalar() && key->scalar() == "train_data") {
      throw ConfigIssue(key->pos(), join_path(path, "instance_key"),
                        "components.train_data is read by the trainer alone (its batches, its position in "
                        "checkpoints, read ahead on a thread of its own); give this component a dataset of its "
                        "own, e.g. a copy of the train_data block");
    }
    for (const auto& entry : node.entries()) reject_references_to_train_data(entry.value, join_path(path, entry.key));
  } else if (node.is_sequence()) {
    for (std::size_t i = 0; i < node.items().size(); ++i) {
      reject_references_to_train_data(node.items()[i], index_path(path, i));
    }
  }
}

}  // namespace

void check_train_data_unshared(const ConfigNode* components) {
  if (!components || !components->is_map()) return;
  for (const auto& entry : components->entries()) {
    reject_references_to_train_data(entry.value, join_path("components", entry.key));
  }
}

Schema plugins_schema() { return declared_fields<PluginSettings>().schema(); }
Schema settings_schema() { return declared_fields<RunSettings>().schema(); }
Schema trainer_schema() { return declared_fields<TrainerSettings>().schema(); }
Schema checkpoint_schema() { return declared_fields<CheckpointSettings>().schema(); }
Schema parallelism_schema() { return declared_fields<ParallelismSettings>().schema(); }

}  // namespace tessera::core
