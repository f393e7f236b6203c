// Python's str methods over UTF-8 text, by code point where Python counts code points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::text::jinja {

// str.isspace() of one code point's UTF-8 bytes.
bool is_python_space(const std::string& code_point);
// str.strip / lstrip / rstrip: whitespace, or any code point of `chars`.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split / rsplit: on runs of whitespace (sep null, empty parts dropped) or on sep.
std::vector<std::string> split(const std::string& s, const std::string* sep, std::int64_t maxsplit, bool from_right);
std::vector<std::string> split_lines(const std::string& s);
std::string replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count);
// upper, lower, title (Python's str.title), capitalize, swapcase; ASCII letters change case,
// others stay as they are.
std::string change_case(const std::string& s, const std::string& how);
std::int64_t count(const std::string& s, const std::string& needle);
// The code-point index of the first (or last) occurrence, -1 if none.
std::int64_t find(const std::string& s, const std::string& needle, bool last);
// isdigit, isalpha, isalnum, isspace, isupper, islower over ASCII classes.
bool character_class(const std::string& s, const std::string& name);
// Jinja's escape filter: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);

}  // namespace tessera::text::jinja
