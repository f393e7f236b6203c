// The validated config a factory builds from: every declared field, defaults filled in, types
// checked, nested components already built.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/run/context.hpp"
#include "tessera/error.hpp"
#include "tessera/export.hpp"
#include "tessera/config/value.hpp"

namespace tessera {

class TESSERA_API ComponentConfig {
 public:
  // `given`: the fields the YAML wrote itself (the others hold their defaults).
  ComponentConfig(std::string path, std::map<std::string, Value> values, RunContext context,
                  std::set<std::string> given = {});

  // False only for optional() fields that the YAML left out.
  bool has(const std::string& name) const;
  // Whether the YAML wrote this field (rather than leaving it to its default).
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  const std::set<std::string>& given_names() const { return given_; }
  bool boolean(const std::string& name) const;
  std::int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  const std::string& string(const std::string& name) const;
  const std::vector<std::int64_t>& integers(const std::string& name) const;
  const std::vector<double>& numbers(const std::string& name) const;
  const std::vector<std::string>& strings(const std::string& name) const;
  const ComponentHandle& handle(const std::string& name) const;
  const std::vector<ComponentHandle>& handles(const std::string& name) const;

  // A nested component as its interface type, e.g. config.component<Model>("model").
  template <class Interface>
  std::shared_ptr<Interface> component(const std::string& name) const {
    const ComponentHandle& h = handle(name);
    if (h.kind != Interface::kKind) {
      throw ConfigError("expected a component of kind " + std::string(Interface::kKind) +
                            ", got " + h.kind + "/" + h.variant,
                        name);
    }
    return std::static_pointer_cast<Interface>(h.object);
  }

  // A list of nested components as their interface type, in the YAML's order.
  template <class Interface>
  std::vector<std::shared_ptr<Interface>> components(const std::string& name) const {
    std::vector<std::shared_ptr<Interface>> out;
    for (const ComponentHandle& h : handles(name)) {
      if (h.kind != Interface::kKind) {
        throw ConfigError("expected components of kind " + std::string(Interface::kKind) + ", got " + h.kind + "/" +
                              h.variant,
                          name);
      }
      out.push_back(std::static_pointer_cast<Interface>(h.object));
    }
    return out;
  }

  // The config path of this component, e.g. "components.optimizer".
  const std::string& path() const { return path_; }
  const RunContext& context() const { return context_; }

 private:
  const Value& get(const std::string& name) const;
  template <class T>
  const T& get_as(const std::string& name, const char* type_name) const;

  std::string path_;
  std::map<std::string, Value> values_;
  RunContext context_;
  std::set<std::string> given_;
};

}  // namespace tessera
