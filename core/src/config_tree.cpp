// Loading YAML into ConfigNode trees (with positions), includes, --set overrides and ${...}
// interpolation.
#include "tessera/core/config_tree.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tessera/core/suggest.hpp"

namespace fs = std::filesystem;

namespace tessera::core {

std::string SourcePos::to_string() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

namespace {
std::string issue_text(const SourcePos& pos, const std::string& path, const std::string& message) {
  std::string out = pos.to_string();
  if (!out.empty()) out += ": ";
  if (!path.empty()) out += path + ": ";
  return out + message;
}
}  // namespace

ConfigIssue::ConfigIssue(SourcePos pos, std::string path, std::string message)
    : tessera::ConfigError(issue_text(pos, path, message)),
      pos_(std::move(pos)),
      path_(std::move(path)),
      message_(std::move(message)) {}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
std::string index_path(const std::string& parent, size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

ConfigNode ConfigNode::make_scalar(std::string value, bool plain, SourcePos pos) {
  ConfigNode n;
  n.type_ = Type::scalar;
  n.scalar_ = std::move(value);
  n.plain_ = plain;
  n.pos_ = std::move(pos);
  return n;
}
ConfigNode ConfigNode::make_map(SourcePos pos) {
  ConfigNode n;
  n.type_ = Type::map;
  n.pos_ = std::move(pos);
  return n;
}
ConfigNode ConfigNode::make_sequence(SourcePos pos) {
  ConfigNode n;
  n.type_ = Type::sequence;
  n.pos_ = std::move(pos);
  return n;
}
ConfigNode ConfigNode::make_null(SourcePos pos) {
  ConfigNode n;
  n.pos_ = std::move(pos);
  return n;
}

const char* ConfigNode::type_name() const {
  switch (type_) {
    case Type::null: return "null";
    case Type::scalar: return "a scalar";
    case Type::map: return "a mapping";
    case Type::sequence: return "a list";
  }
  return "?";
}

const ConfigNode::Entry* ConfigNode::find_entry(const std::string& key) const {
  for (const auto& e : entries_) {
    if (e.key == key) return &e;
  }
  return nullptr;
}
const ConfigNode* ConfigNode::find(const std::string& key) const {
  const Entry* e = find_entry(key);
  return e ? &e->value : nullptr;
}
ConfigNode* ConfigNode::find(const std::string& key) {
  for (auto& e : entries_) {
    if (e.key == key) return &e.value;
  }
  return nullptr;
}
ConfigNode& ConfigNode::set(const std::string& key, ConfigNode value, SourcePos key_pos) {
  if (type_ != Type::map) {
    type_ = Type::map;
    scalar_.clear();
    items_.clear();
  }
  for (auto& e : entries_) {
    if (e.key == key) {
      e.value = std::move(value);
      return e.value;
    }
  }
  entries_.push_back(Entry{key, key_pos.line ? key_pos : value.pos(), std::move(value)});
  return entries_.back().value;
}
bool ConfigNode::erase(const std::string& key) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key == key) {
      entries_.erase(it);
      return true;
    }
  }
  return false;
}
std::vector<std::string> ConfigNode::keys() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.key);
  return out;
}

namespace {

void emit(YAML::Emitter& out, const ConfigNode& node) {
  switch (node.type()) {
    case ConfigNode::Type::null: out << YAML::Null; break;
    case ConfigNode::Type::scalar:
      if (node.plain()) {
        out << node.scalar();
      } else {
        out << YAML::DoubleQuoted << node.scalar();
      }
      break;
    case ConfigNode::Type::map:
      out << YAML::BeginMap;
      for (const auto& e : node.entries()) {
        out << YAML::Key << e.key << YAML::Value;
        emit(out, e.value);
      }
      out << YAML::EndMap;
      break;
    case ConfigNode::Type::sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node.items()) emit(out, item);
      out << YAML::EndSeq;
      break;
  }
}

SourcePos pos_of(const YAML::Mark& mark, const std::string& file) {
  return SourcePos{file, mark.line + 1, mark.column + 1};
}

ConfigNode from_yaml(const YAML::Node& node, const std::string& file) {
  SourcePos pos = pos_of(node.Mark(), file);
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return ConfigNode::make_null(pos);
    case YAML::NodeType::Scalar:
      // yaml-cpp tags plain scalars "?" and quoted ones "!".
      return ConfigNode::make_scalar(node.Scalar(), node.Tag() != "!", pos);
    case YAML::NodeType::Sequence: {
      ConfigNode seq = ConfigNode::make_sequence(pos);
      for (const auto& item : node) seq.items().push_back(from_yaml(item, file));
      return seq;
    }
    case YAML::NodeType::Map: {
      ConfigNode map = ConfigNode::make_map(pos);
      for (auto it = node.begin(); it != node.end(); ++it) {
        SourcePos key_pos = pos_of(it->first.Mark(), file);
        if (!it->first.IsScalar()) throw ConfigIssue(key_pos, "", "mapping keys must be plain names");
        const std::string key = it->first.Scalar();
        if (map.find(key)) throw ConfigIssue(key_pos, "", "duplicate key '" + key + "'");
        map.entries().push_back({key, key_pos, from_yaml(it->second, file)});
      }
      return map;
    }
  }
  return ConfigNode::make_null(pos);
}

