// The registry keeps one entry per (kind, variant); a second registration is an error that
// names both plugin files, never a silent overwrite.
#include "tessera/registry.hpp"

#include <set>

#include "tessera/error.hpp"

namespace tessera {

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::add(ComponentInfo info) {
  auto key = std::make_pair(info.kind, info.variant);
  auto it = components_.find(key);
  if (it != components_.end()) {
    throw Error("duplicate component " + info.kind + "/" + info.variant + ": registered by " +
                it->second.origin + " and again by " + info.origin +
                "; remove one of the two plugins from the search path");
  }
  components_.emplace(std::move(key), std::move(info));
}

const ComponentInfo* Registry::find(const std::string& kind, const std::string& variant) const {
  auto it = components_.find({kind, variant});
  return it == components_.end() ? nullptr : &it->second;
}

std::vector<const ComponentInfo*> Registry::list(const std::string& kind) const {
  std::vector<const ComponentInfo*> out;
  for (const auto& [key, info] : components_) {
    if (kind.empty() || key.first == kind) out.push_back(&info);
  }
  return out;
}

std::vector<std::string> Registry::kinds() const {
  std::set<std::string> kinds;
  for (const auto& [key, info] : components_) kinds.insert(key.first);
  return {kinds.begin(), kinds.end()};
}

std::vector<std::string> Registry::variants(const std::string& kind) const {
  std::vector<std::string> out;
  for (const auto& [key, info] : components_) {
    if (key.first == kind) out.push_back(key.second);
  }
  return out;
}

void Registry::clear() { components_.clear(); }

Registrar::Registrar(Registry& registry, std::string origin,
                     std::shared_ptr<const void> keep_alive)
    : registry_(registry), origin_(std::move(origin)), keep_alive_(std::move(keep_alive)) {}

void Registrar::add_any(std::string kind, std::string variant, std::string doc, Schema schema,
                        AnyFactory factory, AnyCheck check) {
  ComponentInfo info;
  info.keep_alive = keep_alive_;
  info.kind = std::move(kind);
  info.variant = std::move(variant);
  info.doc = std::move(doc);
  info.schema = std::move(schema);
  info.origin = origin_;
  info.make = std::move(factory);
  info.check = std::move(check);
  registry_.add(std::move(info));
}

}  // namespace tessera
