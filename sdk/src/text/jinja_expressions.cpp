// Jinja's expression grammar (jinja_expressions.hpp): its longer productions.
#include "jinja_expressions.hpp"

namespace tessera::text::jinja {

NodePtr ExpressionParser::primary() {
  const Token& t = peek();
  switch (t.kind) {
    case TK::name: {
      next();
      auto n = make(K::literal, t.at);
      if (t.text == "true" || t.text == "True") {
        n->literal = Value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        n->literal = Value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        n->literal = Value::none();
      } else {
        n = make(K::name, t.at);
        n->name = t.text;
      }
      return n;
    }
    case TK::string: {
      std::string text;
      while (peek().kind == TK::string) text += next().text;
      auto n = make(K::literal, t.at);
      n->literal = Value::string(std::move(text));
      return n;
    }
    case TK::integer:
    case TK::real: {
      next();
      auto n = make(K::literal, t.at);
      n->literal = t.kind == TK::integer ? Value::integer(t.integer) : Value::real(t.real);
      return n;
    }
    case TK::op:
      if (t.text == "(") return parenthesised();
      if (t.text == "[") return sequence(K::list, "]");
      if (t.text == "{") return dict_literal();
      break;
    default:
      break;
  }
  fail(t.at, "expected an expression, got " + describe(t));
}

NodePtr ExpressionParser::parenthesised() {
  const Position at = next().at;
  if (accept_op(")")) return make(K::tuple, at);
  NodePtr first = expression();
  if (accept_op(")")) return first;
  auto n = make(K::tuple, at);
  n->operands.push_back(std::move(first));
  while (accept_op(",")) {
    if (is_op(")")) break;
    n->operands.push_back(expression());
  }
  expect_op(")");
  return n;
}

NodePtr ExpressionParser::subscript(NodePtr object) {
  const Position at = next().at;
  NodePtr parts[3];
  int colons = 0;
  for (;;) {
    if (is_op("]")) break;
    if (accept_op(":")) {
      if (++colons > 2) fail(peek().at, "too many ':' in a slice");
      continue;
    }
    if (parts[colons]) fail(peek().at, "expected ']' or ':', got " + describe(peek()));
    parts[colons] = expression();
  }
  expect_op("]");
  if (colons == 0) {
    if (!parts[0]) fail(at, "empty subscript");
    auto n = make(K::item, at);
    n->operands.push_back(std::move(object));
    n->operands.push_back(std::move(parts[0]));
    return n;
  }
  auto n = make(K::slice, at);
  n->operands.push_back(std::move(object));
  for (auto& p : parts) n->operands.push_back(std::move(p));
  return n;
}

NodePtr ExpressionParser::postfix(NodePtr n) {
  for (;;) {
    if (is_op(".")) {
      const Position at = next().at;
      if (peek().kind == TK::integer) {
        auto item = make(K::item, at);
        auto index = make(K::literal, peek().at);
        index->literal = Value::integer(next().integer);
        item->operands.push_back(std::move(n));
        item->operands.push_back(std::move(index));
        n = std::move(item);
      } else {
        auto attr = make(K::attribute, at);
        attr->name = expect_name();
        attr->operands.push_back(std::move(n));
        n = std::move(attr);
      }
    } else if (is_op("[")) {
      n = subscript(std::move(n));
    } else if (is_op("(")) {
      n = call(std::move(n));
    } else {
      return n;
    }
  }
}

NodePtr ExpressionParser::compare() {
  const Position at = peek().at;
  NodePtr first = sum();
  NodePtr n;
  for (;;) {
    std::string op;
    if (peek().kind == TK::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                  peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
      op = next().text;
    } else if (accept_name("in")) {
      op = "in";
    } else if (is_name("not") && is_name("in", 1)) {
      next();
      next();
      op = "notin";
    } else {
      break;
    }
    if (!n) {
      n = make(K::compare, at);
      n->operands.push_back(std::move(first));
    }
    n->operators.push_back(op);
    n->operands.push_back(sum());
  }
  return n ? std::move(n) : std::move(first);
}

}  // namespace tessera::text::jinja
