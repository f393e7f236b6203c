#include "tessera/core/components/component_factory.hpp"

#include <algorithm>
#include <functional>
#include <set>

#include "tessera/components/adapter.hpp"
#include "tessera/config/component_config.hpp"
#include "tessera/components/model.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/config/suggest.hpp"

namespace tessera::core {
namespace {

const char* kComponentKey = "component_key";
const char* kVariantKey = "variant_key";
const char* kConfigKey = "config";
const char* kInstanceKey = "instance_key";
const char* kPassType = "pass_type";
const std::string kRoot = "components";
// components.adapters change components.model in place, before anything else gets the model.
const std::string kModel = "model";
const std::string kAdapters = "adapters";

bool is_reference(const ConfigNode& node) { return node.is_map() && node.find(kInstanceKey); }

const std::string& required_string(const ConfigNode& node, const char* key, const std::string& path) {
  const ConfigNode* value = node.find(key);
  if (!value) {
    throw ConfigIssue(node.pos(), path, std::string("missing '") + key + "'; a component is {" +
                                            kComponentKey + ", " + kVariantKey + ", " + kConfigKey + "}");
  }
  if (!value->is_scalar() || value->scalar().empty()) {
    throw ConfigIssue(value->pos(), join_path(path, key), "expected a name");
  }
  return value->scalar();
}

void check_keys(const ConfigNode& node, const std::vector<std::string>& allowed, const std::string& path) {
  for (const auto& e : node.entries()) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == e.key;
    if (!ok) {
      throw ConfigIssue(e.key_pos, join_path(path, e.key),
                        "unknown key" + did_you_mean(e.key, allowed) + "; expected " + join(allowed));
    }
  }
}

// Collects the instance names referenced anywhere under `node`, with the reference node.
void collect_references(const ConfigNode& node, const std::string& path,
                        std::vector<std::pair<std::string, std::pair<const ConfigNode*, std::string>>>& out) {
  if (is_reference(node)) {
    const ConfigNode* name = node.find(kInstanceKey);
    out.push_back({name->is_scalar() ? name->scalar() : "", {&node, path}});
    return;
  }
  if (node.is_map()) {
    for (const auto& e : node.entries()) collect_references(e.value, join_path(path, e.key), out);
  } else if (node.is_sequence()) {
    for (size_t i = 0; i < node.items().size(); ++i) collect_references(node.items()[i], index_path(path, i), out);
  }
}

class GraphWalker {
 public:
  GraphWalker(const Registry& registry, const RunContext& context, const ConfigNode& components, bool build)
      : registry_(registry), context_(context), components_(components), build_(build) {}

  BuiltComponents run() {
    if (components_.is_null()) return {};
    if (!components_.is_map()) {
      throw ConfigIssue(components_.pos(), kRoot, std::string("expected a mapping of named components, got ") +
                                                      components_.type_name());
    }
    index_instances();
    for (const auto& name : build_order()) {
      const ConfigNode::Entry& entry = *components_.find_entry(name);
      const std::string path = join_path(kRoot, name);
      if (entry.value.is_sequence()) {
        auto& list = built_.lists[name];
        for (size_t i = 0; i < entry.value.items().size(); ++i) {
          if (build_ && name == kAdapters && i == 0) base_names_ = parameter_names(adapted_model(entry.value, path));
          list.push_back(make(entry.value.items()[i], index_path(path, i), ""));
          if (build_ && name == kAdapters) apply_adapter(list.back(), entry.value.items()[i], index_path(path, i));
        }
        if (build_ && name == kAdapters) freeze_what_adapters_left(entry.value);
      } else {
        built_.instances[name] = make(entry.value, path, "");
      }
    }
    return std::move(built_);
  }

 private:
  Model& adapted_model(const ConfigNode& at, const std::string& path) {
    const auto model = built_.instances.find(kModel);
    if (model == built_.instances.end() || model->second.kind != Model::kKind || !model->second.object) {
      throw ConfigIssue(at.pos(), path, "adapters change components.model, and the spec has no model there");
    }
    return *static_cast<Model*>(model->second.object.get());
  }

