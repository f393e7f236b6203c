// The renderer of a parsed template: its scopes, its output and its limits. Statements are
// rendered in jinja_render.cpp, expressions evaluated in jinja_evaluate.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja_syntax.hpp"
#include "tessera/text/jinja.hpp"

namespace tessera::text::jinja {

using Frame = std::unordered_map<std::string, Value>;

struct BreakLoop {};
struct ContinueLoop {};

class Renderer {
 public:
  Renderer(const Parsed& parsed, const Value& context);
  JinjaOutput run();

 private:
  [[noreturn]] void fail(const Node& at, const std::string& what) const;
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v) { (*frames_.back())[name] = std::move(v); }
  void assign_targets(const Node& at, const std::vector<std::string>& names, const Value& v);

  // What `body` writes, without writing it.
  std::string capture(const Body& body);
  void execute(const Body& body);

  // Untrusted templates (they come with downloaded models) cannot render forever or without end.
  void count_step(const Node& n);
  static constexpr std::int64_t kMaxSteps = 2'000'000;
  static constexpr std::size_t kMaxText = std::size_t{256} << 20;
  static constexpr int kMaxMacroDepth = 100;

  // A string or list made by an operator costs a step per KiB, and none may pass kMaxText.
  const Value& charge(const Value& made);
  void statement(const Node& n);
  void statement_unpositioned(const Node& n);
  void set(const Node& n);
  void for_loop(const Node& n);
  void define_macro(const Node& n);
  Value call_macro(const Node& m, const CallArgs& args);
  CallArgs arguments(const Node& n, std::size_t first);
  Value evaluate(const Node& n);
  Value evaluate_unpositioned(const Node& n);
  Value compare(const Node& n);

  const Parsed& parsed_;
  std::vector<std::shared_ptr<Frame>> frames_;
  JinjaOutput out_;
  std::string* sink_ = nullptr;
  Value block_text_;
  std::int64_t steps_ = 0;
  int macro_depth_ = 0;
};

}  // namespace tessera::text::jinja
