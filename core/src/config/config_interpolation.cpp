// `${env:VAR}` and `${path.to.key}` in a spec's scalars, after includes and overrides.
#include "tessera/core/config/config_interpolation.hpp"

#include <cstdlib>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "tessera/core/config/config_file.hpp"
#include "tessera/core/config/suggest.hpp"

namespace tessera::core {

namespace {

class Interpolator {
 public:
  explicit Interpolator(ConfigNode& root) : root_(root) {}

  void resolve(ConfigNode& node, const std::string& path) {
    if (node.is_scalar()) {
      if (node.scalar().find("${") != std::string::npos) node = expand(node, path);
    } else if (node.is_map()) {
      for (auto& e : node.entries()) resolve(e.value, join_path(path, e.key));
    } else if (node.is_sequence()) {
      for (size_t i = 0; i < node.items().size(); ++i) resolve(node.items()[i], index_path(path, i));
    }
  }

 private:
  // Returns the scalar with every ${...} replaced; a scalar that is one whole ${path} becomes a
  // copy of the referenced node.
  ConfigNode expand(const ConfigNode& node, const std::string& path) {
    const std::string& text = node.scalar();
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
      size_t open = text.find("${", i);
      if (open == std::string::npos) {
        out += text.substr(i);
        break;
      }
      out += text.substr(i, open - i);
      size_t close = text.find('}', open);
      if (close == std::string::npos) {
        throw ConfigIssue(node.pos(), path, "unterminated ${ in '" + text + "'");
      }
      const std::string expr = text.substr(open + 2, close - open - 2);
      if (expr.rfind("env:", 0) == 0) {
        const std::string var = expr.substr(4);
        const char* value = std::getenv(var.c_str());
        if (!value) {
          throw ConfigIssue(node.pos(), path,
                            "environment variable " + var + " is not set (used as ${env:" + var +
                                "}); export it or change the value");
        }
        // A whole value that is one ${env:...} reads as if written there unquoted (a number is
        // a number), as a whole ${path} keeps its target's type; flow style must quote it.
        if (open == 0 && close + 1 == text.size() && *value != '\0') {
          return ConfigNode::make_scalar(value, /*plain=*/true, node.pos());
        }
        out += value;
      } else {
        ConfigNode target = lookup(expr, node, path);
        copied_ += count_nodes(target);
        copied_bytes_ += count_bytes(target);
        if (copied_ > config_limits::kMaxInterpolatedNodes) {
          throw ConfigIssue(node.pos(), path, "${...} references copy more than " +
                                                  std::to_string(config_limits::kMaxInterpolatedNodes) +
                                                  " values in all (references of references?)");
        }
        if (copied_bytes_ > config_limits::kMaxExpandedTreeBytes) {
          throw ConfigIssue(node.pos(), path, "${...} references copy more than " +
                                                  std::to_string(config_limits::kMaxExpandedTreeBytes) +
                                                  " bytes in all (references of a long value?)");
        }
        if (open == 0 && close + 1 == text.size()) return target;
        if (!target.is_scalar()) {
          throw ConfigIssue(node.pos(), path, "${" + expr + "} is " + target.type_name() +
                                                  " and cannot be part of a string");
        }
        out += target.scalar();
      }
      i = close + 1;
      if (out.size() > config_limits::kMaxExpandedBytes) {
        throw ConfigIssue(node.pos(), path, "the value grows past " + std::to_string(config_limits::kMaxExpandedBytes) +
                                                " bytes as ${...} are replaced");
      }
    }
    return ConfigNode::make_scalar(out, node.plain(), node.pos());
  }

  static std::size_t count_bytes(const ConfigNode& node) {
    std::size_t n = node.is_scalar() ? node.scalar().size() : 0;
    for (const auto& e : node.entries()) n += e.key.size() + count_bytes(e.value);
    for (const auto& item : node.items()) n += count_bytes(item);
    return n;
  }

  static std::int64_t count_nodes(const ConfigNode& node) {
    std::int64_t n = 1;
    for (const auto& e : node.entries()) n += count_nodes(e.value);
    for (const auto& item : node.items()) n += count_nodes(item);
    return n;
  }

  ConfigNode lookup(const std::string& expr, const ConfigNode& at, const std::string& path) {
    if (active_.count(expr)) {
      throw ConfigIssue(at.pos(), path, "interpolation cycle through ${" + expr + "}");
    }
    if (active_.size() >= config_limits::kMaxInterpolationDepth) {
      throw ConfigIssue(at.pos(), path, "${...} references nest deeper than " +
                                            std::to_string(config_limits::kMaxInterpolationDepth));
    }
    const ConfigNode* node = &root_;
    std::string walked;
    std::deque<ConfigNode> resolved;  // the parts on the way that were themselves one ${...}
    const std::vector<std::string> parts = split_path(expr);
    for (size_t k = 0; k < parts.size(); ++k) {
      const std::string& part = parts[k];
      size_t index = 0;
      const ConfigNode* next = nullptr;
      if (node->is_map()) {
        next = node->find(part);
        if (!next) {
          throw ConfigIssue(at.pos(), path, "${" + expr + "}: no key '" + part + "' in " +
                                                (walked.empty() ? "the spec" : walked) +
                                                did_you_mean(part, node->keys()));
        }
      } else if (node->is_sequence() && parse_index(part, index) && index < node->items().size()) {
        next = &node->items()[index];
      } else {
        throw ConfigIssue(at.pos(), path, "${" + expr + "}: " + (walked.empty() ? "spec" : walked) +
                                              " has no element '" + part + "'");
      }
      node = next;
      walked = join_path(walked, part);
      // A part on the way that is a whole ${...} (not yet replaced: it comes later in the spec)
      // is resolved here, so the result does not depend on the order of keys.
      if (k + 1 < parts.size() && node->is_scalar() && node->scalar().find("${") != std::string::npos) {
        if (active_.count(walked)) {
          throw ConfigIssue(at.pos(), path, "interpolation cycle through ${" + walked + "}");
        }
        active_.insert(walked);
        resolved.push_back(*node);
        resolve(resolved.back(), walked);
        active_.erase(walked);
        node = &resolved.back();
      }
    }
    // The target may itself hold interpolations: resolve a copy of it first.
    active_.insert(expr);
    ConfigNode copy = *node;
    resolve(copy, walked);
    active_.erase(expr);
    return copy;
  }

  ConfigNode& root_;
  std::int64_t copied_ = 0;        // values copied by ${...} so far
  std::size_t copied_bytes_ = 0;   // and their bytes
  std::set<std::string> active_;
};

}  // namespace

void resolve_interpolations(ConfigNode& root) {
  Interpolator interpolator(root);
  interpolator.resolve(root, "");
}

}  // namespace tessera::core
