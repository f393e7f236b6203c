// Turns the `components` section of a run spec into objects: checks every node against the
// registry and the declared schemas, resolves references, orders the build by dependency and
// calls the plugins' factories. Every created object keeps its plugin library loaded.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/run/context.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/registry.hpp"
#include "tessera/config/value.hpp"

namespace tessera::core {

struct BuiltComponents {
  std::map<std::string, ComponentHandle> instances;            // components.NAME: {...}
  std::map<std::string, std::vector<ComponentHandle>> lists;   // components.NAME: [{...}, ...]
  // The parameters components.adapters added to the model, by name (exports keep them apart).
  std::set<std::string> adapter_parameters;
};

class ComponentFactory {
 public:
  ComponentFactory(const Registry& registry, RunContext context);

  // Checks everything a build would check, builds nothing. Throws ConfigIssue.
  void validate(const ConfigNode& components) const;
  // Validates, then builds in dependency order. Throws ConfigIssue (also for a factory that
  // throws: the message names the component's place in the spec).
  BuiltComponents build(const ConfigNode& components) const;

 private:
  BuiltComponents walk(const ConfigNode& components, bool build) const;

  const Registry& registry_;
  RunContext context_;
};

}  // namespace tessera::core
