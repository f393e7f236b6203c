#include "tessera/core/run/run_plan.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

#include "tessera/core/config/config_file.hpp"
#include "tessera/core/config/config_interpolation.hpp"
#include "tessera/core/config/config_override.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/config/suggest.hpp"
#include "tessera/core/run/spec_sections.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

void reject_unknown_top_level_keys(const ConfigNode& root) {
  const auto& keys = top_level_keys();
  for (const auto& e : root.entries()) {
    bool known = false;
    for (const auto& k : keys) known = known || k == e.key;
    if (!known) {
      throw ConfigIssue(e.key_pos, e.key, "unknown top-level key" + did_you_mean(e.key, keys) + "; expected " + join(keys));
    }
  }
}

ConfigNode default_component(const std::string& kind, const std::string& variant, const SourcePos& pos) {
  ConfigNode node = ConfigNode::make_map(pos);
  node.set("component_key", ConfigNode::make_scalar(kind, true, pos));
  node.set("variant_key", ConfigNode::make_scalar(variant, true, pos));
  return node;
}

// metrics.jsonl is part of every run: add the jsonl_metrics sink when the spec lists none.
void ensure_metrics_sink(ConfigNode& root) {
  ConfigNode* components = root.find("components");
  if (!components || !components->is_map()) return;
  ConfigNode* callbacks = components->find("callbacks");
  if (!callbacks) callbacks = &components->set("callbacks", ConfigNode::make_sequence(SourcePos{"(default)"}));
  if (!callbacks->is_sequence()) return;
  for (const auto& cb : callbacks->items()) {
    const ConfigNode* variant = cb.is_map() ? cb.find("variant_key") : nullptr;
    if (variant && variant->is_scalar() && variant->scalar() == "jsonl_metrics") return;
  }
  callbacks->items().push_back(default_component("callback", "jsonl_metrics", SourcePos{"(default jsonl_metrics callback)"}));
}

// A run of several data-parallel ranks needs a strategy: ddp unless the spec names one.
// Whether it added one.
bool ensure_parallel_strategy(ConfigNode& root, std::int64_t data_parallel) {
  ConfigNode* components = root.find("components");
  if (data_parallel == 1 || !components || !components->is_map() || components->find("parallel")) return false;
  const SourcePos pos{"(default parallel strategy for " + std::to_string(data_parallel) + " data-parallel ranks)"};
  components->set("parallel", default_component("parallel", "ddp", pos));
  return true;
}

// A config subtree as JSON: plain scalars that read as numbers or booleans become those.
nlohmann::json to_json(const ConfigNode& node) {
  if (node.is_map()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& e : node.entries()) out[e.key] = to_json(e.value);
    return out;
  }
  if (node.is_sequence()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : node.items()) out.push_back(to_json(item));
    return out;
  }
  if (node.is_null()) return nullptr;
  const std::string& v = node.scalar();
  if (node.plain()) {
    if (v == "true" || v == "false") return v == "true";
    char* end = nullptr;
    const long long i = std::strtoll(v.c_str(), &end, 10);
    if (!v.empty() && *end == '\0') return i;
    const double d = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0') return d;
  }
  return v;
}

std::string variant_of(const ConfigNode& components, const char* role, const char* fallback) {
  const ConfigNode* node = components.find(role);
  const ConfigNode* variant = node && node->is_map() ? node->find("variant_key") : nullptr;
  return variant && variant->is_scalar() ? variant->scalar() : fallback;
}

// trainer.cuda_graph replays one process's GPU work: refused up front anywhere else.
void check_cuda_graph(const RunPlan& plan, const ConfigNode* trainer, const SourcePos& top) {
  auto refuse = [&](const std::string& what) {
    throw positioned(ConfigError(what, "cuda_graph"), trainer, trainer ? trainer->pos() : top, "trainer");
  };
  if (plan.context.device.rfind("cuda", 0) != 0) {
    refuse("needs settings.device: cuda (a CUDA graph replays GPU work), the device is " + plan.context.device +
           "; set trainer.cuda_graph: false");
  }
  if (plan.env.world_size > 1 || plan.strategy != "none") {
    refuse("captures the step of a single process without components.parallel (this run: strategy " + plan.strategy +
           ", " + std::to_string(plan.env.world_size) + " ranks); set trainer.cuda_graph: false");
  }
}

}  // namespace

