// A Jinja template's tokens and syntax tree: what the lexer and the parser make and the
// renderer walks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

struct Position {
  int line = 1, column = 1;
};

// The template's name and a position in it, as errors print them.
std::string where(const std::string& name, const Position& at);

struct Token {
  enum class Kind { text, variable_begin, variable_end, block_begin, block_end, name, string, integer, real, op, end };
  Kind kind = Kind::end;
  std::string text;  // text, name, string (unescaped), operator
  std::int64_t integer = 0;
  double real = 0;
  Position at;
};

// Tokens of `source` with Jinja's whitespace rules as transformers sets them (trim_blocks,
// lstrip_blocks, `-`/`+` markers, the trailing newline dropped); comments are dropped.
std::vector<Token> lex(const std::string& source, const std::string& name);

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    // expressions
    literal, name, list, tuple, dict, attribute, item, slice, call, filter, test, negate, plus, binary, compare,
    logical_and, logical_or, logical_not, conditional, concat,
    // statements
    text, output, if_, for_, set, set_block, macro, filter_block, break_, continue_, generation
  };
  Kind kind;
  Position at;
  std::string name;                  // name, attribute, filter or test name, binary operator, set target
  Value literal;                     // literal
  std::vector<NodePtr> operands;     // sub-expressions (nullptr where absent: slice bounds, else)
  std::vector<std::string> keywords; // a call's or filter's keyword argument names (the last operands)
  std::vector<std::string> operators;  // compare: one per right-hand operand
  std::vector<std::string> targets;  // for / set / macro: names (macro: parameters)
  bool negated = false;              // `is not`
  std::vector<Body> bodies;          // if: one per branch (+ else); for: body, else; others: body
  explicit Node(Kind k, Position p) : kind(k), at(p) {}
};

// The name under which a set or filter block's text reaches its filters (no template can spell it).
inline constexpr const char* kBlockText = "<block text>";

struct Parsed {
  std::string name;
  Body body;
  bool has_generation = false;
};

// Throws tessera::Error "NAME:LINE:COL: ..." for syntax the interpreter does not take.
Parsed parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace tessera::text::jinja
