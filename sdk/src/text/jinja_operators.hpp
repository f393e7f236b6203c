// Python's binary arithmetic on template values, as Jinja evaluates `a op b`.
#pragma once

#include <cstddef>
#include <string>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

// `op` one of + - * / // % **; ValueError for operands Python refuses, division by zero, or a
// repetition longer than `max_text` bytes.
Value binary_operation(const std::string& op, const Value& a, const Value& b, std::size_t max_text);

}  // namespace tessera::text::jinja
