#include "tessera/core/config/field_reader.hpp"

#include <glob.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tessera/core/config/suggest.hpp"

namespace tessera::core {
namespace {

std::string shown(const ConfigNode& node) {
  if (node.is_scalar()) return "\"" + node.scalar() + "\"";
  return node.type_name();
}

std::atomic<bool> path_checks{true};

// What keeps the component from reading `path`, or "" when it can: it exists, and a folder can
// be listed, a file opened for reading.
std::string unreadable(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if ((ec || !std::filesystem::exists(status)) && path.find_first_of("*?[") != std::string::npos) {
    // A glob (of Parquet shards, say): its matches must be readable, and there must be some.
    glob_t matches{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &matches);
    const std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + (rc == 0 ? matches.gl_pathc : 0));
    ::globfree(&matches);
    if (paths.empty()) return "no file or folder matches " + path;
    for (const auto& p : paths) {
      if (std::string why = unreadable(p); !why.empty()) return why;
    }
    return {};
  }
  if (ec || !std::filesystem::exists(status)) return "no such file or folder: " + path;
  const int mode = std::filesystem::is_directory(status) ? (R_OK | X_OK) : R_OK;
  if (::access(path.c_str(), mode) != 0) {
    const int error = errno;
    return "cannot read " + path + ": " + std::strerror(error);
  }
  return {};
}

bool parse_int(const std::string& s, std::int64_t& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && *end == '\0') {
    out = v;
    return true;
  }
  // 1e6 or 4.0 for an integer field is fine as long as the value is integral.
  char* dend = nullptr;
  double d = std::strtod(s.c_str(), &dend);
  if (*dend == '\0' && std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
    out = static_cast<std::int64_t>(d);
    return true;
  }
  return false;
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  // Finite numbers only: no field has a use for infinity, and 1e400 (out of range) or .inf
  // overflow the durations and counts made from them.
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return *end == '\0' && std::isfinite(out);
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "True" || s == "TRUE") {
    out = true;
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    out = false;
    return true;
  }
  return false;
}

std::string expected_number(const FieldSpec& f, const char* what) {
  std::string c = f.constraints_text();
  return std::string("expected ") + what + (c.empty() ? "" : " (" + c + ")");
}

Value read_scalar(const FieldSpec& f, FieldType type, const ConfigNode& node, const std::string& path) {
  if (!node.is_scalar()) {
    throw ConfigIssue(node.pos(), path, std::string("expected ") + to_string(type) + ", got " +
                                            node.type_name());
  }
  const std::string& s = node.scalar();
  switch (type) {
    case FieldType::boolean: {
      bool b = false;
      if (!node.plain() || !parse_bool(s, b)) {
        throw ConfigIssue(node.pos(), path, "expected true or false, got " + shown(node));
      }
      return b;
    }
    case FieldType::integer:
    case FieldType::integers: {
      std::int64_t v = 0;
      if (!node.plain() || !parse_int(s, v)) {
        throw ConfigIssue(node.pos(), path, expected_number(f, "an integer") + ", got " + shown(node));
      }
      if (std::string why = f.check_range(static_cast<double>(v)); !why.empty()) {
        throw ConfigIssue(node.pos(), path, why);
      }
      return v;
    }
    case FieldType::number:
    case FieldType::numbers: {
      double v = 0;
      if (!node.plain() || !parse_double(s, v)) {
        throw ConfigIssue(node.pos(), path, expected_number(f, "a finite number") + ", got " + shown(node));
      }
      if (std::string why = f.check_range(v); !why.empty()) throw ConfigIssue(node.pos(), path, why);
      return v;
    }
    case FieldType::string:
    case FieldType::strings: {
      if (!f.choices.empty()) {
        bool ok = false;
        for (const auto& c : f.choices) ok = ok || c == s;
        if (!ok) {
          throw ConfigIssue(node.pos(), path, "expected one of: " + join(f.choices) + ", got " +
                                                  shown(node) + did_you_mean(s, f.choices));
        }
      }
      if (f.must_exist && !s.empty() && path_checks.load()) {
        if (std::string why = unreadable(s); !why.empty()) {
          throw ConfigIssue(node.pos(), path, why + " (a path this component reads; relative paths start at " +
                                                  std::filesystem::current_path().string() + ")");
        }
      }
      return s;
    }
    case FieldType::component:
    case FieldType::components: break;
  }
  throw ConfigIssue(node.pos(), path, "internal: component field read as a plain value");
}

}  // namespace

