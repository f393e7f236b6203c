// Values as Python prints them: str() (what `{{ value }}` writes), repr() (list items and dict
// values inside them), and a float's shortest repr.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest %.Ne that reads back to d gives the digits and the exponent.
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string text(buf);
  const std::size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  std::string digits;
  const bool negative = text[0] == '-';
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[8];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  const auto whole = static_cast<std::size_t>(exponent + 1);
  if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
  return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

}  // namespace

std::string Value::repr() const {
  switch (type_) {
    case Type::string:
      return string_repr(s_);
    case Type::list: {
      std::string out = tuple_ ? "(" : "[";
      for (std::size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Type::dict: {
      if (namespace_) return "<Namespace>";
      std::string out = "{";
      for (std::size_t i = 0; i < dict_->items.size(); ++i) {
        out += (i ? ", " : "") + dict_->items[i].first.repr() + ": " + dict_->items[i].second.repr();
      }
      return out + "}";
    }
    default:
      return str();
  }
}

std::string Value::str() const {
  switch (type_) {
    case Type::undefined:
      return "";
    case Type::none:
      return "None";
    case Type::boolean:
      return b_ ? "True" : "False";
    case Type::integer:
      return std::to_string(i_);
    case Type::real:
      return python_float(d_);
    case Type::string:
      return s_;
    case Type::callable:
      return "<function " + fn_->name + ">";
    case Type::iterator:
      return "<" + s_ + " object>";  // Python adds an address, which no template can rely on
    default:
      return repr();
  }
}

}  // namespace tessera::text::jinja
