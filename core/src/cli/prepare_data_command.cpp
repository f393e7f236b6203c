// `tessera prepare-data INPUT... --tokenizer SPEC --out FILE`: text, JSON lines, Parquet or a
// `datasets` folder to a token file
// (core/src/data/prepare_data.cpp does the work; this parses the command line, loads the
// plugins, builds the tokenizer and shows progress).
#include <boost/program_options.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/config_file.hpp"
#include "tessera/core/data/prepare_data.hpp"
#include "tessera/core/plugins/plugin_host.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

// SPEC: a YAML file with one tokenizer component, inline YAML ({variant_key: bpe, config: {...}}),
// or a bare variant name (bytes). component_key defaults to tokenizer.
core::ConfigNode tokenizer_node(const std::string& spec) {
  const bool file = spec.size() > 5 && (spec.rfind(".yaml") == spec.size() - 5 || spec.rfind(".yml") == spec.size() - 4);
  core::ConfigNode node = file ? core::load_config_file(spec) : core::parse_config_string(spec, "--tokenizer");
  if (node.is_scalar()) {
    core::ConfigNode map = core::ConfigNode::make_map(node.pos());
    map.set("variant_key", node);
    node = map;
  }
  if (!node.is_map()) throw UsageError("--tokenizer: expected a tokenizer component, a YAML file holding one, or a variant name");
  if (!node.find("component_key")) node.set("component_key", core::ConfigNode::make_scalar("tokenizer", true, node.pos()));
  return node;
}

}  // namespace

int prepare_data_command(const Args& args) {
  core::PrepareOptions options;
  std::vector<std::string> plugin_paths;
  po::options_description visible(
      "usage: tessera prepare-data INPUT... --tokenizer SPEC --out FILE [options]\n\n"
      "Tokenises text files (one document per file, or per blank-line-separated block), JSON lines,\n"
      "Parquet files or Hugging Face datasets folders (save_to_disk) into FILE (the token file\n"
      "dataset/tokens reads) and FILE.json (its index). INPUT may be a quoted glob ('data/*.parquet').\n\noptions");
  visible.add_options()
      ("tokenizer", po::value<std::string>(&options.tokenizer_spec),
       "the tokenizer: a variant name (bytes), inline YAML ({variant_key: bpe, config: {path: tokenizer.json}}) "
       "or a YAML file holding one")
      ("out", po::value<std::string>(&options.out), "the token file to write (its index goes to FILE.json)")
      ("format", po::value<std::string>(&options.format)->default_value("auto"),
       "auto (.jsonl and .ndjson are JSON lines, .parquet Parquet, .arrow Arrow IPC, a folder a datasets "
       "folder, anything else text), text, jsonl, parquet or arrow")
      ("field", po::value<std::string>(&options.field)->default_value("text"),
       "jsonl, parquet, arrow: the field holding the text (a nested one as a.b)")
      ("documents", po::value<std::string>(&options.documents)->default_value("file"),
       "text: one document per file, or per blank-lines block")
      ("eos", po::value<std::string>(&options.eos)->default_value("auto"),
       "between documents: auto (the tokenizer's EOS; nothing if it has none), none, or a token such as </s>")
      ("threads", po::value<std::int64_t>(&options.threads)->default_value(0), "threads (0: every core)")
      ("plugin-path", po::value<std::vector<std::string>>(&plugin_paths)->composing(), "also search DIR for plugins")
      ("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("input", po::value<std::vector<std::string>>(&options.inputs)->composing());
  po::positional_options_description positional;
  positional.add("input", -1);
  if (!parse_command_line(args, visible, hidden, positional)) return 0;
  if (options.inputs.empty()) throw UsageError("missing INPUT (text, JSONL or Parquet files, or a datasets folder)");
  if (options.tokenizer_spec.empty()) throw UsageError("missing --tokenizer");
  if (options.out.empty()) throw UsageError("missing --out FILE");
  if (options.format != "auto" && options.format != "text" && options.format != "jsonl" && options.format != "parquet" &&
      options.format != "arrow") {
    throw UsageError("--format must be auto, text, jsonl, parquet or arrow");
  }
  if (options.documents != "file" && options.documents != "blank-lines") {
    throw UsageError("--documents must be file or blank-lines");
  }
  if (options.threads < 0) throw UsageError("--threads must be 0 (every core) or more");

  core::PluginHost host;
  host.load_directories(core::plugin_search_path({}, plugin_paths));
  core::ConfigNode components = core::ConfigNode::make_map({});
  components.set("tokenizer", tokenizer_node(options.tokenizer_spec));
  core::BuiltComponents built = core::ComponentFactory(host.registry(), RunContext{}).build(components);
  auto tokenizer = std::static_pointer_cast<Tokenizer>(built.instances.at("tokenizer").object);

  const bool tty = ::isatty(STDERR_FILENO);
  const core::PrepareResult r = core::prepare_data(options, *tokenizer, [&](std::int64_t done, std::int64_t total) {
    if (!tty || total <= 0) return;
    std::fprintf(stderr, "\rprepare-data: %3.0f%% (%.1f of %.1f MB)", 100.0 * static_cast<double>(done) / static_cast<double>(total),
                 static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6);
    std::fflush(stderr);
  });
  if (tty) std::fprintf(stderr, "\n");
  std::printf("%s: %lld documents, %lld tokens (%s) from %.1f MB in %.2f s (%.1f MB/s)\n", options.out.c_str(),
              static_cast<long long>(r.documents), static_cast<long long>(r.tokens), r.dtype.c_str(),
              static_cast<double>(r.input_bytes) / 1e6, r.seconds,
              r.seconds > 0 ? static_cast<double>(r.input_bytes) / 1e6 / r.seconds : 0.0);
  return 0;
}

}  // namespace tessera::cli
