// `--set a.b.c=VALUE`: one assignment applied to a loaded spec, VALUE parsed as YAML.
#include "tessera/core/config/config_override.hpp"

#include <string>
#include <vector>

#include "tessera/core/config/config_file.hpp"

namespace tessera::core {


void apply_override(ConfigNode& root, const std::string& assignment) {
  const std::string source = "--set " + assignment;
  SourcePos pos{"--set", 0, 0};
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigIssue(pos, "", "expected KEY=VALUE, got '" + assignment + "'");
  }
  const std::string key = assignment.substr(0, eq);
  ConfigNode value = parse_config_string(assignment.substr(eq + 1), source);
  const auto parts = split_path(key);
  ConfigNode* node = &root;
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (part.empty()) throw ConfigIssue(pos, key, "empty path component in '" + key + "'");
    const bool last = i + 1 == parts.size();
    size_t index = 0;
    if (node->is_sequence() && parse_index(part, index)) {
      if (index >= node->items().size()) {
        throw ConfigIssue(node->pos(), walked, "--set " + key + ": index " + part +
                                                   " is past the end of a list of " +
                                                   std::to_string(node->items().size()));
      }
      if (last) {
        node->items()[index] = value;
        return;
      }
      node = &node->items()[index];
    } else {
      if (!node->is_map() && !node->is_null()) {
        throw ConfigIssue(node->pos(), walked,
                          "--set " + key + ": cannot set a key inside " + node->type_name());
      }
      if (node->is_null()) *node = ConfigNode::make_map(pos);
      if (last) {
        node->set(part, value, pos);
        return;
      }
      ConfigNode* child = node->find(part);
      if (!child) child = &node->set(part, ConfigNode::make_map(pos), pos);
      node = child;
    }
    walked = join_path(walked, part);
  }
}

}  // namespace tessera::core
