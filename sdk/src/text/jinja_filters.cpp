// Jinja's built-in filters (Jinja2 3.1's behaviour), and transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

#include "jinja_builtins.hpp"
#include "jinja_text.hpp"

namespace tessera::text::jinja {

namespace {

using Filter = std::function<Value(const Value&, const CallArgs&)>;

const Value* arg(const CallArgs& a, std::size_t i, const char* name) { return a.get(i, name); }
bool flag(const CallArgs& a, std::size_t i, const char* name, bool absent) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : absent;
}

// Arguments after the first `skip` positional ones (select's test arguments, map's filter's).
CallArgs rest(const CallArgs& a, std::size_t skip) {
  CallArgs out;
  for (std::size_t i = skip; i < a.positional.size(); ++i) out.positional.push_back(a.positional[i]);
  out.keyword = a.keyword;
  return out;
}

// An attribute path "a.b" (numbers index lists) or an index, as attribute= arguments take it.
Value attribute_path(const Value& v, const Value& path) {
  if (!path.is_string()) return get_item(v, path);
  Value out = v;
  const std::string& text = path.as_string();
  for (std::size_t pos = 0;;) {
    const std::size_t dot = text.find('.', pos);
    const std::string name = text.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
    out = get_item(out, digits ? Value::integer(std::stoll(name)) : Value::string(name));
    if (out.is_undefined() || dot == std::string::npos) return out;
    pos = dot + 1;
  }
}

// The sort key of sort/unique/dictsort: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(change_case(v.as_string(), "lower")) : v;
}

Value tojson(const Value& v, const CallArgs& a) {
  JsonStyle style;
  const Value* indent = arg(a, 0, "indent");
  if (indent && !indent->is_none()) {
    style.indent = indent->is_string() ? static_cast<int>(indent->as_string().size()) : static_cast<int>(indent->as_int());
  }
  style.ensure_ascii = flag(a, 99, "ensure_ascii", false);
  style.sort_keys = flag(a, 99, "sort_keys", false);
  style.item_separator = style.indent >= 0 ? "," : ", ";
  style.key_separator = ": ";
  if (const Value* seps = a.get(99, "separators"); seps && seps->is_list() && seps->as_list().size() == 2) {
    style.item_separator = seps->as_list()[0].as_string();
    style.key_separator = seps->as_list()[1].as_string();
  }
  return Value::string(to_json(v, style));
}

Value indent(const Value& v, const CallArgs& a) {
  const Value* width = arg(a, 0, "width");
  const std::string pad = !width ? "    " : width->is_string() ? width->as_string() : std::string(static_cast<std::size_t>(width->as_int()), ' ');
  const bool first = flag(a, 1, "first", false), blank = flag(a, 2, "blank", false);
  std::vector<std::string> lines = split_lines(v.str() + "\n");
  std::string out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + ((blank || !lines[i].empty()) ? pad : "");
    out += lines[i];
  }
  return Value::string(first ? pad + out : out);
}

