// The run spec as a tree that remembers where every value came from (file, line, column), so
// every config error can point at its source, through includes, overrides and interpolation.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessera/error.hpp"

namespace tessera::core {

struct SourcePos {
  std::string file;
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based
  std::string to_string() const;  // "file:line:col"
};

class ConfigNode {
 public:
  enum class Type { null, scalar, map, sequence };
  struct Entry;

  ConfigNode() = default;
  static ConfigNode make_scalar(std::string value, bool plain, SourcePos pos);
  static ConfigNode make_map(SourcePos pos);
  static ConfigNode make_sequence(SourcePos pos);
  static ConfigNode make_null(SourcePos pos);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_scalar() const { return type_ == Type::scalar; }
  bool is_map() const { return type_ == Type::map; }
  bool is_sequence() const { return type_ == Type::sequence; }
  const SourcePos& pos() const { return pos_; }
  const char* type_name() const;

  // Scalars. `plain` is false for quoted YAML scalars, which are always strings.
  const std::string& scalar() const { return scalar_; }
  bool plain() const { return plain_; }

  // Maps keep their YAML order.
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Entry>& entries() { return entries_; }
  const ConfigNode* find(const std::string& key) const;
  ConfigNode* find(const std::string& key);
  const Entry* find_entry(const std::string& key) const;
  // Inserts or replaces; returns the stored node.
  ConfigNode& set(const std::string& key, ConfigNode value, SourcePos key_pos = {});
  bool erase(const std::string& key);
  std::vector<std::string> keys() const;

  const std::vector<ConfigNode>& items() const { return items_; }
  std::vector<ConfigNode>& items() { return items_; }

  // Renders the tree as YAML (used for the resolved config in the run directory).
  std::string to_yaml() const;

 private:
  Type type_ = Type::null;
  SourcePos pos_;
  std::string scalar_;
  bool plain_ = true;
  std::vector<Entry> entries_;
  std::vector<ConfigNode> items_;
};

struct ConfigNode::Entry {
  std::string key;
  SourcePos key_pos;
  ConfigNode value;
};

// A config mistake with its place: what() is "FILE:LINE:COL: PATH: MESSAGE".
class ConfigIssue : public tessera::ConfigError {
 public:
  ConfigIssue(SourcePos pos, std::string path, std::string message);
  const SourcePos& pos() const { return pos_; }
  const std::string& path() const { return path_; }
  const std::string& message() const { return message_; }

 private:
  SourcePos pos_;
  std::string path_;
  std::string message_;
};

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string join_path(const std::string& parent, const std::string& key);
std::string index_path(const std::string& parent, size_t index);  // "a.b[3]"
// "a.b.0" and "a.b[0]" -> {"a", "b", "0"} (empty parts kept, for the caller to reject).
std::vector<std::string> split_path(const std::string& path);
// A path part that indexes a sequence: only digits.
bool parse_index(const std::string& part, size_t& out);

}  // namespace tessera::core