  void apply_adapter(const ComponentHandle& handle, const ConfigNode& node, const std::string& path) {
    if (handle.kind != Adapter::kKind) {
      throw ConfigIssue(node.pos(), path, "components.adapters holds adapters, got a " + handle.kind);
    }
    Model& model = adapted_model(node, path);
    auto& adapter = *static_cast<Adapter*>(handle.object.get());
    const ConfigNode* config = node.is_map() ? node.find(kConfigKey) : nullptr;
    try {
      rethrowing_config_errors(node, config, path, [&] {
        const std::vector<at::Tensor> trained = adapter.apply(model);
        std::set<const c10::TensorImpl*> own;
        for (const at::Tensor& p : model.parameters()) own.insert(p.unsafeGetTensorImpl());
        for (const at::Tensor& p : trained) {
          // One the optimizer would never see (it reads the model's parameters) must not pass.
          if (!own.count(p.unsafeGetTensorImpl())) {
            throw tessera::Error("it returned a tensor to train that is not a parameter of the model; register it "
                                 "on one of the model's modules (as LoRA registers lora_A and lora_B on the layer)");
          }
          trained_.insert(p.unsafeGetTensorImpl());
        }
      });
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw ConfigIssue(node.pos(), path,
                        "applying " + handle.kind + "/" + handle.variant + " to the model failed: " + e.what());
    }
  }

  // Every parameter no adapter trains is frozen: no gradient, so no optimizer state either.
  void freeze_what_adapters_left(const ConfigNode& list) {
    if (list.items().empty()) return;
    Model& model = adapted_model(list, join_path(kRoot, kAdapters));
    for (auto& p : model.parameters()) {
      if (!trained_.count(p.unsafeGetTensorImpl())) p.requires_grad_(false);
    }
    for (const std::string& name : parameter_names(model)) {
      if (!base_names_.count(name)) built_.adapter_parameters.insert(name);
    }
  }

  static std::set<std::string> parameter_names(const Model& model) {
    std::set<std::string> names;
    for (const auto& item : model.named_parameters()) names.insert(item.key());
    return names;
  }

  // Records each top-level instance's kind so references can be checked before anything builds.
  void index_instances() {
    for (const auto& e : components_.entries()) {
      const std::string path = join_path(kRoot, e.key);
      if (e.value.is_sequence()) {
        lists_.insert(e.key);
        continue;
      }
      if (!e.value.is_map() || is_reference(e.value)) {
        throw ConfigIssue(e.value.pos(), path,
                          "expected a component {component_key, variant_key, config} or a list of them");
      }
      kinds_[e.key] = required_string(e.value, kComponentKey, path);
    }
  }

  // Depth-first order over references; a reference back into the current chain is a cycle.
  std::vector<std::string> build_order() {
    std::vector<std::string> order;
    std::set<std::string> done;
    std::vector<std::string> chain;
    std::function<void(const std::string&)> visit = [&](const std::string& name) {
      if (done.count(name)) return;
      chain.push_back(name);
      std::vector<std::pair<std::string, std::pair<const ConfigNode*, std::string>>> refs;
      collect_references(*components_.find(name), join_path(kRoot, name), refs);
      for (const auto& [target, where] : refs) {
        check_reference_target(target, *where.first, where.second);
        for (size_t i = 0; i < chain.size(); ++i) {
          if (chain[i] == target) {
            std::string cycle;
            for (size_t j = i; j < chain.size(); ++j) cycle += join_path(kRoot, chain[j]) + " -> ";
            throw ConfigIssue(where.first->pos(), where.second,
                              "reference cycle: " + cycle + join_path(kRoot, target));
          }
        }
        visit(target);
      }
      // components.adapters change the model: they come after it, and whatever takes the model
      // (the optimizer, by reference) comes after them and gets it adapted.
      if (lists_.count(kAdapters) && kinds_.count(kModel)) {
        if (name == kAdapters) visit(kModel);
        const bool takes_model = std::any_of(refs.begin(), refs.end(), [](const auto& r) { return r.first == kModel; });
        if (name != kAdapters && takes_model) {
          if (std::find(chain.begin(), chain.end(), kAdapters) != chain.end()) {
            throw ConfigIssue(components_.find(name)->pos(), join_path(kRoot, name),
                              "components.adapters depend on this component, which takes the model they change; "
                              "an adapter cannot refer to what uses the adapted model");
          }
          visit(kAdapters);
        }
      }
      chain.pop_back();
      done.insert(name);
      order.push_back(name);
    };
    for (const auto& e : components_.entries()) visit(e.key);
    return order;
  }

