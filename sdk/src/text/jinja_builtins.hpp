// What a template can call without defining it: Jinja's filters and tests, the Python methods of
// strings, dicts and lists that chat templates use (the immutable sandbox's: none that mutate),
// attribute and item lookup as Jinja's sandbox does it, and transformers' globals.
#pragma once

#include <string>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

// Filters that take a filter or test by name (map, select, ...) reach the others through these.
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
bool apply_test(const std::string& name, const Value& input, const CallArgs& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

// obj.name: a method or attribute first, then the item (Jinja's getattr); undefined if neither.
Value get_attribute(const Value& object, const std::string& name);
// obj[key]: the item first, then the attribute for a string key (Jinja's getitem).
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] (absent bounds undefined).
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// range, namespace, dict, raise_exception, strftime_now; undefined for other names.
Value global(const std::string& name);

}  // namespace tessera::text::jinja