void set_path_checks(bool on) { path_checks.store(on); }
bool path_checks_enabled() { return path_checks.load(); }

Value read_field(const FieldSpec& field, const ConfigNode& node, const std::string& path) {
  switch (field.type) {
    case FieldType::boolean:
    case FieldType::integer:
    case FieldType::number:
    case FieldType::string: return read_scalar(field, field.type, node, path);
    case FieldType::integers:
    case FieldType::numbers:
    case FieldType::strings: {
      if (!node.is_sequence()) {
        throw ConfigIssue(node.pos(), path, std::string("expected ") + to_string(field.type) +
                                                ", got " + shown(node));
      }
      std::vector<std::int64_t> ints;
      std::vector<double> doubles;
      std::vector<std::string> strings;
      for (size_t i = 0; i < node.items().size(); ++i) {
        Value v = read_scalar(field, field.type, node.items()[i], index_path(path, i));
        if (auto* p = std::get_if<std::int64_t>(&v)) ints.push_back(*p);
        if (auto* p = std::get_if<double>(&v)) doubles.push_back(*p);
        if (auto* p = std::get_if<std::string>(&v)) strings.push_back(*p);
      }
      if (field.type == FieldType::integers) return ints;
      if (field.type == FieldType::numbers) return doubles;
      return strings;
    }
    case FieldType::component:
    case FieldType::components: break;
  }
  throw ConfigIssue(node.pos(), path, "internal: component field read as a plain value");
}

void reject_unknown_keys(const Schema& schema, const ConfigNode& section, const std::string& path) {
  if (section.is_null()) return;
  if (!section.is_map()) {
    throw ConfigIssue(section.pos(), path, std::string("expected a mapping, got ") + section.type_name());
  }
  std::vector<std::string> known;
  for (const auto& f : schema.fields()) known.push_back(f.name);
  for (const auto& e : section.entries()) {
    if (!schema.find(e.key)) {
      throw ConfigIssue(e.key_pos, join_path(path, e.key),
                        "unknown key" + did_you_mean(e.key, known) +
                            (known.empty() ? "; this component takes no config"
                                           : "; known keys: " + join(known)));
    }
  }
}

std::map<std::string, Value> read_section(const Schema& schema, const ConfigNode* section,
                                          const SourcePos& owner_pos, const std::string& path) {
  if (section) reject_unknown_keys(schema, *section, path);
  std::map<std::string, Value> values;
  for (const auto& f : schema.fields()) {
    const ConfigNode* node = section && section->is_map() ? section->find(f.name) : nullptr;
    if (node && !node->is_null()) {
      values[f.name] = read_field(f, *node, join_path(path, f.name));
    } else if (f.is_required) {
      throw ConfigIssue(section && section->is_map() ? section->pos() : owner_pos,
                        join_path(path, f.name), "required " + std::string(to_string(f.type)) +
                                                     " is missing: " + f.doc);
    } else {
      values[f.name] = f.default_value;
    }
  }
  return values;
}

ConfigIssue positioned(const ConfigError& error, const ConfigNode* config, const SourcePos& fallback,
                       const std::string& path) {
  const ConfigNode::Entry* field =
      config && config->is_map() && !error.field().empty() ? config->find_entry(error.field()) : nullptr;
  return ConfigIssue(field ? field->value.pos() : fallback, error.field().empty() ? path : join_path(path, error.field()),
                     error.what());
}

}  // namespace tessera::core