ConfigNode parse_yaml(const std::string& text, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigIssue(pos_of(e.mark, source_name), "", "invalid YAML: " + e.msg);
  }
  return from_yaml(root, source_name);
}

std::vector<std::string> include_list(const ConfigNode& include) {
  std::vector<std::string> out;
  if (include.is_scalar()) {
    out.push_back(include.scalar());
  } else if (include.is_sequence()) {
    for (const auto& item : include.items()) {
      if (!item.is_scalar()) throw ConfigIssue(item.pos(), "include", "expected a file name");
      out.push_back(item.scalar());
    }
  } else {
    throw ConfigIssue(include.pos(), "include", "expected a file name or a list of file names");
  }
  return out;
}

ConfigNode load_with_includes(const fs::path& path, std::vector<fs::path>& stack,
                              const SourcePos& included_from) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  for (const auto& open : stack) {
    if (open == canonical) {
      throw ConfigIssue(included_from, "include", "include cycle: " + path.string() +
                                                      " is already being loaded");
    }
  }
  std::ifstream in(path);
  if (!in) {
    throw ConfigIssue(included_from, included_from.file.empty() ? "" : "include",
                      "cannot read config file " + path.string());
  }
  std::stringstream text;
  text << in.rdbuf();
  ConfigNode node = parse_yaml(text.str(), path.string());
  if (node.is_null()) node = ConfigNode::make_map(SourcePos{path.string(), 1, 1});
  if (!node.is_map()) {
    throw ConfigIssue(node.pos(), "", "a run spec must be a mapping at the top level");
  }
  const ConfigNode::Entry* include = node.find_entry("include");
  if (!include) return node;

  stack.push_back(canonical);
  ConfigNode merged = ConfigNode::make_map(node.pos());
  for (const auto& name : include_list(include->value)) {
    fs::path target = fs::path(name).is_absolute() ? fs::path(name) : path.parent_path() / name;
    deep_merge(merged, load_with_includes(target, stack, include->value.pos()));
  }
  stack.pop_back();
  node.erase("include");
  deep_merge(merged, node);
  return merged;
}

}  // namespace

std::string ConfigNode::to_yaml() const {
  YAML::Emitter out;
  emit(out, *this);
  return std::string(out.c_str()) + "\n";
}

ConfigNode load_config_file(const std::string& path) {
  std::vector<fs::path> stack;
  return load_with_includes(fs::path(path), stack, SourcePos{});
}

ConfigNode parse_config_string(const std::string& text, const std::string& source_name) {
  return parse_yaml(text, source_name);
}

void deep_merge(ConfigNode& base, const ConfigNode& overlay) {
  if (!base.is_map() || !overlay.is_map()) {
    base = overlay;
    return;
  }
  for (const auto& e : overlay.entries()) {
    if (ConfigNode* existing = base.find(e.key); existing && existing->is_map() && e.value.is_map()) {
      deep_merge(*existing, e.value);
    } else {
      base.set(e.key, e.value, e.key_pos);
    }
  }
}

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string current;
  for (char c : path) {
    if (c == '.') {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  parts.push_back(current);
  return parts;
}

bool parse_index(const std::string& s, size_t& out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoul(s);
  return true;
}

}  // namespace

void apply_override(ConfigNode& root, const std::string& assignment) {
  const std::string source = "--set " + assignment;
  SourcePos pos{"--set", 0, 0};
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigIssue(pos, "", "expected KEY=VALUE, got '" + assignment + "'");
  }
  const std::string key = assignment.substr(0, eq);
  ConfigNode value = parse_yaml(assignment.substr(eq + 1), source);
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
        out += value;
      } else {
        ConfigNode target = lookup(expr, node, path);
        if (open == 0 && close + 1 == text.size()) return target;
        if (!target.is_scalar()) {
          throw ConfigIssue(node.pos(), path, "${" + expr + "} is " + target.type_name() +
                                                  " and cannot be part of a string");
        }
        out += target.scalar();
      }
      i = close + 1;
    }
    return ConfigNode::make_scalar(out, node.plain(), node.pos());
  }

  ConfigNode lookup(const std::string& expr, const ConfigNode& at, const std::string& path) {
    if (active_.count(expr)) {
      throw ConfigIssue(at.pos(), path, "interpolation cycle through ${" + expr + "}");
    }
    const ConfigNode* node = &root_;
    std::string walked;
    for (const auto& part : split_path(expr)) {
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
    }
    // The target may itself hold interpolations: resolve a copy of it first.
    active_.insert(expr);
    ConfigNode copy = *node;
    resolve(copy, walked);
    active_.erase(expr);
    return copy;
  }

  ConfigNode& root_;
  std::set<std::string> active_;
};

}  // namespace

void resolve_interpolations(ConfigNode& root) {
  Interpolator interpolator(root);
  interpolator.resolve(root, "");
}

}  // namespace tessera::core