  void check_reference_target(const std::string& target, const ConfigNode& ref, const std::string& path) {
    const ConfigNode* name = ref.find(kInstanceKey);
    if (!name->is_scalar() || target.empty()) {
      throw ConfigIssue(name->pos(), join_path(path, kInstanceKey), "expected the name of a component");
    }
    check_keys(ref, {kInstanceKey, kPassType}, path);
    if (const ConfigNode* pass = ref.find(kPassType); pass && (!pass->is_scalar() || pass->scalar() != "BY_REFERENCE")) {
      throw ConfigIssue(pass->pos(), join_path(path, kPassType), "only BY_REFERENCE is supported");
    }
    if (lists_.count(target)) {
      throw ConfigIssue(name->pos(), join_path(path, kInstanceKey),
                        "components." + target + " is a list and cannot be referenced");
    }
    if (!kinds_.count(target)) {
      std::vector<std::string> names;
      for (const auto& [n, k] : kinds_) names.push_back(n);
      throw ConfigIssue(name->pos(), join_path(path, kInstanceKey),
                        "no component named '" + target + "' under components" + did_you_mean(target, names));
    }
  }

  // A list field's components, each inline or a reference.
  std::vector<ComponentHandle> make_list(const ConfigNode& node, const std::string& path, const std::string& expected_kind) {
    if (!node.is_sequence()) {
      throw ConfigIssue(node.pos(), path, "expected a list of components of kind " + expected_kind + ", got " +
                                              node.type_name());
    }
    std::vector<ComponentHandle> handles;
    for (std::size_t i = 0; i < node.items().size(); ++i) {
      handles.push_back(make(node.items()[i], index_path(path, i), expected_kind));
    }
    return handles;
  }

  ComponentHandle make(const ConfigNode& node, const std::string& path, const std::string& expected_kind) {
    if (is_reference(node)) {
      const std::string target = node.find(kInstanceKey)->scalar();
      check_reference_target(target, node, path);
      const std::string& kind = kinds_.at(target);
      if (!expected_kind.empty() && kind != expected_kind) {
        throw ConfigIssue(node.pos(), path, "expected a component of kind " + expected_kind +
                                                ", but components." + target + " is a " + kind);
      }
      if (!build_) return ComponentHandle{kind, "", nullptr};
      return built_.instances.at(target);
    }
    if (!node.is_map()) {
      throw ConfigIssue(node.pos(), path, std::string("expected a component {component_key, variant_key, config}, got ") +
                                              node.type_name());
    }
    check_keys(node, {kComponentKey, kVariantKey, kConfigKey}, path);
    const std::string& kind = required_string(node, kComponentKey, path);
    const std::string& variant = required_string(node, kVariantKey, path);
    if (!expected_kind.empty() && kind != expected_kind) {
      throw ConfigIssue(node.find(kComponentKey)->pos(), join_path(path, kComponentKey),
                        "expected a component of kind " + expected_kind + ", got " + kind);
    }
    const ComponentInfo* info = lookup(node, kind, variant, path);
    const ConfigNode* config = node.find(kConfigKey);
    const std::string config_path = join_path(path, kConfigKey);
    if (config) reject_unknown_keys(info->schema, *config, config_path);

    std::map<std::string, Value> values;
    std::set<std::string> given;
    for (const auto& field : info->schema.fields()) {
      const ConfigNode* value = config && config->is_map() ? config->find(field.name) : nullptr;
      const std::string field_path = join_path(config_path, field.name);
      if (value && !value->is_null()) {
        given.insert(field.name);
        values[field.name] = field.type == FieldType::component    ? Value(make(*value, field_path, field.component_kind))
                             : field.type == FieldType::components ? Value(make_list(*value, field_path, field.component_kind))
                                                                   : read_field(field, *value, field_path);
      } else if (field.is_required) {
        throw ConfigIssue(config && config->is_map() ? config->pos() : node.pos(), field_path,
                          std::string("required ") + to_string(field.type) +
                              (field.type == FieldType::component ? " (kind " + field.component_kind + ")" : "") +
                              " is missing: " + field.doc);
      } else {
        values[field.name] = field.default_value;
      }
    }
    if (!build_) {
      // The declared rules (tessera/config/config_fields.hpp) run now, before anything is built.
      if (info->check) {
        try {
          rethrowing_config_errors(node, config, path,
                                   [&] { info->check(ComponentConfig(path, std::move(values), context_, given)); });
        } catch (const ConfigError&) {
          throw;
        } catch (const std::exception& e) {
          throw ConfigIssue(node.pos(), path, "checking " + kind + "/" + variant + " failed: " + e.what());
        }
      }
      return ComponentHandle{kind, variant, nullptr};
    }
    return create(*info, node, config, path, std::move(values), std::move(given));
  }

