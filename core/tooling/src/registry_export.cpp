#include "tessera/tooling/registry_export.hpp"

#include <filesystem>
#include <sstream>

#include "tessera/core/run/spec_sections.hpp"
#include "tessera/version.hpp"

namespace tessera::tooling {
namespace {

struct ValueToJson {
  nlohmann::json operator()(std::monostate) const { return nullptr; }
  nlohmann::json operator()(const ComponentHandle& h) const { return h.kind + "/" + h.variant; }
  nlohmann::json operator()(const std::vector<ComponentHandle>& list) const {
    nlohmann::json out = nlohmann::json::array();
    for (const ComponentHandle& h : list) out.push_back((*this)(h));
    return out;
  }
  template <class T>
  nlohmann::json operator()(const T& x) const {
    return x;
  }
};

nlohmann::json value_json(const Value& v) { return std::visit(ValueToJson{}, v); }

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// The JSON Schema of one field's value.
nlohmann::json field_schema(const FieldSpec& f) {
  nlohmann::json s;
  auto add_range = [&](nlohmann::json& target) {
    if (f.min) target[f.min_exclusive ? "exclusiveMinimum" : "minimum"] = *f.min;
    if (f.max) target[f.max_exclusive ? "exclusiveMaximum" : "maximum"] = *f.max;
  };
  auto scalar = [&](const char* type) {
    nlohmann::json item{{"type", type}};
    if (std::string(type) != "string" && std::string(type) != "boolean") add_range(item);
    if (!f.choices.empty()) item["enum"] = f.choices;
    return item;
  };
  switch (f.type) {
    case FieldType::boolean: s = scalar("boolean"); break;
    case FieldType::integer: s = scalar("integer"); break;
    case FieldType::number: s = scalar("number"); break;
    case FieldType::string: s = scalar("string"); break;
    case FieldType::integers: s = {{"type", "array"}, {"items", scalar("integer")}}; break;
    case FieldType::numbers: s = {{"type", "array"}, {"items", scalar("number")}}; break;
    case FieldType::strings: s = {{"type", "array"}, {"items", scalar("string")}}; break;
    case FieldType::component: s = {{"$ref", "#/$defs/kind_" + f.component_kind}}; break;
    case FieldType::components:
      s = {{"type", "array"}, {"items", {{"$ref", "#/$defs/kind_" + f.component_kind}}}};
      break;
  }
  if (f.type != FieldType::component && f.type != FieldType::components) {
    // ${...} interpolation may stand in for any value.
    s = {{"anyOf", {s, {{"type", "string"}, {"pattern", "\\$\\{.+\\}"}}}}};
  }
  s["description"] = f.doc;
  if (f.has_default()) s["default"] = value_json(f.default_value);
  return s;
}

nlohmann::json section_schema(const Schema& schema) {
  nlohmann::json properties = nlohmann::json::object();
  std::vector<std::string> required;
  for (const auto& f : schema.fields()) {
    properties[f.name] = field_schema(f);
    if (f.is_required) required.push_back(f.name);
  }
  nlohmann::json s{{"type", "object"}, {"properties", properties}, {"additionalProperties", false}};
  if (!required.empty()) s["required"] = required;
  return s;
}

}  // namespace

nlohmann::json field_json(const FieldSpec& f) {
  nlohmann::json j{{"name", f.name}, {"type", to_string(f.type)}, {"doc", f.doc}, {"required", f.is_required}};
  if (f.has_default()) j["default"] = value_json(f.default_value);
  if (f.type == FieldType::component || f.type == FieldType::components) j["kind"] = f.component_kind;
  if (f.min) j[f.min_exclusive ? "greater_than" : "at_least"] = *f.min;
  if (f.max) j[f.max_exclusive ? "less_than" : "at_most"] = *f.max;
  if (!f.choices.empty()) j["one_of"] = f.choices;
  return j;
}

nlohmann::json components_json(const Registry& registry, const std::string& kind) {
  nlohmann::json out = nlohmann::json::array();
  for (const ComponentInfo* info : registry.list(kind)) {
    nlohmann::json fields = nlohmann::json::array();
    for (const auto& f : info->schema.fields()) fields.push_back(field_json(f));
    out.push_back({{"kind", info->kind},
                   {"variant", info->variant},
                   {"doc", info->doc},
                   {"plugin", info->origin},
                   {"fields", fields}});
  }
  return out;
}

nlohmann::json run_spec_json_schema(const Registry& registry) {
  nlohmann::json defs = nlohmann::json::object();
  const nlohmann::json reference{
      {"type", "object"},
      {"description", "a reference to a named component under `components`"},
      {"properties",
       {{"instance_key", {{"type", "string"}}}, {"pass_type", {{"const", "BY_REFERENCE"}}}}},
      {"required", {"instance_key"}},
      {"additionalProperties", false}};
  defs["reference"] = reference;
  nlohmann::json any_component = nlohmann::json::array();
  for (const std::string& kind : registry.kinds()) {
    nlohmann::json variants = nlohmann::json::array();
    for (const ComponentInfo* info : registry.list(kind)) {
      const std::string name = "component_" + kind + "_" + info->variant;
      defs[name] = {{"type", "object"},
                    {"description", info->doc},
                    {"properties",
                     {{"component_key", {{"const", kind}}},
                      {"variant_key", {{"const", info->variant}}},
                      {"config", section_schema(info->schema)}}},
                    {"required", {"component_key", "variant_key"}},
                    {"additionalProperties", false}};
      variants.push_back({{"$ref", "#/$defs/" + name}});
    }
    variants.push_back({{"$ref", "#/$defs/reference"}});
    defs["kind_" + kind] = {{"anyOf", variants}};
    any_component.push_back({{"$ref", "#/$defs/kind_" + kind}});
  }
  nlohmann::json one_component{{"anyOf", any_component}};
  nlohmann::json components{{"type", "object"},
                            {"description", "named component instances"},
                            {"additionalProperties",
                             {{"anyOf", {one_component, {{"type", "array"}, {"items", one_component}}}}}}};
  nlohmann::json properties = nlohmann::json::object();
  for (const auto& role : core::trainer_roles()) {
    if (!registry.list(role.kind).empty()) {
      const nlohmann::json of_kind{{"$ref", "#/$defs/kind_" + std::string(role.kind)}};
      properties[role.name] = role.list ? nlohmann::json{{"type", "array"}, {"items", of_kind}} : of_kind;
      properties[role.name]["description"] = role.doc;
    }
  }
  components["properties"] = properties;
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"title", std::string("Tessera run spec (SDK ABI ") + std::to_string(kSdkAbiVersion) + ")"},
          {"type", "object"},
          {"properties",
           {{"name", {{"type", "string"}, {"description", "the run's name"}}},
            {"include", {{"anyOf", {{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}}},
                         {"description", "files merged first; this file wins"}}},
            {"plugins", section_schema(core::plugins_schema())},
            {"settings", section_schema(core::settings_schema())},
            {"trainer", section_schema(core::trainer_schema())},
            {"checkpoint", section_schema(core::checkpoint_schema())},
            {"parallelism", section_schema(core::parallelism_schema())},
            {"components", components}}},
          {"required", {"components", "trainer"}},
          {"additionalProperties", false},
          {"$defs", defs}};
}

