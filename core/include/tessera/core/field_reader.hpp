// Reads config nodes as the typed values a schema declares, with the checks and messages every
// section of a run spec shares (component configs, `settings`, `trainer`).
#pragma once

#include <map>
#include <string>

#include "tessera/core/config_tree.hpp"
#include "tessera/schema.hpp"
#include "tessera/value.hpp"

namespace tessera::core {

// Converts one non-component node to the field's type and checks its constraints.
Value read_field(const FieldSpec& field, const ConfigNode& node, const std::string& path);

// Fails on the first key of `section` (a mapping or null) that `schema` does not declare.
void reject_unknown_keys(const Schema& schema, const ConfigNode& section, const std::string& path);

// Reads a section without component fields: unknown keys rejected, required fields checked,
// defaults filled in. `section` may be null (all defaults).
std::map<std::string, Value> read_section(const Schema& schema, const ConfigNode* section,
                                          const SourcePos& owner_pos, const std::string& path);

}  // namespace tessera::core