  // Runs `fn`, turning a ConfigError into a positioned issue: at the field it names (under the
  // component's config) when the YAML has it, else at the component.
  template <class Fn>
  static void rethrowing_config_errors(const ConfigNode& node, const ConfigNode* config, const std::string& path,
                                       const Fn& fn) {
    try {
      fn();
    } catch (const ConfigIssue&) {
      throw;
    } catch (const tessera::ConfigError& e) {
      if (e.field().empty()) throw ConfigIssue(node.pos(), path, e.what());
      throw positioned(e, config, node.pos(), join_path(path, kConfigKey));
    }
  }

  const ComponentInfo* lookup(const ConfigNode& node, const std::string& kind, const std::string& variant,
                              const std::string& path) {
    if (const ComponentInfo* info = registry_.find(kind, variant)) return info;
    const auto variants = registry_.variants(kind);
    if (variants.empty()) {
      throw ConfigIssue(node.find(kComponentKey)->pos(), join_path(path, kComponentKey),
                        "unknown component kind '" + kind + "'" + did_you_mean(kind, registry_.kinds()) +
                            "; loaded kinds: " + join(registry_.kinds()) +
                            " (is the plugin that provides it on the plugin path?)");
    }
    throw ConfigIssue(node.find(kVariantKey)->pos(), join_path(path, kVariantKey),
                      "no " + kind + " named '" + variant + "'" + did_you_mean(variant, variants) +
                          "; registered " + kind + " variants: " + join(variants));
  }

  ComponentHandle create(const ComponentInfo& info, const ConfigNode& node, const ConfigNode* config,
                         const std::string& path, std::map<std::string, Value> values, std::set<std::string> given) {
    const std::string what = info.kind + "/" + info.variant;
    std::shared_ptr<void> object;
    try {
      rethrowing_config_errors(node, config, path,
                               [&] { object = info.make(ComponentConfig(path, std::move(values), context_, std::move(given))); });
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw ConfigIssue(node.pos(), path, "building " + what + " failed: " + e.what());
    }
    if (!object) throw ConfigIssue(node.pos(), path, "the factory of " + what + " returned nothing");
    // The object may not outlive the code that defines it: its deleter holds the library.
    std::shared_ptr<const void> library = info.keep_alive;
    std::shared_ptr<void> guarded(object.get(), [object, library](void*) mutable {
      object.reset();
      library.reset();
    });
    return ComponentHandle{info.kind, info.variant, std::move(guarded)};
  }

  const Registry& registry_;
  const RunContext& context_;
  const ConfigNode& components_;
  const bool build_;
  std::map<std::string, std::string> kinds_;
  std::set<std::string> lists_;
  BuiltComponents built_;
  std::set<const c10::TensorImpl*> trained_;  // parameters the adapters train
  std::set<std::string> base_names_;          // the model's parameters before the adapters
};

}  // namespace

ComponentFactory::ComponentFactory(const Registry& registry, RunContext context)
    : registry_(registry), context_(std::move(context)) {}

void ComponentFactory::validate(const ConfigNode& components) const { walk(components, false); }

BuiltComponents ComponentFactory::build(const ConfigNode& components) const {
  walk(components, false);
  return walk(components, true);
}

BuiltComponents ComponentFactory::walk(const ConfigNode& components, bool build) const {
  return GraphWalker(registry_, context_, components, build).run();
}

}  // namespace tessera::core
