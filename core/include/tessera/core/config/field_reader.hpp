// Reads config nodes as the typed values a schema declares, with the checks and messages every
// section of a run spec shares (component configs, `settings`, `trainer`, `checkpoint`).
#pragma once

#include <map>
#include <string>
#include <utility>

#include "tessera/config/component_config.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/core/config/config_tree.hpp"
#include "tessera/config/schema.hpp"
#include "tessera/config/value.hpp"

namespace tessera::core {

// Whether fields declared existing_path() must name a readable file or folder (the default);
// `tessera validate --skip-path-checks` turns it off to check a spec before its data exists.
void set_path_checks(bool on);
bool path_checks_enabled();

// Converts one non-component node to the field's type and checks its constraints.
Value read_field(const FieldSpec& field, const ConfigNode& node, const std::string& path);

// Fails on the first key of `section` (a mapping or null) that `schema` does not declare.
void reject_unknown_keys(const Schema& schema, const ConfigNode& section, const std::string& path);

// Reads a section without component fields: unknown keys rejected, required fields checked,
// defaults filled in. `section` may be null (all defaults).
std::map<std::string, Value> read_section(const Schema& schema, const ConfigNode* section,
                                          const SourcePos& owner_pos, const std::string& path);

// A ConfigError a component or a declared rule raised about a config (`config` may be null), as
// the positioned issue: at the field it names when the YAML has it, else at `fallback`.
ConfigIssue positioned(const ConfigError& error, const ConfigNode* config, const SourcePos& fallback,
                       const std::string& path);

// Reads a section into the struct that declares it (Section::declare): read_section's checks,
// then the declaration's rules.
template <class Section>
Section read_declared_section(const ConfigNode* section, const SourcePos& owner_pos, const std::string& path) {
  static const ConfigFields<Section> fields = declared_fields<Section>();
  auto values = read_section(fields.schema(), section, owner_pos, path);
  try {
    return fields.read(ComponentConfig(path, std::move(values), RunContext{}));
  } catch (const ConfigError& e) {
    throw positioned(e, section, section && section->is_map() ? section->pos() : owner_pos, path);
  }
}

}  // namespace tessera::core
