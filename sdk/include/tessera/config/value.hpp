// A typed config value as a factory receives it, after the host has validated it against the
// component's schema. Nested components arrive already built, as a ComponentHandle (a list of
// them as a vector of handles).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace tessera {

// A built component: its kind (which says what interface `object` points to) and the object.
struct ComponentHandle {
  std::string kind;
  std::string variant;
  std::shared_ptr<void> object;
};

using Value = std::variant<std::monostate, bool, std::int64_t, double, std::string,
                           std::vector<std::int64_t>, std::vector<double>,
                           std::vector<std::string>, ComponentHandle, std::vector<ComponentHandle>>;

}  // namespace tessera
