// The values a Jinja template computes with, with Python's semantics where templates rely on
// them: truthiness, equality and ordering, str() and repr(), json.dumps, code-point strings.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tessera::text::jinja {

class Value;
using ValueList = std::vector<Value>;

// A dict in insertion order, with any hashable key (str, int, float, bool, None, tuples of
// them), as Python's: keys equal as Python compares them (1, 1.0 and True are one key).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  // ValueError for an unhashable key (a list, a dict).
  void set(Value key, Value value);
  void set(const std::string& key, Value value);
  // Appends without looking for the key: for keys known to be new (a parsed JSON object's).
  void append(Value key, Value value);
};

// Arguments of a call: positional, then keyword.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`, or nullptr.
  const Value* get(std::size_t index, const std::string& name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

// Thrown by value operations; the renderer adds the template position.
struct ValueError {
  std::string message;
};

class Value {
 public:
  // `iterator` is what Jinja's lazy filters (map, select, reject, unique, items, ...) and
  // reversed() give in Python: iterable once, truthy, without len() and not JSON.
  enum class Type { undefined, none, boolean, integer, real, string, list, dict, callable, iterator };

  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(std::int64_t i);
  static Value real(double d);
  static Value string(std::string s);
  // A string marked safe (markupsafe's Markup: what |safe and |escape give): adding a plain
  // string to it HTML-escapes that string, as Python's Markup.__add__ does, even with
  // autoescaping off (transformers' environment).
  static Value markup(std::string s);
  static Value list(ValueList items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d, bool is_namespace = false);
  static Value function(std::string name, std::function<Value(const CallArgs&)> call);
  // A one-shot iterator over `items`; `kind` is its Python type name (generator, list_reverseiterator).
  static Value iterator(ValueList items, std::string kind = "generator");

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::undefined; }
  bool is_none() const { return type_ == Type::none; }
  bool is_string() const { return type_ == Type::string; }
  bool is_number() const { return type_ == Type::integer || type_ == Type::real || type_ == Type::boolean; }
  bool is_list() const { return type_ == Type::list; }
  bool is_dict() const { return type_ == Type::dict; }
  bool is_callable() const { return type_ == Type::callable; }
  bool is_iterator() const { return type_ == Type::iterator; }
  bool is_markup() const { return markup_; }
  bool is_tuple() const { return tuple_; }
  bool is_namespace() const { return namespace_; }

  // The typed views: each is a ValueError (never a crash) on a value of another type, since a
  // template may hand any value to any filter.
  bool as_bool() const { return b_; }
  std::int64_t as_int() const;  // booleans and integers; reals truncated
  double as_real() const;
  const std::string& as_string() const;
  const ValueList& as_list() const;
  const std::shared_ptr<ValueList>& list_ptr() const { return list_; }
  Dict& as_dict() const;
  const Callable& as_callable() const;
  const std::string& undefined_name() const { return s_; }
  // Python's type name: str, int, list, dict, NoneType, generator, ...
  std::string type_name() const;

  bool truthy() const;
  // str(value) as Jinja prints it: None, True, 1.5, ['a', 1]; undefined prints nothing.
  std::string str() const;
  // repr(value), as Python prints list items and dict values.
  std::string repr() const;
  // The items a for loop sees: a list's items, a dict's keys, a string's characters, what an
  // iterator has left (it then has nothing left).
  ValueList iterate() const;
  // ValueError unless the value can be a dict key (hash() in Python).
  void check_hashable() const;
  // len(): characters of a string, items of a list or dict.
  std::int64_t length() const;

 private:
  Type type_ = Type::undefined;
  bool b_ = false;
  bool tuple_ = false;
  bool namespace_ = false;
  bool markup_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
  std::shared_ptr<bool> consumed_;  // an iterator's: shared by its copies, as Python's references are
};

bool equal(const Value& a, const Value& b);
// a < b for numbers, strings and lists; ValueError otherwise.
bool less(const Value& a, const Value& b);
// Python's repr() of a float: the shortest text that reads back to the same double.
std::string python_float(double d);
// Python's json.dumps(value, ensure_ascii=False, indent, separators, sort_keys).
struct JsonStyle {
  int indent = -1;  // -1: None
  std::string item_separator, key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& value, const JsonStyle& style);
// A JSON document (nlohmann's ordered parse) as a value; ValueError for invalid JSON.
Value from_json(const std::string& text);

// Strings as Python sees them: sequences of code points.
std::vector<std::string> code_points(const std::string& s);

}  // namespace tessera::text::jinja
