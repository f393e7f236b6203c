// Jinja's built-in tests (`x is defined`, `x is equalto y`, ...), Jinja2 3.1's behaviour; also
// what select/reject and the `in` operator apply.
#include <functional>
#include <map>
#include <string>

#include "jinja_builtins.hpp"
#include "jinja_text.hpp"

namespace tessera::text::jinja {

namespace {

using Test = std::function<bool(const Value&, const CallArgs&)>;

bool number_type(const Value& v, Value::Type t) { return v.type() == t; }

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = [] {
    std::map<std::string, Test> t;
    const auto other = [](const CallArgs& a) -> const Value& {
      if (a.positional.empty()) throw ValueError{"the test needs an argument"};
      return a.positional[0];
    };
    t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, const CallArgs&) { return number_type(v, Value::Type::boolean); };
    t["true"] = [](const Value& v, const CallArgs&) { return number_type(v, Value::Type::boolean) && v.as_bool(); };
    t["false"] = [](const Value& v, const CallArgs&) { return number_type(v, Value::Type::boolean) && !v.as_bool(); };
    t["integer"] = [](const Value& v, const CallArgs&) { return number_type(v, Value::Type::integer); };
    t["float"] = [](const Value& v, const CallArgs&) { return number_type(v, Value::Type::real); };
    t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_dict() && !v.is_namespace(); };
    t["iterable"] = [](const Value& v, const CallArgs&) { return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined(); };
    t["sequence"] = [](const Value& v, const CallArgs&) { return v.is_list() || v.is_dict() || v.is_string(); };
    t["callable"] = [](const Value& v, const CallArgs&) { return v.is_callable(); };
    t["odd"] = [](const Value& v, const CallArgs&) { return v.as_int() % 2 != 0; };
    t["even"] = [](const Value& v, const CallArgs&) { return v.as_int() % 2 == 0; };
    t["divisibleby"] = [other](const Value& v, const CallArgs& a) { return v.as_int() % other(a).as_int() == 0; };
    t["eq"] = t["equalto"] = t["=="] = [other](const Value& v, const CallArgs& a) { return equal(v, other(a)); };
    t["ne"] = t["!="] = [other](const Value& v, const CallArgs& a) { return !equal(v, other(a)); };
    t["lt"] = t["lessthan"] = t["<"] = [other](const Value& v, const CallArgs& a) { return less(v, other(a)); };
    t["gt"] = t["greaterthan"] = t[">"] = [other](const Value& v, const CallArgs& a) { return less(other(a), v); };
    t["le"] = t["<="] = [other](const Value& v, const CallArgs& a) { return !less(other(a), v); };
    t["ge"] = t[">="] = [other](const Value& v, const CallArgs& a) { return !less(v, other(a)); };
    t["in"] = [other](const Value& v, const CallArgs& a) {
      const Value& seq = other(a);
      if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
      for (const auto& item : seq.iterate()) {
        if (equal(item, v)) return true;
      }
      return false;
    };
    t["sameas"] = [other](const Value& v, const CallArgs& a) {
      const Value& o = other(a);
      if (v.type() != o.type()) return false;
      if (v.is_list()) return v.list_ptr() == o.list_ptr();
      if (v.is_dict()) return &v.as_dict() == &o.as_dict();
      return equal(v, o);
    };
    t["lower"] = [](const Value& v, const CallArgs&) { return v.is_string() && change_case(v.as_string(), "lower") == v.as_string(); };
    t["upper"] = [](const Value& v, const CallArgs&) { return v.is_string() && change_case(v.as_string(), "upper") == v.as_string(); };
    t["escaped"] = [](const Value&, const CallArgs&) { return false; };
    t["filter"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.as_string()); };
    t["test"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_test(v.as_string()); };
    return t;
  }();
  return table;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& input, const CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw ValueError{"no test named '" + name + "'"};
  return it->second(input, args);
}

}  // namespace tessera::text::jinja
