// Rendering a parsed template's statements: scopes as Jinja keeps them (a for loop's body and a
// macro's call have their own; `namespace` objects carry values out), the limits an untrusted
// template runs within, and the spans of `{% generation %}` blocks. Expressions: jinja_evaluate.cpp.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_builtins.hpp"
#include "jinja_renderer.hpp"
#include "tessera/error.hpp"
#include "tessera/text/jinja.hpp"

namespace tessera::text {

struct JinjaTemplate::Parsed : jinja::Parsed {
  explicit Parsed(jinja::Parsed p) : jinja::Parsed(std::move(p)) {}
};

namespace jinja {
namespace {

using K = Node::Kind;

// The `loop` variable: one object per loop whose fields each iteration updates (a loop of a
// hundred thousand items makes no hundred thousand objects).
class LoopObject {
 public:
  explicit LoopObject(const ValueList& items) : items_(items), index_(std::make_shared<std::int64_t>(0)) {
    for (const char* name : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                             "previtem", "nextitem"}) {
      dict_->items.emplace_back(Value::string(name), Value());
    }
    std::shared_ptr<std::int64_t> index = index_;
    dict_->items.emplace_back(Value::string("cycle"), Value::function("loop.cycle", [index](const CallArgs& a) {
      if (a.positional.empty()) throw ValueError{"loop.cycle() needs at least one value"};
      return a.positional[static_cast<std::size_t>(*index) % a.positional.size()];
    }));
  }

  Value at(std::int64_t i) {
    const auto length = static_cast<std::int64_t>(items_.size());
    *index_ = i;
    auto& f = dict_->items;
    f[0].second = Value::integer(i + 1);
    f[1].second = Value::integer(i);
    f[2].second = Value::integer(length - i);
    f[3].second = Value::integer(length - i - 1);
    f[4].second = Value::boolean(i == 0);
    f[5].second = Value::boolean(i == length - 1);
    f[6].second = Value::integer(length);
    f[7].second = Value::integer(1);
    f[8].second = Value::integer(0);
    f[9].second = i > 0 ? items_[static_cast<std::size_t>(i - 1)] : Value::undefined("there is no previous item");
    f[10].second = i + 1 < length ? items_[static_cast<std::size_t>(i + 1)] : Value::undefined("there is no next item");
    return Value::dict(dict_, /*is_namespace=*/true);  // attributes only
  }

 private:
  const ValueList& items_;
  std::shared_ptr<Dict> dict_ = std::make_shared<Dict>();
  std::shared_ptr<std::int64_t> index_;
};

}  // namespace

Renderer::Renderer(const Parsed& parsed, const Value& context) : parsed_(parsed) {
  frames_.push_back(std::make_shared<Frame>());
  if (context.is_dict()) {
    for (const auto& [k, v] : context.as_dict().items) (*frames_[0])[k.as_string()] = v;
  }
  sink_ = &out_.text;
}

JinjaOutput Renderer::run() {
  try {
    execute(parsed_.body);
  } catch (const BreakLoop&) {
    throw tessera::Error(parsed_.name + ": 'break' outside a loop");
  } catch (const ContinueLoop&) {
    throw tessera::Error(parsed_.name + ": 'continue' outside a loop");
  }
  return std::move(out_);
}

void Renderer::fail(const Node& at, const std::string& what) const {
  throw tessera::Error(where(parsed_.name, at.at) + ": " + what);
}

Value Renderer::lookup(const std::string& name) const {
  for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
    const auto it = (*f)->find(name);
    if (it != (*f)->end()) return it->second;
  }
  return global(name);
}