namespace {

void markdown_fields(std::ostringstream& out, const Schema& schema) {
  if (schema.fields().empty()) {
    out << "No config fields.\n\n";
    return;
  }
  out << "| field | type | default | constraints | description |\n|---|---|---|---|---|\n";
  for (const auto& f : schema.fields()) {
    out << "| `" << f.name << "` | " << to_string(f.type) << " | "
        << (f.has_default() ? "`" + to_display_string(f.default_value) + "`" : f.is_required ? "required" : "optional")
        << " | " << f.constraints_text() << " | " << f.doc << " |\n";
  }
  out << "\n";
  if (!schema.mesh_axes().empty()) {
    out << "Splits over the device mesh's axes:";
    for (const auto& a : schema.mesh_axes()) out << " `" << a << "`";
    out << " (`parallelism:`).\n\n";
  }
}

}  // namespace

std::string components_markdown(const Registry& registry) {
  std::ostringstream out;
  out << "# Components\n\n"
      << "Generated by `tessera components --markdown` from the schemas the bundled plugins declare;\n"
      << "do not edit by hand (a test compares this file with the registry). "
      << "`tessera describe KIND/VARIANT` prints the same for any loaded plugin.\n\n"
      << "## Run spec sections\n\n### settings\n\n";
  markdown_fields(out, core::settings_schema());
  out << "### trainer\n\n";
  markdown_fields(out, core::trainer_schema());
  out << "### checkpoint\n\n";
  markdown_fields(out, core::checkpoint_schema());
  out << "### parallelism\n\n";
  markdown_fields(out, core::parallelism_schema());
  out << "### components (the trainer's roles)\n\n| name | kind | required | description |\n|---|---|---|---|\n";
  for (const auto& role : core::trainer_roles()) {
    out << "| `" << role.name << "` | " << role.kind << (role.list ? " (list)" : "") << " | "
        << (role.required ? "yes" : "no") << " | " << role.doc << " |\n";
  }
  out << "\n";
  for (const std::string& kind : registry.kinds()) {
    out << "## Kind `" << kind << "`\n\n";
    for (const ComponentInfo* info : registry.list(kind)) {
      out << "### " << kind << "/" << info->variant << "\n\n"
          << info->doc << " (plugin `" << file_name(info->origin) << "`)\n\n";
      markdown_fields(out, info->schema);
    }
  }
  return out.str();
}

}  // namespace tessera::tooling
