// Jinja templates as published with models' tokenizers (their chat templates), rendered the way
// transformers renders them: Jinja2's sandboxed environment with trim_blocks and lstrip_blocks,
// loop controls, `{% generation %}` blocks, the `tojson` filter and the `raise_exception`,
// `strftime_now`, `namespace` and `dict` globals. No C++ Jinja library is packaged for our
// machines, so Tessera carries this interpreter of the language's subset such templates use.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"

namespace tessera::text {

// Bytes [begin, end) of a rendered text.
struct TextSpan {
  std::size_t begin = 0, end = 0;
  bool operator==(const TextSpan& o) const { return begin == o.begin && end == o.end; }
};

struct JinjaOutput {
  std::string text;
  // What each `{% generation %}` block wrote, in order (transformers' assistant mask).
  std::vector<TextSpan> generation;
};

class TESSERA_API JinjaTemplate {
 public:
  // Parses `source`. Syntax outside the supported language is a tessera::Error
  // "NAME:LINE:COL: what is wrong".
  JinjaTemplate(const std::string& source, std::string name);

  // `context_json` is a JSON object whose members are the template's variables, in their order
  // (a dict's order shows in `tojson` and `items()`). Errors while rendering (an undefined
  // attribute, `raise_exception`, a type mismatch) are tessera::Error with the position.
  JinjaOutput render(const std::string& context_json) const;

  const std::string& name() const;
  bool has_generation_blocks() const;

  struct Parsed;

 private:
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace tessera::text
