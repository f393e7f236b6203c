// Attribute, item and slice lookup, the Python methods templates call on strings, dicts and
// lists, and the globals transformers gives chat templates.
#include <algorithm>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "jinja_builtins.hpp"
#include "jinja_text.hpp"

namespace tessera::text::jinja {

namespace {

const Value& argument(const CallArgs& args, std::size_t index, const std::string& name, const std::string& method) {
  const Value* v = args.get(index, name);
  if (!v) throw ValueError{method + "() missing argument '" + name + "'"};
  return *v;
}

const Value* optional(const CallArgs& args, std::size_t index, const std::string& name) {
  const Value* v = args.get(index, name);
  return v && !v->is_none() ? v : nullptr;
}

std::string string_argument(const CallArgs& args, std::size_t index, const std::string& name, const std::string& method) {
  const Value& v = argument(args, index, name, method);
  if (!v.is_string()) throw ValueError{method + "() argument '" + name + "' must be str, not " + v.repr()};
  return v.as_string();
}

Value strings(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.push_back(Value::string(p));
  return Value::list(std::move(out));
}

// startswith / endswith take a string or a tuple of strings.
bool affix_matches(const Value& affix, const std::string& s, bool prefix) {
  const auto one = [&](const Value& a) {
    if (!a.is_string()) throw ValueError{"startswith/endswith take a str or a tuple of str, not " + a.repr()};
    const std::string& t = a.as_string();
    return t.size() <= s.size() && (prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0);
  };
  if (affix.is_list()) {
    for (const auto& a : affix.as_list()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

// str.format with {} / {0} / {name} fields (no format specs).
std::string format(const std::string& pattern, const CallArgs& args) {
  std::string out;
  std::size_t automatic = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if ((c == '{' || c == '}') && i + 1 < pattern.size() && pattern[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const std::size_t close = pattern.find('}', i);
    if (close == std::string::npos) throw ValueError{"str.format: unmatched '{'"};
    const std::string field = pattern.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) throw ValueError{"str.format: format specs are not supported"};
    const Value* v = nullptr;
    if (field.empty()) {
      v = automatic < args.positional.size() ? &args.positional[automatic++] : nullptr;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const std::size_t index = std::stoul(field);
      v = index < args.positional.size() ? &args.positional[index] : nullptr;
    } else {
      for (const auto& [k, value] : args.keyword) {
        if (k == field) v = &value;
      }
    }
    if (!v) throw ValueError{"str.format: no argument for {" + field + "}"};
    out += v->str();
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name) {
  const auto method = [&](auto fn) { return Value::function("str." + name, fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return method([s, name](const CallArgs& a) {
      const Value* chars = optional(a, 0, "chars");
      const bool left = name != "rstrip", right = name != "lstrip";
      return Value::string(strip(s, chars ? &chars->as_string() : nullptr, left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    return method([s, name](const CallArgs& a) {
      const Value* sep = optional(a, 0, "sep");
      const Value* max = optional(a, 1, "maxsplit");
      const std::int64_t maxsplit = max ? max->as_int() : -1;
      if (sep && (!sep->is_string() || sep->as_string().empty())) throw ValueError{"str.split: empty or non-str separator"};
      return strings(split(s, sep ? &sep->as_string() : nullptr, maxsplit, name == "rsplit"));
    });
  }
  if (name == "splitlines") return method([s](const CallArgs&) { return strings(split_lines(s)); });
  if (name == "startswith" || name == "endswith") {
    return method([s, name](const CallArgs& a) {
      return Value::boolean(affix_matches(argument(a, 0, "prefix", name), s, name == "startswith"));
    });
  }
  if (name == "replace") {
    return method([s](const CallArgs& a) {
      const Value* count = optional(a, 2, "count");
      return Value::string(replace(s, string_argument(a, 0, "old", "replace"), string_argument(a, 1, "new", "replace"),
                                   count ? count->as_int() : -1));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    return method([s, name](const CallArgs&) { return Value::string(change_case(s, name)); });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method([s, name](const CallArgs& a) {
      const std::string needle = string_argument(a, 0, "sub", name);
      if (name == "count") return Value::integer(count(s, needle));
      const std::int64_t at = find(s, needle, name == "rfind" || name == "rindex");
      if (at < 0 && (name == "index" || name == "rindex")) throw ValueError{"substring not found"};
      return Value::integer(at);
    });
  }
  if (name == "join") {
    return method([s](const CallArgs& a) {
      std::string out;
      bool first = true;
      for (const auto& item : argument(a, 0, "iterable", "join").iterate()) {
        if (!item.is_string()) throw ValueError{"str.join: expected str items, got " + item.repr()};
        out += (first ? "" : s) + item.as_string();
        first = false;
      }
      return Value::string(out);
    });
  }
  if (name == "format") return method([s](const CallArgs& a) { return Value::string(format(s, a)); });
  if (name == "removeprefix" || name == "removesuffix") {
    return method([s, name](const CallArgs& a) {
      const std::string affix = string_argument(a, 0, "affix", name);
      if (name == "removeprefix") return Value::string(s.compare(0, affix.size(), affix) == 0 ? s.substr(affix.size()) : s);
      const bool ends = affix.size() <= s.size() && s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
      return Value::string(ends ? s.substr(0, s.size() - affix.size()) : s);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    return method([s, name](const CallArgs&) { return Value::boolean(character_class(s, name)); });
  }
  return Value::undefined("str object has no attribute '" + name + "'");
}

Value unsafe(const std::string& type, const std::string& name) {
  return Value::function(type + "." + name, [type, name](const CallArgs&) -> Value {
    throw ValueError{"access to attribute '" + name + "' of '" + type + "' object is unsafe (templates cannot change values)"};
  });
}

Value dict_method(const Value& object, const std::string& name) {
  if (name == "items") {
    return Value::function("dict.items", [object](const CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : object.as_dict().items) out.push_back(Value::list({k, v}, true));
      return Value::list(std::move(out));
    });
  }
  if (name == "keys") return Value::function("dict.keys", [object](const CallArgs&) { return Value::list(object.iterate()); });
  if (name == "values") {
    return Value::function("dict.values", [object](const CallArgs&) {
      ValueList out;
      for (const auto& item : object.as_dict().items) out.push_back(item.second);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::function("dict.get", [object](const CallArgs& a) {
      const Value& key = argument(a, 0, "key", "get");
      key.check_hashable();
      const Value* found = object.as_dict().find(key);
      if (found) return *found;
      const Value* fallback = a.get(1, "default");
      return fallback ? *fallback : Value::none();
    });
  }
  for (const char* m : {"pop", "popitem", "update", "setdefault", "clear", "copy"}) {
    if (name == m) return unsafe("dict", name);
  }
  return Value::undefined();
}

Value list_method(const Value& object, const std::string& name) {
  if (name == "index" || name == "count") {
    return Value::function("list." + name, [object, name](const CallArgs& a) {
      const ValueList& items = object.as_list();
      const Value& x = argument(a, 0, "value", name);
      std::int64_t n = 0;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (!equal(items[i], x)) continue;
        if (name == "index") return Value::integer(static_cast<std::int64_t>(i));
        ++n;
      }
      if (name == "index") throw ValueError{x.repr() + " is not in list"};
      return Value::integer(n);
    });
  }
  for (const char* m : {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"}) {
    if (name == m) return unsafe("list", name);
  }
  return Value::undefined();
}

// Python's index rules: negative from the end; nullopt outside.
bool normalise_index(std::int64_t& i, std::size_t size) {
  if (i < 0) i += static_cast<std::int64_t>(size);
  return i >= 0 && i < static_cast<std::int64_t>(size);
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  if (object.is_undefined()) {
    throw ValueError{(object.undefined_name().empty() ? std::string("a value") : "'" + object.undefined_name() + "'") +
                     " is undefined, so it has no attribute '" + name + "'"};
  }
  if (!name.empty() && name[0] == '_') return Value::undefined(name);  // the sandbox hides private attributes
  if (object.is_string()) return string_method(object.as_string(), name);
  if (object.is_list()) return list_method(object, name);
  if (object.is_dict()) {
    if (!object.is_namespace()) {
      Value method = dict_method(object, name);
      if (!method.is_undefined()) return method;
    }
    const Value* found = object.as_dict().find(name);
    return found ? *found : Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::undefined(name);
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) {
    throw ValueError{(object.undefined_name().empty() ? std::string("a value") : "'" + object.undefined_name() + "'") +
                     " is undefined, so it has no item " + key.repr()};
  }
  if (object.is_dict()) {
    if (key.is_string()) {
      if (const Value* found = object.as_dict().find(key.as_string())) return *found;
      return object.is_namespace() ? Value::undefined(key.as_string()) : get_attribute(object, key.as_string());
    }
    // Any hashable key; an unhashable one is a TypeError that Jinja's getitem turns into undefined.
    const bool hashable = key.is_number() || key.is_none() || (key.is_list() && key.is_tuple());
    if (hashable) {
      try {
        if (const Value* found = object.as_dict().find(key)) return *found;
      } catch (const ValueError&) {
      }
    }
    return Value::undefined();
  }
  if ((object.is_list() || object.is_string()) && key.is_number() && key.type() != Value::Type::real) {
    std::int64_t i = key.as_int();
    if (object.is_list()) return normalise_index(i, object.as_list().size()) ? object.as_list()[static_cast<std::size_t>(i)] : Value::undefined();
    const auto chars = code_points(object.as_string());
    return normalise_index(i, chars.size()) ? Value::string(chars[static_cast<std::size_t>(i)]) : Value::undefined();
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined();
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  const bool is_list = object.is_list();
  if (!is_list && !object.is_string()) throw ValueError{"cannot slice " + object.repr()};
  ValueList items = object.iterate();
  const auto n = static_cast<std::int64_t>(items.size());
  const std::int64_t by = step.is_undefined() || step.is_none() ? 1 : step.as_int();
  if (by == 0) throw ValueError{"slice step cannot be zero"};
  // Python's slice.indices.
  const auto bound = [&](const Value& v, std::int64_t absent) {
    if (v.is_undefined() || v.is_none()) return absent;
    std::int64_t i = v.as_int();
    if (i < 0) i += n;
    if (by > 0) return std::clamp<std::int64_t>(i, 0, n);
    return std::clamp<std::int64_t>(i, -1, n - 1);
  };
  const std::int64_t from = bound(start, by > 0 ? 0 : n - 1), to = bound(stop, by > 0 ? n : -1);
  ValueList out;
  for (std::int64_t i = from; by > 0 ? i < to : i > to; i += by) out.push_back(items[static_cast<std::size_t>(i)]);
  if (is_list) return Value::list(std::move(out), object.is_tuple());
  std::string text;
  for (const auto& c : out) text += c.as_string();
  return Value::string(std::move(text));
}

Value global(const std::string& name) {
  if (name == "range") {
    return Value::function("range", [](const CallArgs& a) {
      if (a.positional.empty() || a.positional.size() > 3) throw ValueError{"range() takes 1 to 3 arguments"};
      std::int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      }
      if (step == 0) throw ValueError{"range() step must not be zero"};
      ValueList out;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 100000) throw ValueError{"range() too big: more than 100000 items"};
        out.push_back(Value::integer(i));
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool is_namespace = name == "namespace";
    return Value::function(name, [is_namespace](const CallArgs& a) {
      auto d = std::make_shared<Dict>();
      for (const auto& p : a.positional) {
        if (!p.is_dict()) throw ValueError{"namespace() and dict() take a dict or keyword arguments"};
        for (const auto& [k, v] : p.as_dict().items) d->set(k, v);
      }
      for (const auto& [k, v] : a.keyword) {
        if (is_namespace && !k.empty() && k[0] == '_') throw ValueError{"namespaces cannot store underscore-prefixed attributes"};
        d->set(k, v);
      }
      return Value::dict(std::move(d), is_namespace);
    });
  }
  if (name == "raise_exception") {
    return Value::function(name, [](const CallArgs& a) -> Value {
      const Value* message = a.get(0, "message");
      throw ValueError{"the template raised an error: " + (message ? message->str() : std::string())};
    });
  }
  if (name == "strftime_now") {
    return Value::function(name, [](const CallArgs& a) {
      const std::string fmt = string_argument(a, 0, "format", "strftime_now");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &local);
      return Value::string(std::string(buf, n));
    });
  }
  return Value::undefined(name);
}

}  // namespace tessera::text::jinja
