// Jinja's statements (Jinja2 3.1's parser: if, for, set, macro, filter, break/continue and
// transformers' generation blocks) over the expression grammar of jinja_expressions.hpp.
#include <string>
#include <utility>
#include <vector>

#include "jinja_expressions.hpp"
#include "jinja_syntax.hpp"
#include "tessera/error.hpp"

namespace tessera::text::jinja {

namespace {

class Parser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  Parsed run() {
    Parsed parsed;
    parsed.name = name_;
    std::string end;
    parsed.body = body({}, end);
    parsed.has_generation = has_generation_;
    return parsed;
  }

 private:
  // Statements until a block tag named in `ends`; `found` gets that name (its tag is entered).
  Body body(const std::vector<std::string>& ends, std::string& found) {
    Body out;
    for (;;) {
      const Token& t = peek();
      if (t.kind == TK::end) {
        if (!ends.empty()) fail(t.at, "unexpected end of template; expected '" + ends.front() + "'");
        return out;
      }
      if (t.kind == TK::text) {
        auto n = make(K::text, t.at);
        n->literal = Value::string(t.text);
        out.push_back(std::move(n));
        next();
      } else if (t.kind == TK::variable_begin) {
        next();
        auto n = make(K::output, t.at);
        n->operands.push_back(tuple_expression());
        expect(TK::variable_end, "'}}'");
        out.push_back(std::move(n));
      } else if (t.kind == TK::block_begin) {
        next();
        const Token& keyword = peek();
        if (keyword.kind != TK::name) fail(keyword.at, "expected a statement name, got " + describe(keyword));
        for (const auto& end : ends) {
          if (keyword.text == end) {
            found = end;
            next();
            return out;
          }
        }
        out.push_back(statement());
      } else {
        fail(t.at, "unexpected " + describe(t));
      }
    }
  }

  NodePtr statement() {
    Nesting nesting(*this, peek().at);
    const Token& keyword = next();
    const std::string& k = keyword.text;
    if (k == "if") return if_statement(keyword.at);
    if (k == "for") return for_statement(keyword.at);
    if (k == "set") return set_statement(keyword.at);
    if (k == "macro") return macro_statement(keyword.at);
    if (k == "filter") return filter_statement(keyword.at);
    if (k == "generation") {
      has_generation_ = true;
      expect(TK::block_end, "'%}'");
      return block_with_body(K::generation, keyword.at, "endgeneration");
    }
    if (k == "break" || k == "continue") {
      expect(TK::block_end, "'%}'");
      return make(k == "break" ? K::break_ : K::continue_, keyword.at);
    }
    static const char* const known[] = {"elif", "else", "endif", "endfor", "endmacro", "endset", "endfilter", "endgeneration"};
    for (const char* end : known) {
      if (k == end) fail(keyword.at, "unexpected '" + k + "': no open block ends or continues here");
    }
    fail(keyword.at, "the statement '" + k + "' is not supported by Tessera's Jinja interpreter (chat templates use " +
                         "if, for, set, macro, filter, break, continue and generation)");
  }

  NodePtr block_with_body(K kind, Position at, const char* end) {
    auto n = make(kind, at);
    std::string found;
    n->bodies.push_back(body({end}, found));
    expect(TK::block_end, "'%}'");
    return n;
  }

  NodePtr if_statement(Position at) {
    auto n = make(K::if_, at);
    n->operands.push_back(expression());
    expect(TK::block_end, "'%}'");
    for (;;) {
      std::string found;
      n->bodies.push_back(body({"elif", "else", "endif"}, found));
      if (found == "elif") {
        n->operands.push_back(expression());
        expect(TK::block_end, "'%}'");
      } else if (found == "else") {
        expect(TK::block_end, "'%}'");
        std::string end;
        n->bodies.push_back(body({"endif"}, end));
        expect(TK::block_end, "'%}'");
        return n;
      } else {
        expect(TK::block_end, "'%}'");
        return n;
      }
    }
  }

  std::vector<std::string> target_names() {
    std::vector<std::string> names;
    const bool parenthesised = accept_op("(");
    do {
      names.push_back(expect_name());
    } while (accept_op(","));
    if (parenthesised) expect_op(")");
    return names;
  }

  NodePtr for_statement(Position at) {
    auto n = make(K::for_, at);
    n->targets = target_names();
    if (!accept_name("in")) fail(peek().at, "expected 'in' in the for loop, got " + describe(peek()));
    n->operands.push_back(or_expression());
    n->operands.push_back(accept_name("if") ? expression() : nullptr);
    if (accept_name("recursive")) fail(at, "recursive for loops are not supported");
    expect(TK::block_end, "'%}'");
    std::string found;
    n->bodies.push_back(body({"else", "endfor"}, found));
    if (found == "else") {
      expect(TK::block_end, "'%}'");
      std::string end;
      n->bodies.push_back(body({"endfor"}, end));
    }
    expect(TK::block_end, "'%}'");
    return n;
  }

  NodePtr set_statement(Position at) {
    std::vector<std::string> names{expect_name()};
    std::string attribute;
    if (accept_op(".")) {
      attribute = expect_name();
    } else {
      while (accept_op(",")) names.push_back(expect_name());
    }
    if (accept_op("=")) {
      auto n = make(K::set, at);
      n->targets = std::move(names);
      n->name = attribute;
      n->operands.push_back(tuple_expression());
      expect(TK::block_end, "'%}'");
      return n;
    }
    if (!attribute.empty() || names.size() != 1) fail(peek().at, "expected '=' in the set statement");
    auto n = make(K::set_block, at);
    n->targets = std::move(names);
    NodePtr filtered = block_text(at);
    while (accept_op("|")) filtered = filter(std::move(filtered));
    n->operands.push_back(std::move(filtered));
    expect(TK::block_end, "'%}'");
    std::string found;
    n->bodies.push_back(body({"endset"}, found));
    expect(TK::block_end, "'%}'");
    return n;
  }

  NodePtr macro_statement(Position at) {
    auto n = make(K::macro, at);
    n->name = expect_name();
    expect_op("(");
    while (!accept_op(")")) {
      if (!n->targets.empty()) expect_op(",");
      if (accept_op(")")) break;
      n->targets.push_back(expect_name());
      n->operands.push_back(accept_op("=") ? expression() : nullptr);
    }
    expect(TK::block_end, "'%}'");
    std::string found;
    n->bodies.push_back(body({"endmacro"}, found));
    if (peek().kind == TK::name) next();  // {% endmacro name %}
    expect(TK::block_end, "'%}'");
    return n;
  }

  NodePtr filter_statement(Position at) {
    auto n = make(K::filter_block, at);
    NodePtr filtered = block_text(at);
    do {
      filtered = filter(std::move(filtered));
    } while (accept_op("|"));
    n->operands.push_back(std::move(filtered));
    expect(TK::block_end, "'%}'");
    std::string found;
    n->bodies.push_back(body({"endfilter"}, found));
    expect(TK::block_end, "'%}'");
    return n;
  }

  bool has_generation_ = false;
};

}  // namespace

Parsed parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).run(); }

}  // namespace tessera::text::jinja