void Renderer::assign_targets(const Node& at, const std::vector<std::string>& names, const Value& v) {
  if (names.size() == 1) return assign(names[0], v);
  const ValueList items = v.iterate();
  if (items.size() != names.size()) {
    fail(at, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(names.size()) + " names");
  }
  for (std::size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
}

// What `body` writes, without writing it.
std::string Renderer::capture(const Body& body) {
  std::string captured;
  std::string* saved = sink_;
  sink_ = &captured;
  try {
    execute(body);
  } catch (...) {
    sink_ = saved;
    throw;
  }
  sink_ = saved;
  return captured;
}

void Renderer::execute(const Body& body) {
  for (const auto& node : body) statement(*node);
}

// Untrusted templates (they come with downloaded models) cannot render forever or without end.
void Renderer::count_step(const Node& n) {
  if (++steps_ > kMaxSteps) fail(n, "the template takes more than " + std::to_string(kMaxSteps) + " steps to render");
  if (sink_->size() > kMaxText) fail(n, "the template writes more than " + std::to_string(kMaxText >> 20) + " MiB");
}

// A string or list made by an operator costs a step per KiB, and none may pass kMaxText.
const Value& Renderer::charge(const Value& made) {
  const std::size_t size = made.is_string() ? made.as_string().size() : made.is_list() ? made.as_list().size() * 16 : 0;
  if (size > kMaxText) throw ValueError{"a value past " + std::to_string(kMaxText >> 20) + " MiB"};
  steps_ += static_cast<std::int64_t>(size >> 10);
  return made;
}

void Renderer::statement(const Node& n) {
  count_step(n);
  try {
    statement_unpositioned(n);
  } catch (const ValueError& e) {
    fail(n, e.message);  // from the statement itself (unpacking, a loop over a number)
  } catch (const tessera::Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(n, e.what());
  }
}

void Renderer::statement_unpositioned(const Node& n) {
  switch (n.kind) {
    case K::text:
      *sink_ += n.literal.as_string();
      return;
    case K::output:
      *sink_ += evaluate(*n.operands[0]).str();
      return;
    case K::if_:
      for (std::size_t i = 0; i < n.operands.size(); ++i) {
        if (evaluate(*n.operands[i]).truthy()) return execute(n.bodies[i]);
      }
      if (n.bodies.size() > n.operands.size()) execute(n.bodies.back());
      return;
    case K::for_:
      return for_loop(n);
    case K::set:
      return set(n);
    case K::set_block: {
      block_text_ = Value::string(capture(n.bodies[0]));
      assign(n.targets[0], evaluate(*n.operands[0]));
      return;
    }
    case K::filter_block:
      block_text_ = Value::string(capture(n.bodies[0]));
      *sink_ += evaluate(*n.operands[0]).str();
      return;
    case K::macro:
      return define_macro(n);
    case K::break_:
      throw BreakLoop{};
    case K::continue_:
      throw ContinueLoop{};
    case K::generation: {
      if (sink_ != &out_.text) {
        execute(n.bodies[0]);  // inside a macro or a captured block: no position in the output
        return;
      }
      const std::size_t begin = out_.text.size();
      execute(n.bodies[0]);
      out_.generation.push_back({begin, out_.text.size()});
      return;
    }
    default:
      fail(n, "not a statement");
  }
}

void Renderer::set(const Node& n) {
  Value v = evaluate(*n.operands[0]);
  if (n.name.empty()) return assign_targets(n, n.targets, v);
  const Value target = lookup(n.targets[0]);
  if (!target.is_namespace()) fail(n, "cannot assign attribute '" + n.name + "' on '" + n.targets[0] + "': it is not a namespace");
  if (!n.name.empty() && n.name[0] == '_') fail(n, "namespaces cannot store underscore-prefixed attributes");
  target.as_dict().set(n.name, std::move(v));
}

void Renderer::for_loop(const Node& n) {
  const Value iterable = evaluate(*n.operands[0]);
  ValueList items;
  try {
    items = iterable.iterate();
  } catch (const ValueError& e) {
    fail(*n.operands[0], e.message);
  }
  if (n.operands[1]) {  // {% for x in xs if test %}: the loop sees only the items that pass
    ValueList kept;
    for (const auto& item : items) {
      frames_.push_back(std::make_shared<Frame>());
      assign_targets(n, n.targets, item);
      const bool pass = evaluate(*n.operands[1]).truthy();
      frames_.pop_back();
      if (pass) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const auto length = static_cast<std::int64_t>(items.size());
  LoopObject loop(items);
  for (std::int64_t i = 0; i < length; ++i) {
    count_step(n);
    auto frame = std::make_shared<Frame>();
    frames_.push_back(frame);
    assign_targets(n, n.targets, items[static_cast<std::size_t>(i)]);
    (*frame)["loop"] = loop.at(i);
    bool stop = false;
    try {
      execute(n.bodies[0]);
    } catch (const BreakLoop&) {
      stop = true;
    } catch (const ContinueLoop&) {
    } catch (...) {
      frames_.pop_back();
      throw;
    }
    frames_.pop_back();
    if (stop) break;
  }
  if (length == 0 && n.bodies.size() > 1) execute(n.bodies[1]);
}

void Renderer::define_macro(const Node& n) {
  const Node* macro = &n;
  assign(n.name, Value::function(n.name, [this, macro](const CallArgs& args) { return call_macro(*macro, args); }));
}

Value Renderer::call_macro(const Node& m, const CallArgs& args) {
  if (args.positional.size() > m.targets.size()) {
    throw ValueError{"macro '" + m.name + "' takes " + std::to_string(m.targets.size()) + " arguments"};
  }
  if (macro_depth_ >= kMaxMacroDepth) throw ValueError{"macros call macros more than " + std::to_string(kMaxMacroDepth) + " deep"};
  struct Depth {
    int& d;
    explicit Depth(int& depth) : d(++depth) {}
    ~Depth() { --d; }
  } depth(macro_depth_);
  auto frame = std::make_shared<Frame>();
  // Parameters are evaluated in the macro's own scope, over the template's globals.
  std::vector<std::shared_ptr<Frame>> saved = std::move(frames_);
  frames_ = {saved.front(), frame};
  try {
    for (std::size_t i = 0; i < m.targets.size(); ++i) {
      const Value* given = args.get(i, m.targets[i]);
      (*frame)[m.targets[i]] = given ? *given : m.operands[i] ? evaluate(*m.operands[i]) : Value::undefined(m.targets[i]);
    }
    for (const auto& [k, v] : args.keyword) {
      bool known = false;
      for (const auto& t : m.targets) known = known || t == k;
      if (!known) throw ValueError{"macro '" + m.name + "' has no parameter '" + k + "'"};
    }
    std::string text = capture(m.bodies[0]);
    frames_ = std::move(saved);
    return Value::string(std::move(text));
  } catch (...) {
    frames_ = std::move(saved);
    throw;
  }
}

}  // namespace jinja

JinjaTemplate::JinjaTemplate(const std::string& source, std::string name)
    : parsed_(std::make_shared<const Parsed>(jinja::parse(jinja::lex(source, name), name))) {}

const std::string& JinjaTemplate::name() const { return parsed_->name; }
bool JinjaTemplate::has_generation_blocks() const { return parsed_->has_generation; }

JinjaOutput JinjaTemplate::render(const std::string& context_json) const {
  jinja::Value context;
  try {
    context = jinja::from_json(context_json);
  } catch (const jinja::ValueError& e) {
    throw tessera::Error(parsed_->name + ": " + e.message);
  }
  if (!context.is_dict()) throw tessera::Error(parsed_->name + ": the template's variables must be a JSON object");
  return jinja::Renderer(*parsed_, context).run();
}

}  // namespace tessera::text