const ConfigNode& RunPlan::components() const {
  static const ConfigNode empty;
  const ConfigNode* c = spec.find("components");
  return c ? *c : empty;
}

RunPlan plan_run(const RunOptions& options, const DistributedEnv& env) {
  RunPlan plan;
  plan.source = options.config_path;
  plan.env = env;
  plan.resume = options.resume;
  plan.cli_plugin_paths = options.plugin_paths;

  ConfigNode root = load_config_file(options.config_path);
  for (const auto& o : options.overrides) apply_override(root, o);
  resolve_interpolations(root);
  reject_unknown_top_level_keys(root);

  const SourcePos top{options.config_path, 1, 1};
  std::string name = fs::path(options.config_path).stem().string();
  if (const ConfigNode* n = root.find("name")) {
    if (!n->is_scalar() || n->scalar().empty()) throw ConfigIssue(n->pos(), "name", "expected a run name");
    name = n->scalar();
  }
  if (const ConfigNode* plugins = root.find("plugins")) {
    plan.spec_plugin_paths = read_declared_section<PluginSettings>(plugins, plugins->pos(), "plugins").paths;
  }
  plan.settings = read_declared_section<RunSettings>(root.find("settings"), top, "settings");
  // (generation reads nothing of the trainer's section)
  if (!options.generate_only) plan.trainer = read_declared_section<TrainerSettings>(root.find("trainer"), top, "trainer");
  plan.checkpoint = read_declared_section<CheckpointSettings>(root.find("checkpoint"), top, "checkpoint");
  plan.parallelism = read_declared_section<ParallelismSettings>(root.find("parallelism"), top, "parallelism");
  check_trainer_roles(root.find("components"), top, options.generate_only);
  if (!options.generate_only) check_train_data_unshared(root.find("components"));

  RunContext& context = plan.context;
  context.name = name;
  context.seed = static_cast<std::uint64_t>(plan.settings.seed);
  context.run_dir = !options.run_dir.empty() ? options.run_dir : plan.settings.run_dir.value_or("runs/" + name);
  context.precision = plan.settings.precision;
  context.rank = env.rank;
  context.world_size = env.world_size;
  try {
    context.device = device_for_rank(plan.settings.device, env);
  } catch (const ConfigError& e) {
    const ConfigNode* settings = root.find("settings");
    throw positioned(e, settings, settings ? settings->pos() : top, "settings");
  }
  try {
    context.parallel = resolve_parallel_dims(plan.parallelism, env.world_size, /*launched=*/env.world_size > 1);
  } catch (const ConfigError& e) {
    const ConfigNode* parallelism = root.find("parallelism");
    throw positioned(e, parallelism, parallelism ? parallelism->pos() : top, "parallelism");
  }
  plan.checkpoints = CheckpointStore::for_run(context.run_dir, plan.checkpoint.dir);

  ensure_metrics_sink(root);
  // Context-parallel peers sum their gradients as data-parallel ranks do.
  plan.strategy_defaulted = ensure_parallel_strategy(root, context.parallel.data_parallel() * context.parallel.cp);
  plan.strategy = "none";
  if (const ConfigNode* components = root.find("components"); components && components->is_map()) {
    plan.strategy = variant_of(*components, "parallel", "none");
    if (const ConfigNode* model = components->find("model")) plan.model_config_json = to_json(*model).dump(1);
  }
  if (plan.trainer.cuda_graph) check_cuda_graph(plan, root.find("trainer"), top);
  plan.resolved_yaml = root.to_yaml();
  plan.spec = std::move(root);
  return plan;
}

}  // namespace tessera::core
