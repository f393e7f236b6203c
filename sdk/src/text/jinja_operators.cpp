// Python's arithmetic operators on template values (+ - * / // % **), with its rules: int or
// float results, floor division and modulo toward -inf, string and list concatenation and
// repetition, and `%` formatting of a string.
#include <cmath>
#include <cstdint>
#include <string>

#include "jinja_builtins.hpp"
#include "jinja_operators.hpp"
#include "jinja_text.hpp"

namespace tessera::text::jinja {

Value binary_operation(const std::string& op, const Value& a, const Value& b, std::size_t max_text) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (!a.is_markup() && !b.is_markup()) return Value::string(a.as_string() + b.as_string());
      // Markup + str (either side) escapes the plain one and stays Markup (markupsafe).
      const auto safe = [](const Value& v) { return v.is_markup() ? v.as_string() : html_escape(v.as_string()); };
      return Value::markup(safe(a) + safe(b));
    }
    if (a.is_list() && b.is_list()) {
      ValueList items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(items), a.is_tuple());
    }
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.is_number() && b.type() != Value::Type::real) {
    const std::int64_t unit = a.is_string() ? static_cast<std::int64_t>(a.as_string().size()) : a.length();
    if (b.as_int() > 0 && unit > 0 && b.as_int() > static_cast<std::int64_t>(max_text) / unit) {
      throw ValueError{"repetition past " + std::to_string(max_text >> 20) + " MiB"};
    }
    ValueList items;
    std::string text;
    for (std::int64_t i = 0; i < b.as_int(); ++i) {
      if (a.is_string()) text += a.as_string();
      else items.insert(items.end(), a.as_list().begin(), a.as_list().end());
    }
    if (a.is_string()) return a.is_markup() ? Value::markup(text) : Value::string(text);
    return Value::list(std::move(items));
  }
  if (op == "%" && a.is_string()) {
    ValueList args = b.is_tuple() ? b.as_list() : ValueList{b};
    if (!a.is_markup()) return apply_filter("format", a, CallArgs{std::move(args), {}});
    // Markup % args escapes the string arguments (markupsafe).
    for (auto& x : args) {
      if (x.is_string() && !x.is_markup()) x = Value::markup(html_escape(x.as_string()));
    }
    return Value::markup(apply_filter("format", a, CallArgs{std::move(args), {}}).as_string());
  }
  if (!a.is_number() || !b.is_number()) {
    throw ValueError{"unsupported operand types for " + op + ": " + a.repr() + " and " + b.repr()};
  }
  const bool real = a.type() == Value::Type::real || b.type() == Value::Type::real;
  if (op == "/") {
    if (b.as_real() == 0) throw ValueError{"division by zero"};
    return Value::real(a.as_real() / b.as_real());
  }
  if (op == "**") {
    if (!real && b.as_int() >= 0) {  // by squaring, refusing what leaves 64 bits (Python's ints are unbounded)
      std::int64_t r = 1, base = a.as_int();
      for (std::int64_t e = b.as_int(); e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) throw ValueError{"integer overflow in **"};
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) throw ValueError{"integer overflow in **"};
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(a.as_real(), b.as_real()));
  }
  if (real) {
    const double x = a.as_real(), y = b.as_real();
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (y == 0) throw ValueError{"division by zero"};
    if (op == "//") return Value::real(std::floor(x / y));
    return Value::real(x - y * std::floor(x / y));  // %
  }
  const std::int64_t x = a.as_int(), y = b.as_int();
  std::int64_t r = 0;
  const bool overflow = op == "+" ? __builtin_add_overflow(x, y, &r) : op == "-" ? __builtin_sub_overflow(x, y, &r)
                        : op == "*" ? __builtin_mul_overflow(x, y, &r) : false;
  if (overflow) throw ValueError{"integer overflow in " + op};
  if (op == "+" || op == "-" || op == "*") return Value::integer(r);
  if (y == 0) throw ValueError{"division by zero"};
  if (x == INT64_MIN && y == -1) throw ValueError{"integer overflow in " + op};
  std::int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
  if (op == "//") return Value::integer(q);
  return Value::integer(x - q * y);
}

}  // namespace tessera::text::jinja