Value sorted(const Value& v, const CallArgs& a) {
  ValueList items = v.iterate();
  const bool reverse = flag(a, 0, "reverse", false), case_sensitive = flag(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  const auto key = [&](const Value& x) { return sort_key(attribute ? attribute_path(x, *attribute) : x, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value selected(const Value& v, const CallArgs& a, bool by_attribute, bool keep) {
  ValueList out;
  if (!v.truthy()) return Value::iterator({});  // Jinja's `if value:` first: None selects nothing
  const std::size_t first_test = by_attribute ? 1 : 0;
  const Value* test = a.get(first_test, "");
  const CallArgs test_args = rest(a, first_test + 1);
  for (const auto& item : v.iterate()) {
    const Value subject = by_attribute ? attribute_path(item, a.positional.at(0)) : item;
    const bool passes = test ? apply_test(test->as_string(), subject, test_args) : subject.truthy();
    if (passes == keep) out.push_back(item);
  }
  return Value::iterator(std::move(out));  // Jinja's select & co. are generators
}

Value mapped(const Value& v, const CallArgs& a) {
  ValueList out;
  if (!v.truthy()) return Value::iterator({});  // as select: None maps to nothing
  const Value* attribute = a.get(99, "attribute");
  for (const auto& item : v.iterate()) {
    if (attribute) {
      Value x = attribute_path(item, *attribute);
      const Value* fallback = a.get(99, "default");
      out.push_back(x.is_undefined() && fallback ? *fallback : x);
    } else {
      if (a.positional.empty()) throw ValueError{"map() needs a filter name or attribute="};
      out.push_back(apply_filter(a.positional[0].as_string(), item, rest(a, 1)));
    }
  }
  return Value::iterator(std::move(out));
}

Value rounded(const Value& v, const CallArgs& a) {
  const Value* precision = arg(a, 0, "precision");
  const Value* method = arg(a, 1, "method");
  const double scale = std::pow(10.0, precision ? static_cast<double>(precision->as_int()) : 0.0);
  const std::string how = method ? method->as_string() : "common";
  const double x = v.as_real() * scale;
  const double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::real(r / scale);
}

Value to_int(const Value& v, const CallArgs& a) {
  const Value* fallback = arg(a, 0, "default");
  if (v.is_number()) return Value::integer(v.as_int());
  if (v.is_string()) {
    const std::string s = strip(v.as_string(), nullptr, true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value::integer(i);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::integer(static_cast<std::int64_t>(d));
  }
  return fallback ? *fallback : Value::integer(0);
}

Value to_float(const Value& v, const CallArgs& a) {
  const Value* fallback = arg(a, 0, "default");
  if (v.is_number()) return Value::real(v.as_real());
  if (v.is_string()) {
    const std::string s = strip(v.as_string(), nullptr, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::real(d);
  }
  return fallback ? *fallback : Value::real(0);
}

Value percent_format(const Value& v, const CallArgs& a) {
  const std::string& pattern = v.as_string();
  std::string out;
  std::size_t next = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 >= pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char spec = pattern[++i];
    if (spec == '%') {
      out += '%';
      continue;
    }
    if (next >= a.positional.size()) throw ValueError{"format: not enough arguments"};
    const Value& x = a.positional[next++];
    if (spec == 's') out += x.str();
    else if (spec == 'r') out += x.repr();
    else if (spec == 'd' || spec == 'i') out += std::to_string(x.as_int());
    else throw ValueError{std::string("format: unsupported conversion %") + spec};
  }
  return Value::string(out);
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = [] {
    std::map<std::string, Filter> f;
    f["abs"] = [](const Value& v, const CallArgs&) {
      return v.type() == Value::Type::real ? Value::real(std::fabs(v.as_real())) : Value::integer(std::llabs(v.as_int()));
    };
    f["attr"] = [](const Value& v, const CallArgs& a) { return get_attribute(v, a.positional.at(0).as_string()); };
    f["capitalize"] = [](const Value& v, const CallArgs&) { return Value::string(change_case(v.str(), "capitalize")); };
    f["count"] = f["length"] = [](const Value& v, const CallArgs&) { return Value::integer(v.length()); };
    f["default"] = f["d"] = [](const Value& v, const CallArgs& a) {
      const Value* fallback = arg(a, 0, "default_value");
      const bool falsy = flag(a, 1, "boolean", false);
      if (v.is_undefined() || (falsy && !v.truthy())) return fallback ? *fallback : Value::string("");
      return v;
    };
    f["dictsort"] = [](const Value& v, const CallArgs& a) {
      const bool case_sensitive = flag(a, 0, "case_sensitive", false), reverse = flag(a, 2, "reverse", false);
      const Value* by = arg(a, 1, "by");
      const std::size_t part = by && by->as_string() == "value" ? 1 : 0;
      ValueList items;
      for (const auto& [k, x] : v.as_dict().items) items.push_back(Value::list({k, x}, true));
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const Value kx = sort_key(x.as_list()[part], case_sensitive), ky = sort_key(y.as_list()[part], case_sensitive);
        return reverse ? less(ky, kx) : less(kx, ky);
      });
      return Value::list(std::move(items));
    };
    // Markup is escaped already: |e leaves it as it is (|forceescape does not).
    f["escape"] = f["e"] = [](const Value& v, const CallArgs&) { return v.is_markup() ? v : Value::markup(html_escape(v.str())); };
    f["forceescape"] = [](const Value& v, const CallArgs&) { return Value::markup(html_escape(v.str())); };
    f["first"] = [](const Value& v, const CallArgs&) {
      const ValueList items = v.iterate();
      return items.empty() ? Value::undefined("first of an empty sequence") : items.front();
    };
    f["last"] = [](const Value& v, const CallArgs&) {
      if (v.is_iterator()) throw ValueError{"'" + v.type_name() + "' object is not reversible"};
      const ValueList items = v.iterate();
      return items.empty() ? Value::undefined("last of an empty sequence") : items.back();
    };
    f["float"] = to_float;
    f["int"] = to_int;
    f["format"] = percent_format;
    f["indent"] = indent;
    f["items"] = [](const Value& v, const CallArgs&) {
      if (v.is_undefined()) return Value::iterator({});
      if (!v.is_dict() || v.is_namespace()) throw ValueError{"Can only get item pairs from a mapping."};
      ValueList pairs;
      for (const auto& [k, x] : v.as_dict().items) pairs.push_back(Value::list({k, x}, true));
      return Value::iterator(std::move(pairs));
    };
    f["join"] = [](const Value& v, const CallArgs& a) {
      const Value* sep = arg(a, 0, "d");
      const Value* attribute = arg(a, 1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& item : v.iterate()) {
        out += (first ? "" : (sep ? sep->str() : "")) + (attribute ? attribute_path(item, *attribute) : item).str();
        first = false;
      }
      return Value::string(out);
    };
    f["list"] = [](const Value& v, const CallArgs&) { return Value::list(v.iterate()); };
    f["lower"] = [](const Value& v, const CallArgs&) { return Value::string(change_case(v.str(), "lower")); };
    f["upper"] = [](const Value& v, const CallArgs&) { return Value::string(change_case(v.str(), "upper")); };
    f["title"] = [](const Value& v, const CallArgs&) { return Value::string(change_case(v.str(), "title")); };
    f["map"] = mapped;
    f["replace"] = [](const Value& v, const CallArgs& a) {
      const Value* n = arg(a, 2, "count");
      return Value::string(replace(v.str(), a.positional.at(0).str(), a.positional.at(1).str(), n ? n->as_int() : -1));
    };
    f["reverse"] = [](const Value& v, const CallArgs&) {
      if (v.is_string()) {
        ValueList chars = v.iterate();
        std::reverse(chars.begin(), chars.end());
        std::string out;
        for (const auto& c : chars) out += c.as_string();
        return Value::string(out);
      }
      // reversed(): an iterator over a list; a dict or an iterator is copied into a list first.
      ValueList items = v.iterate();
      std::reverse(items.begin(), items.end());
      if (v.is_list()) return Value::iterator(std::move(items), "list_reverseiterator");
      return Value::list(std::move(items));
    };
    f["round"] = rounded;
    f["safe"] = [](const Value& v, const CallArgs&) { return v.is_markup() ? v : Value::markup(v.str()); };
    f["select"] = [](const Value& v, const CallArgs& a) { return selected(v, a, false, true); };
    f["reject"] = [](const Value& v, const CallArgs& a) { return selected(v, a, false, false); };
    f["selectattr"] = [](const Value& v, const CallArgs& a) { return selected(v, a, true, true); };
    f["rejectattr"] = [](const Value& v, const CallArgs& a) { return selected(v, a, true, false); };
    f["sort"] = sorted;
    f["string"] = [](const Value& v, const CallArgs&) { return Value::string(v.str()); };
    f["sum"] = [](const Value& v, const CallArgs& a) {
      const Value* attribute = arg(a, 0, "attribute");
      const Value* start = arg(a, 1, "start");
      Value total = start ? *start : Value::integer(0);
      for (const auto& item : v.iterate()) {
        const Value x = attribute ? attribute_path(item, *attribute) : item;
        const bool real = total.type() == Value::Type::real || x.type() == Value::Type::real;
        total = real ? Value::real(total.as_real() + x.as_real()) : Value::integer(total.as_int() + x.as_int());
      }
      return total;
    };
    f["tojson"] = tojson;
    f["trim"] = [](const Value& v, const CallArgs& a) {
      const Value* chars = arg(a, 0, "chars");
      return Value::string(strip(v.str(), chars && !chars->is_none() ? &chars->as_string() : nullptr, true, true));
    };
    f["unique"] = [](const Value& v, const CallArgs& a) {
      const bool case_sensitive = flag(a, 0, "case_sensitive", false);
      const Value* attribute = arg(a, 1, "attribute");
      ValueList out, seen;
      for (const auto& item : v.iterate()) {
        const Value key = sort_key(attribute ? attribute_path(item, *attribute) : item, case_sensitive);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::iterator(std::move(out));
    };
    f["wordcount"] = [](const Value& v, const CallArgs&) {
      return Value::integer(static_cast<std::int64_t>(split(v.str(), nullptr, -1, false).size()));
    };
    for (const char* which : {"max", "min"}) {
      const bool is_max = std::string(which) == "max";
      f[which] = [is_max](const Value& v, const CallArgs& a) {
        const bool case_sensitive = flag(a, 0, "case_sensitive", false);
        const Value* attribute = arg(a, 1, "attribute");
        const ValueList items = v.iterate();
        if (items.empty()) return Value::undefined("max/min of an empty sequence");
        const Value* best = &items[0];
        for (const auto& item : items) {
          const Value key = sort_key(attribute ? attribute_path(item, *attribute) : item, case_sensitive);
          const Value best_key = sort_key(attribute ? attribute_path(*best, *attribute) : *best, case_sensitive);
          if (is_max ? less(best_key, key) : less(key, best_key)) best = &item;
        }
        return *best;
      };
    }
    return f;
  }();
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw ValueError{"no filter named '" + name + "'"};
  return it->second(input, args);
}

}  // namespace tessera::text::jinja
