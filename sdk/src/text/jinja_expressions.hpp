// Jinja's expression grammar (Jinja2 3.1's parser: conditional, or/and/not, comparisons and
// `in`, arithmetic, `~`, unary signs, primaries, attributes, subscripts and slices, calls, filters
// and tests), by recursive descent over the lexer's tokens. jinja_parser.cpp's statement parser
// derives from it; only that file and jinja_expressions.cpp (the longer productions) include it.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_syntax.hpp"
#include "tessera/error.hpp"

namespace tessera::text::jinja {

class ExpressionParser {
 public:
  using K = Node::Kind;
  using TK = Token::Kind;

  ExpressionParser(const std::vector<Token>& tokens, const std::string& name) : t_(tokens), name_(name) {}

 protected:
  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).kind == TK::op && peek(ahead).text == op;
  }
  bool is_name(const char* name, std::size_t ahead = 0) const {
    return peek(ahead).kind == TK::name && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const Position& at, const std::string& what) const {
    throw tessera::Error(where(name_, at) + ": " + what);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TK::end: return "the end of the template";
      case TK::block_end: return "the end of the statement";
      case TK::variable_end: return "the end of the print statement";
      case TK::string: return "a string";
      case TK::integer:
      case TK::real: return "a number";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().at, std::string("expected '") + op + "', got " + describe(peek()));
  }
  void expect(TK kind, const char* what) {
    if (peek().kind != kind) fail(peek().at, std::string("expected ") + what + ", got " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().kind != TK::name) fail(peek().at, "expected a name, got " + describe(peek()));
    return next().text;
  }
  static NodePtr make(K kind, Position at) { return std::make_unique<Node>(kind, at); }
  // Where a set or filter block's rendered text enters its filters.
  static NodePtr block_text(Position at) {
    auto n = make(K::name, at);
    n->name = kBlockText;
    return n;
  }

  // Expressions, loosest first.
  NodePtr tuple_expression() {
    const Position at = peek().at;
    NodePtr first = expression();
    if (!is_op(",")) return first;
    auto n = make(K::tuple, at);
    n->operands.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == TK::block_end || peek().kind == TK::variable_end) break;
      n->operands.push_back(expression());
    }
    return n;
  }

  // Each nested expression or block goes one level deeper: input nested past this is refused
  // rather than overflowing the stack.
  struct Nesting {
    ExpressionParser& p;
    explicit Nesting(ExpressionParser& parser, const Position& at) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail(at, "expressions or blocks nested more than " + std::to_string(kMaxDepth) + " deep");
    }
    ~Nesting() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 200;

  NodePtr expression() {
    Nesting nesting(*this, peek().at);
    NodePtr value = or_expression();
    while (is_name("if")) {
      const Position at = next().at;
      auto n = make(K::conditional, at);
      NodePtr test = or_expression();
      NodePtr otherwise = accept_name("else") ? expression() : nullptr;
      n->operands.push_back(std::move(test));
      n->operands.push_back(std::move(value));
      n->operands.push_back(std::move(otherwise));
      value = std::move(n);
    }
    return value;
  }

  NodePtr binary_chain(K kind, const char* word, NodePtr (ExpressionParser::*operand)()) {
    NodePtr left = (this->*operand)();
    while (is_name(word)) {
      auto n = make(kind, next().at);
      n->operands.push_back(std::move(left));
      n->operands.push_back((this->*operand)());
      left = std::move(n);
    }
    return left;
  }
  NodePtr or_expression() { return binary_chain(K::logical_or, "or", &ExpressionParser::and_expression); }
  NodePtr and_expression() { return binary_chain(K::logical_and, "and", &ExpressionParser::not_expression); }

  NodePtr not_expression() {
    if (is_name("not")) {
      Nesting nesting(*this, peek().at);
      auto n = make(K::logical_not, next().at);
      n->operands.push_back(not_expression());
      return n;
    }
    return compare();
  }

  NodePtr compare();

  NodePtr binary(std::initializer_list<const char*> ops, NodePtr (ExpressionParser::*operand)(), K kind = K::binary) {
    NodePtr left = (this->*operand)();
    for (;;) {
      const char* found = nullptr;
      for (const char* op : ops) {
        if (is_op(op)) found = op;
      }
      if (!found) return left;
      auto n = make(kind, next().at);
      n->name = found;
      n->operands.push_back(std::move(left));
      n->operands.push_back((this->*operand)());
      left = std::move(n);
    }
  }
  NodePtr sum() { return binary({"+", "-"}, &ExpressionParser::concat); }
  NodePtr concat() { return binary({"~"}, &ExpressionParser::product, K::concat); }
  NodePtr product() { return binary({"*", "/", "//", "%"}, &ExpressionParser::power); }
  NodePtr power() { return binary({"**"}, &ExpressionParser::unary_filtered); }
  NodePtr unary_filtered() { return unary(true); }

  NodePtr unary(bool with_filter) {
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      Nesting nesting(*this, peek().at);
      const Token& op = next();
      n = make(op.text == "-" ? K::negate : K::plus, op.at);
      n->operands.push_back(unary(false));
    } else {
      n = primary();
    }
    n = postfix(std::move(n));
    return with_filter ? filter_expression(std::move(n)) : std::move(n);
  }

  NodePtr primary();

  NodePtr parenthesised();

  NodePtr sequence(K kind, const char* close) {
    auto n = make(kind, next().at);
    while (!accept_op(close)) {
      if (!n->operands.empty()) expect_op(",");
      if (accept_op(close)) break;
      n->operands.push_back(expression());
    }
    return n;
  }

  NodePtr dict_literal() {
    auto n = make(K::dict, next().at);
    while (!accept_op("}")) {
      if (!n->operands.empty()) expect_op(",");
      if (accept_op("}")) break;
      n->operands.push_back(expression());
      expect_op(":");
      n->operands.push_back(expression());
    }
    return n;
  }

  NodePtr postfix(NodePtr n);

  NodePtr subscript(NodePtr object);

  // Arguments up to ')' into n (operands after those already there, keyword names at the end).
  void arguments(Node& n) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (accept_op(")")) break;
      if (is_op("*") || is_op("**")) fail(peek().at, "*args and **kwargs in calls are not supported");
      if (peek().kind == TK::name && is_op("=", 1)) {
        n.keywords.push_back(next().text);
        next();
        n.operands.push_back(expression());
      } else {
        if (!n.keywords.empty()) fail(peek().at, "a positional argument follows a keyword argument");
        n.operands.push_back(expression());
      }
    }
  }

  NodePtr call(NodePtr callee) {
    auto n = make(K::call, peek().at);
    n->operands.push_back(std::move(callee));
    arguments(*n);
    return n;
  }

  NodePtr filter(NodePtr input) {
    auto n = make(K::filter, peek().at);
    n->name = expect_name();
    while (accept_op(".")) n->name += "." + expect_name();
    n->operands.push_back(std::move(input));
    if (is_op("(")) arguments(*n);
    return n;
  }

  NodePtr filter_expression(NodePtr n) {
    for (;;) {
      if (accept_op("|")) {
        n = filter(std::move(n));
      } else if (is_name("is")) {
        n = test(std::move(n));
      } else if (is_op("(")) {
        n = call(std::move(n));
      } else {
        return n;
      }
    }
  }

  NodePtr test(NodePtr input) {
    auto n = make(K::test, next().at);
    n->negated = accept_name("not");
    n->name = expect_name();
    n->operands.push_back(std::move(input));
    if (is_op("(")) {
      arguments(*n);
    } else {
      const Token& t = peek();
      const bool argument = (t.kind == TK::name || t.kind == TK::string || t.kind == TK::integer || t.kind == TK::real ||
                             (t.kind == TK::op && (t.text == "[" || t.text == "{"))) &&
                            !(is_name("else") || is_name("or") || is_name("and"));
      if (argument) {
        if (is_name("is")) fail(t.at, "'is' cannot follow a test");
        n->operands.push_back(postfix(primary()));
      }
    }
    return n;
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace tessera::text::jinja
