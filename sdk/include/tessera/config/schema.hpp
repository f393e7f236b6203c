// Declared config schemas. Every factory says which fields it takes, with type, default, one-line
// doc and constraints, so the host can list, describe and validate a run before building it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/config/value.hpp"

namespace tessera {

enum class FieldType { boolean, integer, number, string, integers, numbers, strings, component, components };

TESSERA_API const char* to_string(FieldType type);

struct TESSERA_API FieldSpec {
  std::string name;
  FieldType type = FieldType::string;
  std::string doc;
  std::string component_kind;  // for FieldType::component(s): the kind the value (each item) must be
  Value default_value;         // std::monostate when there is none
  bool is_required = true;     // false once a default is given or optional() is called
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  std::vector<std::string> choices;  // for strings: the allowed values
  // For strings and lists of strings: a file or folder the component reads. Validation (`tessera
  // validate` as well as train) checks that each non-empty value exists and can be read; a glob
  // (data/*.parquet) that no file has as its name must match some, all readable.
  bool must_exist = false;

  // Fluent setters; the default is converted to the field's type (an int for a number is fine).
  FieldSpec& default_to(bool v);
  FieldSpec& default_to(int v);
  FieldSpec& default_to(long v);
  FieldSpec& default_to(long long v);
  FieldSpec& default_to(double v);
  FieldSpec& default_to(const char* v);
  FieldSpec& default_to(std::string v);
  FieldSpec& default_to(std::vector<std::int64_t> v);
  FieldSpec& default_to(std::vector<double> v);
  FieldSpec& default_to(std::vector<std::string> v);
  FieldSpec& optional();  // may be absent; ComponentConfig::has() tells
  FieldSpec& required();  // must be given: drops the default
  FieldSpec& at_least(double v);
  FieldSpec& greater_than(double v);
  FieldSpec& at_most(double v);
  FieldSpec& less_than(double v);
  FieldSpec& one_of(std::vector<std::string> values);
  FieldSpec& existing_path();  // see must_exist

  bool has_default() const { return !std::holds_alternative<std::monostate>(default_value); }
  // "> 0, <= 1", "one of: a, b", "kind model" — empty when there is no constraint.
  std::string constraints_text() const;
  // Checks a number against min/max; returns an empty string or what is wrong.
  std::string check_range(double v) const;
};

class TESSERA_API Schema {
 public:
  FieldSpec& boolean(std::string name, std::string doc);
  FieldSpec& integer(std::string name, std::string doc);
  FieldSpec& number(std::string name, std::string doc);
  FieldSpec& string(std::string name, std::string doc);
  FieldSpec& integers(std::string name, std::string doc);
  FieldSpec& numbers(std::string name, std::string doc);
  FieldSpec& strings(std::string name, std::string doc);
  // A nested component of the given kind: inline {component_key, variant_key, config} or a
  // reference {instance_key: NAME, pass_type: BY_REFERENCE}.
  FieldSpec& component(std::string name, std::string kind, std::string doc);
  // A list of nested components of the given kind, each inline or a reference.
  FieldSpec& components(std::string name, std::string kind, std::string doc);

  const std::vector<FieldSpec>& fields() const { return fields_; }
  const FieldSpec* find(const std::string& name) const;

  // The device-mesh axes the component itself splits its work over beyond data parallelism
  // ("tp", ...; tessera/run/parallel_dims.hpp): validation refuses a spec whose
  // `parallelism:` asks a model for an axis it does not list.
  void splits_over(std::string axis);
  const std::vector<std::string>& mesh_axes() const { return mesh_axes_; }
  bool splits_over_axis(const std::string& axis) const;

 private:
  FieldSpec& add(std::string name, FieldType type, std::string doc);
  std::vector<FieldSpec> fields_;
  std::vector<std::string> mesh_axes_;
};

// Renders a value for messages and docs: 6e-4, "text", [1, 2], true.
TESSERA_API std::string to_display_string(const Value& value);

}  // namespace tessera
