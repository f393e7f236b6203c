// Values as JSON: json.dumps as transformers' tojson calls it, and the variables a template is
// given (a JSON object, in its members' order).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else if (ensure_ascii && c >= 0x80) {
          // Decode the code point; above the BMP as a surrogate pair, as Python writes it.
          std::uint32_t cp = 0;
          int extra = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : 3;
          cp = c & (0x3f >> extra);
          for (int k = 0; k < extra && i + 1 < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[++i]) & 0x3f);
          char hex[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(hex, sizeof hex, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
          } else {
            std::snprintf(hex, sizeof hex, "\\u%04x", cp);
          }
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// json.dumps turns a key that is not a str into text: 1 -> "1", 1.5 -> "1.5", True -> "true",
// None -> "null"; any other key is a TypeError.
std::string json_key(const Value& key) {
  switch (key.type()) {
    case Value::Type::string:
      return key.as_string();
    case Value::Type::boolean:
      return key.as_bool() ? "true" : "false";
    case Value::Type::integer:
      return std::to_string(key.as_int());
    case Value::Type::real: {
      const double d = key.as_real();
      return std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
    }
    case Value::Type::none:
      return "null";
    default:
      throw ValueError{"keys must be str, int, float, bool or None, not " + key.type_name()};
  }
}

void json_value(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  using T = Value::Type;
  const auto newline = [&](int level) {
    if (style.indent >= 0) out += "\n" + std::string(static_cast<std::size_t>(style.indent * level), ' ');
  };
  switch (v.type()) {
    case T::none:
      out += "null";
      return;
    case T::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case T::integer:
      out += std::to_string(v.as_int());
      return;
    case T::real: {
      const double d = v.as_real();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
      return;
    }
    case T::string:
      json_string(v.as_string(), style.ensure_ascii, out);
      return;
    case T::list: {
      const ValueList& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        json_value(items[i], style, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case T::dict: {
      if (v.is_namespace()) break;
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& item : v.as_dict().items) items.push_back(&item);
      if (style.sort_keys) {  // Python sorts the keys themselves: mixed kinds cannot be ordered
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return less(a->first, b->first); });
      }
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        json_string(json_key(items[i]->first), style.ensure_ascii, out);
        out += style.key_separator;
        json_value(items[i]->second, style, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      break;
  }
  throw ValueError{"Object of type " + v.type_name() + " is not JSON serializable"};
}

// Deeper JSON than any conversation needs is refused rather than recursed into (the stack).
constexpr int kMaxJsonDepth = 512;

Value from_nlohmann(const nlohmann::ordered_json& j, int depth = 0) {
  if (depth > kMaxJsonDepth) throw ValueError{"the template's variables nest deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& item : j) items.push_back(from_nlohmann(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      // An ordered_json object holds each key once (a repeated key's last value), so no lookups.
      for (auto it = j.begin(); it != j.end(); ++it) d->append(Value::string(it.key()), from_nlohmann(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      throw ValueError{"unsupported JSON value"};
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  json_value(value, style, 0, out);
  return out;
}

Value from_json(const std::string& text) {
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ValueError{"the template's variables are not valid JSON"};
  return from_nlohmann(j);
}

}  // namespace tessera::text::jinja
