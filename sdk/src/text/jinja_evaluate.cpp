// Evaluating a template's expressions: names, literals, attribute and item lookup, calls,
// filters and tests, Python's operators and comparisons; each error with its node's position.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "jinja_builtins.hpp"
#include "jinja_operators.hpp"
#include "jinja_renderer.hpp"
#include "tessera/error.hpp"

namespace tessera::text::jinja {

using K = Node::Kind;

CallArgs Renderer::arguments(const Node& n, std::size_t first) {
  CallArgs args;
  const std::size_t keyword_from = n.operands.size() - n.keywords.size();
  for (std::size_t i = first; i < n.operands.size(); ++i) {
    Value v = evaluate(*n.operands[i]);
    if (i < keyword_from) {
      args.positional.push_back(std::move(v));
    } else {
      args.keyword.emplace_back(n.keywords[i - keyword_from], std::move(v));
    }
  }
  return args;
}

Value Renderer::evaluate(const Node& n) {
  count_step(n);
  try {
    return evaluate_unpositioned(n);
  } catch (const ValueError& e) {
    fail(n, e.message);
  } catch (const tessera::Error&) {
    throw;  // positioned already
  } catch (const std::exception& e) {
    fail(n, e.what());  // a standard library refusal (an index, a number's range) is the template's error too
  }
}

Value Renderer::evaluate_unpositioned(const Node& n) {
  switch (n.kind) {
    case K::literal:
      return n.literal;
    case K::name:
      if (n.name == kBlockText) return block_text_;
      {
        Value v = lookup(n.name);
        return v.is_undefined() ? Value::undefined(n.name) : v;
      }
    case K::list:
    case K::tuple: {
      ValueList items;
      for (const auto& o : n.operands) items.push_back(evaluate(*o));
      return Value::list(std::move(items), n.kind == K::tuple);
    }
    case K::dict: {
      auto d = std::make_shared<Dict>();
      for (std::size_t i = 0; i + 1 < n.operands.size(); i += 2) {
        Value key = evaluate(*n.operands[i]);
        d->set(std::move(key), evaluate(*n.operands[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case K::attribute:
      return get_attribute(evaluate(*n.operands[0]), n.name);
    case K::item:
      return get_item(evaluate(*n.operands[0]), evaluate(*n.operands[1]));
    case K::slice: {
      const auto bound = [&](std::size_t i) { return n.operands[i] ? evaluate(*n.operands[i]) : Value(); };
      return get_slice(evaluate(*n.operands[0]), bound(1), bound(2), bound(3));
    }
    case K::call: {
      const Value callee = evaluate(*n.operands[0]);
      if (!callee.is_callable()) {
        throw ValueError{callee.is_undefined() && !callee.undefined_name().empty()
                             ? "'" + callee.undefined_name() + "' is undefined and cannot be called"
                             : callee.repr() + " is not callable"};
      }
      return charge(callee.as_callable().call(arguments(n, 1)));
    }
    case K::filter: {
      if (!has_filter(n.name)) throw ValueError{"no filter named '" + n.name + "'"};
      return charge(apply_filter(n.name, evaluate(*n.operands[0]), arguments(n, 1)));
    }
    case K::test: {
      if (!has_test(n.name)) throw ValueError{"no test named '" + n.name + "'"};
      return Value::boolean(apply_test(n.name, evaluate(*n.operands[0]), arguments(n, 1)) != n.negated);
    }
    case K::negate:
    case K::plus: {
      const Value v = evaluate(*n.operands[0]);
      if (!v.is_number()) throw ValueError{"bad operand for unary " + std::string(n.kind == K::negate ? "-" : "+") + ": " + v.repr()};
      if (n.kind == K::plus) return v;
      if (v.type() == Value::Type::real) return Value::real(-v.as_real());
      if (v.as_int() == INT64_MIN) throw ValueError{"integer overflow in unary -"};
      return Value::integer(-v.as_int());
    }
    case K::binary:
      return charge(binary_operation(n.name, evaluate(*n.operands[0]), evaluate(*n.operands[1]), kMaxText));
    case K::concat:
      return charge(Value::string(evaluate(*n.operands[0]).str() + evaluate(*n.operands[1]).str()));
    case K::compare:
      return compare(n);
    case K::logical_and: {
      Value left = evaluate(*n.operands[0]);
      return left.truthy() ? evaluate(*n.operands[1]) : left;
    }
    case K::logical_or: {
      Value left = evaluate(*n.operands[0]);
      return left.truthy() ? left : evaluate(*n.operands[1]);
    }
    case K::logical_not:
      return Value::boolean(!evaluate(*n.operands[0]).truthy());
    case K::conditional:
      if (evaluate(*n.operands[0]).truthy()) return evaluate(*n.operands[1]);
      return n.operands[2] ? evaluate(*n.operands[2]) : Value::undefined("the conditional expression's else");
    default:
      fail(n, "not an expression");
  }
}

Value Renderer::compare(const Node& n) {
  Value left = evaluate(*n.operands[0]);
  for (std::size_t i = 0; i < n.operators.size(); ++i) {
    Value right = evaluate(*n.operands[i + 1]);
    const std::string& op = n.operators[i];
    bool holds;
    if (op == "==") holds = equal(left, right);
    else if (op == "!=") holds = !equal(left, right);
    else if (op == "<") holds = less(left, right);
    else if (op == ">") holds = less(right, left);
    else if (op == "<=") holds = !less(right, left);
    else if (op == ">=") holds = !less(left, right);
    else holds = apply_test("in", left, CallArgs{{right}, {}}) == (op == "in");
    if (!holds) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}
}  // namespace tessera::text::jinja
