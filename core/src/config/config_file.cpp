// Loading a run spec: YAML into ConfigNode trees with positions, and top-level `include:` files
// merged under the including one.
#include "tessera/core/config/config_file.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

SourcePos pos_of(const YAML::Mark& mark, const std::string& file) {
  return SourcePos{file, mark.line + 1, mark.column + 1};
}

// What one parsed text may grow to. yaml-cpp keeps an alias as a reference to its anchor; the tree
// built here copies it, so a few lines of nested aliases ("billion laughs") would expand into
// billions of nodes. Real specs are far below these.
struct Budget {
  std::int64_t nodes = 0;
  std::size_t scalar_bytes = 0;  // of values and keys: an alias of a long one copies its bytes again

  void charge(std::size_t bytes, const SourcePos& pos) {
    scalar_bytes += bytes;
    if (scalar_bytes > config_limits::kMaxExpandedTreeBytes) {
      throw ConfigIssue(pos, "", "the YAML's values expand to more than " +
                                     std::to_string(config_limits::kMaxExpandedTreeBytes) +
                                     " bytes (aliases of a long value?); a run spec is far smaller");
    }
  }
};

ConfigNode from_yaml(const YAML::Node& node, const std::string& file, Budget& budget, int depth) {
  SourcePos pos = pos_of(node.Mark(), file);
  if (++budget.nodes > config_limits::kMaxNodes) {
    throw ConfigIssue(pos, "", "the YAML expands to more than " + std::to_string(config_limits::kMaxNodes) +
                                   " values (aliases of aliases?); a run spec is far smaller");
  }
  if (depth > config_limits::kMaxDepth) {
    throw ConfigIssue(pos, "", "the YAML nests deeper than " + std::to_string(config_limits::kMaxDepth) + " levels");
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return ConfigNode::make_null(pos);
    case YAML::NodeType::Scalar:
      budget.charge(node.Scalar().size(), pos);
      // yaml-cpp tags plain scalars "?" and quoted ones "!".
      return ConfigNode::make_scalar(node.Scalar(), node.Tag() != "!", pos);
    case YAML::NodeType::Sequence: {
      ConfigNode seq = ConfigNode::make_sequence(pos);
      for (const auto& item : node) seq.items().push_back(from_yaml(item, file, budget, depth + 1));
      return seq;
    }
    case YAML::NodeType::Map: {
      ConfigNode map = ConfigNode::make_map(pos);
      for (auto it = node.begin(); it != node.end(); ++it) {
        SourcePos key_pos = pos_of(it->first.Mark(), file);
        if (!it->first.IsScalar()) throw ConfigIssue(key_pos, "", "mapping keys must be plain names");
        const std::string key = it->first.Scalar();
        if (map.find(key)) throw ConfigIssue(key_pos, "", "duplicate key '" + key + "'");
        budget.charge(key.size(), key_pos);  // an alias of a map copies its keys too
        map.entries().push_back({key, key_pos, from_yaml(it->second, file, budget, depth + 1)});
      }
      return map;
    }
  }
  return ConfigNode::make_null(pos);
}

// yaml-cpp 0.7's YAML::LoadAll never returns on some invalid texts (fixed upstream in 0.8): on a
// ',' where a value should begin, as in "- 1\n," or a --set value ", b", the parser emits a null
// document without taking the ',' and LoadAll asks for the next one forever, its memory growing.
// This walks the documents first with yaml-cpp's event parser, which makes the same calls, and
// throws ConfigIssue where a document starts where the one before it started. Then LoadAll ends.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

void refuse_a_text_the_parser_cannot_get_past(const std::string& text, const std::string& source_name) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts documents;
  while (parser.HandleNextDocument(documents)) {
    const auto& starts = documents.starts;
    if (starts.size() < 2 || starts.back().pos != starts[starts.size() - 2].pos) continue;
    const YAML::Mark& at = starts.back();
    const bool in_text = at.pos >= 0 && static_cast<std::size_t>(at.pos) < text.size();
    throw ConfigIssue(pos_of(at, source_name), "",
                      "invalid YAML: " + (in_text ? "'" + std::string(1, text[at.pos]) + "'" : std::string("this")) +
                          " cannot begin a value here (a stray ',' or a flow collection without its [ or {?)");
  }
}

