// Typed access to a validated component config. A wrong accessor is a plugin bug, reported with
// the field name and both types.
#include "tessera/config/component_config.hpp"

#include "tessera/config/schema.hpp"

namespace tessera {

ComponentConfig::ComponentConfig(std::string path, std::map<std::string, Value> values,
                                 RunContext context, std::set<std::string> given)
    : path_(std::move(path)), values_(std::move(values)), context_(std::move(context)), given_(std::move(given)) {}

bool ComponentConfig::has(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && !std::holds_alternative<std::monostate>(it->second);
}

const Value& ComponentConfig::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || std::holds_alternative<std::monostate>(it->second)) {
    throw Error(path_ + ".config." + name +
                ": the plugin read a field that is not declared or not set (check has() for "
                "optional fields)");
  }
  return it->second;
}

template <class T>
const T& ComponentConfig::get_as(const std::string& name, const char* type_name) const {
  const Value& v = get(name);
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw Error(path_ + ".config." + name + ": the plugin read it as " + type_name +
              " but its value is " + to_display_string(v));
}

bool ComponentConfig::boolean(const std::string& n) const { return get_as<bool>(n, "bool"); }
std::int64_t ComponentConfig::integer(const std::string& n) const {
  return get_as<std::int64_t>(n, "int");
}
double ComponentConfig::number(const std::string& n) const {
  const Value& v = get(n);
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return get_as<double>(n, "float");
}
const std::string& ComponentConfig::string(const std::string& n) const {
  return get_as<std::string>(n, "string");
}
const std::vector<std::int64_t>& ComponentConfig::integers(const std::string& n) const {
  return get_as<std::vector<std::int64_t>>(n, "list[int]");
}
const std::vector<double>& ComponentConfig::numbers(const std::string& n) const {
  return get_as<std::vector<double>>(n, "list[float]");
}
const std::vector<std::string>& ComponentConfig::strings(const std::string& n) const {
  return get_as<std::vector<std::string>>(n, "list[string]");
}
const ComponentHandle& ComponentConfig::handle(const std::string& n) const {
  return get_as<ComponentHandle>(n, "component");
}
const std::vector<ComponentHandle>& ComponentConfig::handles(const std::string& n) const {
  return get_as<std::vector<ComponentHandle>>(n, "list[component]");
}

}  // namespace tessera
