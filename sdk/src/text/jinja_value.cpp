#include "jinja_value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::text::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  key.check_hashable();
  for (auto& [k, v] : items) {
    if (equal(k, key)) {
      v = std::move(value);  // Python keeps the first key object: {1: 'a', True: 'b'} is {1: 'b'}
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

void Dict::set(const std::string& key, Value value) { set(Value::string(key), std::move(value)); }

void Dict::append(Value key, Value value) { items.emplace_back(std::move(key), std::move(value)); }

const Value* CallArgs::get(std::size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.type_ = Type::none;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::boolean;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::integer(std::int64_t i) {
  Value v;
  v.type_ = Type::integer;
  v.i_ = i;
  return v;
}
Value Value::real(double d) {
  Value v;
  v.type_ = Type::real;
  v.d_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::string;
  v.s_ = std::move(s);
  return v;
}
Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.markup_ = true;
  return v;
}
Value Value::list(ValueList items, bool tuple) {
  Value v;
  v.type_ = Type::list;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  v.tuple_ = tuple;
  return v;
}
Value Value::dict(std::shared_ptr<Dict> d, bool is_namespace) {
  Value v;
  v.type_ = Type::dict;
  v.dict_ = std::move(d);
  v.namespace_ = is_namespace;
  return v;
}
Value Value::iterator(ValueList items, std::string kind) {
  Value v;
  v.type_ = Type::iterator;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  v.s_ = std::move(kind);
  v.consumed_ = std::make_shared<bool>(false);
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> call) {
  Value v;
  v.type_ = Type::callable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(call)});
  return v;
}

std::int64_t Value::as_int() const {
  switch (type_) {
    case Type::boolean:
    case Type::integer:
      return i_;
    case Type::real:
      return static_cast<std::int64_t>(d_);
    default:
      throw ValueError{"expected a number, got " + repr()};
  }
}

const std::string& Value::as_string() const {
  if (type_ != Type::string) throw ValueError{"expected a str, got " + type_name() + " " + repr()};
  return s_;
}

const ValueList& Value::as_list() const {
  if (type_ != Type::list) throw ValueError{"expected a list, got " + type_name() + " " + repr()};
  return *list_;
}

Dict& Value::as_dict() const {
  if (type_ != Type::dict) throw ValueError{"expected a dict, got " + type_name() + " " + repr()};
  return *dict_;
}

const Callable& Value::as_callable() const {
  if (type_ != Type::callable) throw ValueError{"'" + type_name() + "' object is not callable"};
  return *fn_;
}

std::string Value::type_name() const {
  switch (type_) {
    case Type::undefined: return "Undefined";
    case Type::none: return "NoneType";
    case Type::boolean: return "bool";
    case Type::integer: return "int";
    case Type::real: return "float";
    case Type::string: return "str";
    case Type::list: return tuple_ ? "tuple" : "list";
    case Type::dict: return namespace_ ? "Namespace" : "dict";
    case Type::callable: return "function";
    case Type::iterator: return s_;
  }
  return "object";
}

void Value::check_hashable() const {
  if (type_ == Type::list && tuple_) {
    for (const auto& item : *list_) item.check_hashable();
    return;
  }
  if (type_ == Type::list || (type_ == Type::dict && !namespace_) || type_ == Type::undefined) {
    throw ValueError{"unhashable type: '" + type_name() + "'"};
  }
}

double Value::as_real() const {
  if (type_ == Type::real) return d_;
  return static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (type_) {
    case Type::undefined:
    case Type::none:
      return false;
    case Type::boolean:
      return b_;
    case Type::integer:
      return i_ != 0;
    case Type::real:
      return d_ != 0;
    case Type::string:
      return !s_.empty();
    case Type::list:
      return !list_->empty();
    case Type::dict:
      return namespace_ || !dict_->items.empty();
    case Type::callable:
    case Type::iterator:
      return true;  // as in Python, even an iterator with nothing left
  }
  return false;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::int64_t Value::length() const {
  switch (type_) {
    case Type::string:
      return static_cast<std::int64_t>(code_points(s_).size());
    case Type::list:
      return static_cast<std::int64_t>(list_->size());
    case Type::dict:
      return static_cast<std::int64_t>(dict_->items.size());
    case Type::undefined:
      return 0;
    default:
      throw ValueError{"object of type '" + type_name() + "' has no len()"};
  }
}

ValueList Value::iterate() const {
  switch (type_) {
    case Type::list:
      return *list_;
    case Type::dict: {
      ValueList keys;
      for (const auto& item : dict_->items) keys.push_back(item.first);
      return keys;
    }
    case Type::iterator: {
      if (*consumed_) return {};
      *consumed_ = true;
      return *list_;
    }
    case Type::string: {
      ValueList chars;
      for (auto& c : code_points(s_)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    case Type::undefined:
      return {};
    default:
      throw ValueError{"'" + type_name() + "' object is not iterable"};
  }
}

bool equal(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type() == T::real || b.type() == T::real) return a.as_real() == b.as_real();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::undefined:
    case T::none:
      return true;
    case T::string:
      return a.as_string() == b.as_string();
    case T::list: {
      const ValueList &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (!equal(x[i], y[i])) return false;
      }
      return true;
    }
    case T::dict: {
      if (a.is_namespace() || b.is_namespace()) return &a.as_dict() == &b.as_dict();
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    case T::callable:
      return &a.as_callable() == &b.as_callable();
    case T::iterator:
      return a.list_ptr() == b.list_ptr();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_real() < b.as_real();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const ValueList &x = a.as_list(), &y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw ValueError{"'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'"};
}

}  // namespace tessera::text::jinja
