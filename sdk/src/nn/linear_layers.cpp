#include "tessera/nn/linear_layers.hpp"

namespace tessera {

std::vector<LinearLayer> linear_layers(Model& model) {
  std::vector<LinearLayer> layers;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto linear = std::dynamic_pointer_cast<Linear>(item.value())) layers.push_back({item.key(), std::move(linear)});
  }
  return layers;
}

bool matches_target(const std::string& path, const std::string& target) {
  if (target.empty()) return false;
  if (path == target) return true;
  return path.size() > target.size() && path.compare(path.size() - target.size(), target.size(), target) == 0 &&
         path[path.size() - target.size() - 1] == '.';
}

}  // namespace tessera
