// The component registry: every (kind, variant) a loaded plugin offers, with its schema, its doc
// and the file it came from. Kinds are open: a plugin may register a kind no other plugin knows.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/config/component_config.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"
#include "tessera/config/schema.hpp"

namespace tessera {

using AnyFactory = std::function<std::shared_ptr<void>(const ComponentConfig&)>;
// Checks a config the host validated against the schema without building anything (the
// declared rules); throws ConfigError. Empty when the component declares none.
using AnyCheck = std::function<void(const ComponentConfig&)>;

struct TESSERA_API ComponentInfo {
  // Declared first so it is destroyed last: it keeps the plugin's library loaded while `make`
  // (whose code lives in that library) is destroyed.
  std::shared_ptr<const void> keep_alive;
  std::string kind;
  std::string variant;
  std::string doc;
  Schema schema;
  std::string origin;  // the plugin file that registered it
  AnyFactory make;
  AnyCheck check;
};

class TESSERA_API Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Throws tessera::Error naming both files when (kind, variant) is already registered.
  void add(ComponentInfo info);
  const ComponentInfo* find(const std::string& kind, const std::string& variant) const;
  std::vector<const ComponentInfo*> list(const std::string& kind = {}) const;
  std::vector<std::string> kinds() const;
  std::vector<std::string> variants(const std::string& kind) const;
  void clear();

 private:
  std::map<std::pair<std::string, std::string>, ComponentInfo> components_;
};

// What a plugin's register function receives: adds components on behalf of one plugin file.
class TESSERA_API Registrar {
 public:
  Registrar(Registry& registry, std::string origin, std::shared_ptr<const void> keep_alive);

  // Registers `variant` of Interface::kKind with the config Config declares
  // (tessera/config/config_fields.hpp). `factory` takes `const Config&` (and optionally the run's
  // `const RunContext&`) and returns a std::shared_ptr to Interface or a class derived from it.
  template <class Interface, class Config, class Factory>
  void add(std::string variant, std::string doc, Factory factory) {
    auto fields = std::make_shared<const ConfigFields<Config>>(declared_fields<Config>());
    Schema schema = fields->schema();
    add_any(
        Interface::kKind, std::move(variant), std::move(doc), std::move(schema),
        [fields, factory](const ComponentConfig& values) -> std::shared_ptr<void> {
          const Config config = fields->read(values);
          std::shared_ptr<Interface> object;
          if constexpr (std::is_invocable_v<const Factory&, const Config&, const RunContext&>) {
            object = factory(config, values.context());
          } else {
            object = factory(config);
          }
          return object;
        },
        [fields](const ComponentConfig& values) { fields->read(values); });
  }

  // The untyped form the typed add() is built on: a schema, and a factory that reads the values
  // by name. For plugins whose fields are only known at run time.
  void add_any(std::string kind, std::string variant, std::string doc, Schema schema,
               AnyFactory factory, AnyCheck check = {});
  const std::string& origin() const { return origin_; }

 private:
  Registry& registry_;
  std::string origin_;
  std::shared_ptr<const void> keep_alive_;
};

}  // namespace tessera
