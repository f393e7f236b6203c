// Machine- and human-readable views of what is registered, all generated from the declared
// schemas: `tessera components --json`, `tessera schema` (a JSON Schema of the whole run spec,
// for editors) and docs/components.md.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "tessera/registry.hpp"

namespace tessera::tooling {

// One field as JSON: name, type, doc, default, required, constraints.
nlohmann::json field_json(const FieldSpec& field);
// Every component: kind, variant, doc, plugin file, fields.
nlohmann::json components_json(const Registry& registry, const std::string& kind = {});
// A JSON Schema (draft 2020-12) of a run spec with every registered component's config.
nlohmann::json run_spec_json_schema(const Registry& registry);
// The Markdown of docs/components.md: the spec sections, then every component by kind.
std::string components_markdown(const Registry& registry);

}  // namespace tessera::tooling
