// The run spec as a tree that remembers where every value came from: the node, positions, the
// error type that carries them, config paths, and rendering a tree back as YAML.
#include "tessera/core/config/config_tree.hpp"

#include <yaml-cpp/yaml.h>

#include <limits>

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

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string current;
  for (size_t i = 0; i < path.size(); ++i) {
    const char c = path[i];
    const size_t close = c == '[' && !current.empty() ? path.find(']', i) : std::string::npos;
    if (c == '.') {
      parts.push_back(current);
      current.clear();
    } else if (close != std::string::npos) {
      // "a[3]", as messages write a path (index_path): the index is a part of its own.
      parts.push_back(current);
      current = path.substr(i + 1, close - i - 1);
      i = close;
    } else {
      current += c;
    }
  }
  parts.push_back(current);
  return parts;
}

bool parse_index(const std::string& s, size_t& out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  // Digits beyond what an index can be are an index past any list's end, not an overflow.
  out = s.size() > 18 ? std::numeric_limits<size_t>::max() : static_cast<size_t>(std::stoull(s));
  return true;
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

}  // namespace

std::string ConfigNode::to_yaml() const {
  YAML::Emitter out;
  emit(out, *this);
  return std::string(out.c_str()) + "\n";
}

}  // namespace tessera::core
