// Schema declaration helpers and the text they show in `tessera describe` and error messages.
#include "tessera/config/schema.hpp"

#include <cmath>
#include <sstream>

namespace tessera {

const char* to_string(FieldType type) {
  switch (type) {
    case FieldType::boolean: return "bool";
    case FieldType::integer: return "int";
    case FieldType::number: return "float";
    case FieldType::string: return "string";
    case FieldType::integers: return "list[int]";
    case FieldType::numbers: return "list[float]";
    case FieldType::strings: return "list[string]";
    case FieldType::component: return "component";
    case FieldType::components: return "list[component]";
  }
  return "?";
}

namespace {
std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
}  // namespace

FieldSpec& FieldSpec::default_to(bool v) {
  default_value = v;
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(long long v) {
  if (type == FieldType::number) {
    default_value = static_cast<double>(v);
  } else {
    default_value = static_cast<std::int64_t>(v);
  }
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(int v) { return default_to(static_cast<long long>(v)); }
FieldSpec& FieldSpec::default_to(long v) { return default_to(static_cast<long long>(v)); }
FieldSpec& FieldSpec::default_to(double v) {
  default_value = v;
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(const char* v) { return default_to(std::string(v)); }
FieldSpec& FieldSpec::default_to(std::string v) {
  default_value = std::move(v);
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(std::vector<std::int64_t> v) {
  if (type == FieldType::numbers) {
    default_value = std::vector<double>(v.begin(), v.end());
  } else {
    default_value = std::move(v);
  }
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(std::vector<double> v) {
  default_value = std::move(v);
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::default_to(std::vector<std::string> v) {
  default_value = std::move(v);
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::optional() {
  is_required = false;
  return *this;
}
FieldSpec& FieldSpec::required() {
  default_value = std::monostate{};
  is_required = true;
  return *this;
}
FieldSpec& FieldSpec::at_least(double v) {
  min = v;
  min_exclusive = false;
  return *this;
}
FieldSpec& FieldSpec::greater_than(double v) {
  min = v;
  min_exclusive = true;
  return *this;
}
FieldSpec& FieldSpec::at_most(double v) {
  max = v;
  max_exclusive = false;
  return *this;
}
FieldSpec& FieldSpec::less_than(double v) {
  max = v;
  max_exclusive = true;
  return *this;
}
FieldSpec& FieldSpec::one_of(std::vector<std::string> values) {
  choices = std::move(values);
  return *this;
}

FieldSpec& FieldSpec::existing_path() {
  must_exist = true;
  return *this;
}

std::string FieldSpec::constraints_text() const {
  std::vector<std::string> parts;
  if (min) parts.push_back((min_exclusive ? "> " : ">= ") + number_text(*min));
  if (max) parts.push_back((max_exclusive ? "< " : "<= ") + number_text(*max));
  if (!choices.empty()) {
    std::string s = "one of: ";
    for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
    parts.push_back(s);
  }
  if (must_exist) parts.push_back("an existing path");
  if (type == FieldType::component || type == FieldType::components) parts.push_back("kind " + component_kind);
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

std::string FieldSpec::check_range(double v) const {
  if (std::isnan(v)) return "expected a number, got nan";
  bool low = min && (min_exclusive ? !(v > *min) : !(v >= *min));
  bool high = max && (max_exclusive ? !(v < *max) : !(v <= *max));
  if (low || high) return "must be " + constraints_text() + ", got " + number_text(v);
  return {};
}

FieldSpec& Schema::add(std::string name, FieldType type, std::string doc) {
  FieldSpec spec;
  spec.name = std::move(name);
  spec.type = type;
  spec.doc = std::move(doc);
  fields_.push_back(std::move(spec));
  return fields_.back();
}

FieldSpec& Schema::boolean(std::string n, std::string d) { return add(std::move(n), FieldType::boolean, std::move(d)); }
FieldSpec& Schema::integer(std::string n, std::string d) { return add(std::move(n), FieldType::integer, std::move(d)); }
FieldSpec& Schema::number(std::string n, std::string d) { return add(std::move(n), FieldType::number, std::move(d)); }
FieldSpec& Schema::string(std::string n, std::string d) { return add(std::move(n), FieldType::string, std::move(d)); }
FieldSpec& Schema::integers(std::string n, std::string d) { return add(std::move(n), FieldType::integers, std::move(d)); }
FieldSpec& Schema::numbers(std::string n, std::string d) { return add(std::move(n), FieldType::numbers, std::move(d)); }
FieldSpec& Schema::strings(std::string n, std::string d) { return add(std::move(n), FieldType::strings, std::move(d)); }
FieldSpec& Schema::component(std::string n, std::string kind, std::string d) {
  FieldSpec& spec = add(std::move(n), FieldType::component, std::move(d));
  spec.component_kind = std::move(kind);
  return spec;
}
FieldSpec& Schema::components(std::string n, std::string kind, std::string d) {
  FieldSpec& spec = add(std::move(n), FieldType::components, std::move(d));
  spec.component_kind = std::move(kind);
  return spec;
}

const FieldSpec* Schema::find(const std::string& name) const {
  for (const auto& f : fields_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

void Schema::splits_over(std::string axis) {
  if (!splits_over_axis(axis)) mesh_axes_.push_back(std::move(axis));
}

bool Schema::splits_over_axis(const std::string& axis) const {
  for (const auto& a : mesh_axes_) {
    if (a == axis) return true;
  }
  return false;
}

namespace {
struct DisplayVisitor {
  std::string operator()(std::monostate) const { return "(none)"; }
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(std::int64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const { return number_text(v); }
  std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
  template <class T>
  std::string operator()(const std::vector<T>& v) const {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + (*this)(v[i]);
    return out + "]";
  }
  std::string operator()(const ComponentHandle& h) const { return h.kind + "/" + h.variant; }
};
}  // namespace

std::string to_display_string(const Value& value) { return std::visit(DisplayVisitor{}, value); }

}  // namespace tessera