ConfigNode parse_yaml(const std::string& text, const std::string& source_name) {
  if (text.size() > config_limits::kMaxBytes) {
    throw ConfigIssue(SourcePos{source_name, 1, 1}, "",
                      "the text is " + std::to_string(text.size()) + " bytes, more than the " +
                          std::to_string(config_limits::kMaxBytes) + " a run spec may have");
  }
  YAML::Node root;
  try {
    refuse_a_text_the_parser_cannot_get_past(text, source_name);
    // Every document, so that a second one (after ---) is an error rather than silently dropped.
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    if (documents.size() > 1) {
      throw ConfigIssue(pos_of(documents[1].Mark(), source_name), "",
                        "a run spec is one YAML document; this text holds " + std::to_string(documents.size()) +
                            " (a --- starts another): join them, or put the second in a file of its own and include it");
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    throw ConfigIssue(pos_of(e.mark, source_name), "", "invalid YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    // yaml-cpp's own limits (e.g. DeepRecursion) and anything else it refuses.
    throw ConfigIssue(pos_of(e.mark, source_name), "", "invalid YAML: " + e.msg);
  }
  Budget budget;
  return from_yaml(root, source_name, budget, 0);
}

std::vector<std::string> include_list(const ConfigNode& include) {
  std::vector<std::string> out;
  if (include.is_scalar()) {
    out.push_back(include.scalar());
  } else if (include.is_sequence()) {
    for (const auto& item : include.items()) {
      if (!item.is_scalar()) throw ConfigIssue(item.pos(), "include", "expected a file name");
      out.push_back(item.scalar());
    }
  } else {
    throw ConfigIssue(include.pos(), "include", "expected a file name or a list of file names");
  }
  return out;
}

ConfigNode load_with_includes(const fs::path& path, std::vector<fs::path>& stack, int& files,
                              const SourcePos& included_from) {
  if (stack.size() > config_limits::kMaxIncludeDepth) {
    throw ConfigIssue(included_from, "include",
                      "includes nest deeper than " + std::to_string(config_limits::kMaxIncludeDepth) + " files");
  }
  if (++files > config_limits::kMaxIncludes) {
    throw ConfigIssue(included_from, "include",
                      "more than " + std::to_string(config_limits::kMaxIncludes) + " files included in all");
  }
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  for (const auto& open : stack) {
    if (open == canonical) {
      throw ConfigIssue(included_from, "include", "include cycle: " + path.string() +
                                                      " is already being loaded");
    }
  }
  std::ifstream in(path);
  if (!in || fs::is_directory(path, ec)) {
    throw ConfigIssue(included_from, included_from.file.empty() ? "" : "include",
                      "cannot read config file " + path.string() + (fs::is_directory(path, ec) ? ": it is a folder" : ""));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw ConfigIssue(included_from, included_from.file.empty() ? "" : "include",
                      "reading config file " + path.string() + " failed");
  }
  ConfigNode node = parse_yaml(text.str(), path.string());
  if (node.is_null()) node = ConfigNode::make_map(SourcePos{path.string(), 1, 1});
  if (!node.is_map()) {
    throw ConfigIssue(node.pos(), "", "a run spec must be a mapping at the top level");
  }
  const ConfigNode::Entry* include = node.find_entry("include");
  if (!include) return node;

  stack.push_back(canonical);
  ConfigNode merged = ConfigNode::make_map(node.pos());
  for (const auto& name : include_list(include->value)) {
    fs::path target = fs::path(name).is_absolute() ? fs::path(name) : path.parent_path() / name;
    deep_merge(merged, load_with_includes(target, stack, files, include->value.pos()));
  }
  stack.pop_back();
  node.erase("include");
  deep_merge(merged, node);
  return merged;
}


}  // namespace

ConfigNode load_config_file(const std::string& path) {
  std::vector<fs::path> stack;
  int files = 0;
  return load_with_includes(fs::path(path), stack, files, SourcePos{});
}

ConfigNode parse_config_string(const std::string& text, const std::string& source_name) {
  return parse_yaml(text, source_name);
}

void deep_merge(ConfigNode& base, const ConfigNode& overlay) {
  if (!base.is_map() || !overlay.is_map()) {
    base = overlay;
    return;
  }
  for (const auto& e : overlay.entries()) {
    if (ConfigNode* existing = base.find(e.key); existing && existing->is_map() && e.value.is_map()) {
      deep_merge(*existing, e.value);
    } else {
      base.set(e.key, e.value, e.key_pos);
    }
  }
}

}  // namespace tessera::core
