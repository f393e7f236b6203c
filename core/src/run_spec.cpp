#include "tessera/core/run_spec.hpp"

#include <filesystem>

#include "tessera/core/field_reader.hpp"
#include "tessera/core/suggest.hpp"

namespace tessera::core {
namespace {

const std::vector<std::string> kTopLevelKeys = {"name", "plugins", "settings", "components", "trainer", "checkpoint"};

template <class T>
T value_as(const std::map<std::string, Value>& values, const char* key) {
  return std::get<T>(values.at(key));
}

bool valid_device(const std::string& d) {
  if (d == "cpu" || d == "cuda") return true;
  if (d.rfind("cuda:", 0) != 0 || d.size() == 5) return false;
  return d.find_first_not_of("0123456789", 5) == std::string::npos;
}

}  // namespace

const ConfigNode& RunSpec::components() const {
  static const ConfigNode empty;
  const ConfigNode* c = root.find("components");
  return c ? *c : empty;
}

const std::vector<ComponentRole>& trainer_roles() {
  static const std::vector<ComponentRole> roles = {
      {"model", "model", true, false, "the model being trained"},
      {"train_data", "dataset", true, false, "where training batches come from"},
      {"loss", "loss", true, false, "the training loss"},
      {"optimizer", "optimizer", true, false, "updates the model's parameters"},
      {"scheduler", "scheduler", false, false, "learning-rate multiplier per step (default: constant 1)"},
      {"parallel", "parallel", false, false,
       "how the ranks share a step: ddp, zero1, zero2 or fsdp (default: ddp when there are several ranks)"},
      {"callbacks", "callback", false, true, "called at the loop's events, in list order"},
  };
  return roles;
}

Schema plugins_schema() {
  Schema s;
  s.strings("paths", "directories searched for plugins first").default_to(std::vector<std::string>{});
  return s;
}

Schema settings_schema() {
  Schema s;
  s.integer("seed", "the one seed every RNG derives from").default_to(1234).at_least(0);
  s.string("run_dir", "where the run writes its files (default runs/NAME)").optional();
  s.string("device", "cpu, cuda or cuda:N; CUDA is touched only when asked for").default_to("cpu");
  s.boolean("deterministic", "use only deterministic LibTorch kernels").default_to(false);
  s.integer("num_threads", "intra-op CPU threads (0: LibTorch's default)").default_to(0).at_least(0);
  s.number("collective_timeout_s", "a collective waiting longer for another rank fails the run")
      .default_to(300.0)
      .greater_than(0);
  s.number("peak_flops", "one device's peak FLOP/s for MFU (0: from the table of known GPUs: H100, H200, A100)")
      .default_to(0.0)
      .at_least(0);
  s.string("log_level", "trace, debug, info, warn or error").default_to("info").one_of(
      {"trace", "debug", "info", "warn", "error"});
  return s;
}

Schema trainer_schema() {
  Schema s;
  s.integer("max_steps", "stop after this many optimizer steps (0: no limit)").default_to(0).at_least(0);
  s.integer("max_tokens", "stop once this many input tokens were consumed (0: no limit)").default_to(0).at_least(0);
  s.number("max_time_s", "stop after this many seconds of training (0: no limit)").default_to(0.0).at_least(0);
  s.integer("grad_accum", "micro-batches per optimizer step").default_to(1).at_least(1);
  s.integer("micro_batch_size", "samples per micro-batch").at_least(1);
  s.number("clip_grad_norm", "clip gradients to this global L2 norm (0: off)").default_to(0.0).at_least(0);
  return s;
}

Schema checkpoint_schema() {
  Schema s;
  s.string("dir", "where checkpoints go (default RUN_DIR/checkpoints)").optional();
  s.integer("every_steps", "save every this many steps (0: only at the end and on request)").default_to(0).at_least(0);
  s.integer("keep_last", "keep the newest N complete checkpoints (0: keep all)").default_to(0).at_least(0);
  s.boolean("at_end", "save when training stops (max_steps, time budget, SIGTERM/SIGINT)").default_to(true);
  s.boolean("async", "copy the state to host memory at the step, write it in the background").default_to(true);
  s.integer("export_every_steps", "export the model as safetensors every N steps (0: never)").default_to(0).at_least(0);
  s.boolean("export_at_end", "export the model as safetensors when training stops").default_to(true);
  return s;
}

RunSpec load_run_spec(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& run_dir_override) {
  RunSpec spec;
  spec.source = path;
  spec.root = load_config_file(path);
  for (const auto& o : overrides) apply_override(spec.root, o);
  resolve_interpolations(spec.root);
  ConfigNode& root = spec.root;

  for (const auto& e : root.entries()) {
    bool known = false;
    for (const auto& k : kTopLevelKeys) known = known || k == e.key;
    if (!known) {
      throw ConfigIssue(e.key_pos, e.key, "unknown top-level key" + did_you_mean(e.key, kTopLevelKeys) +
                                              "; expected " + join(kTopLevelKeys));
    }
  }

  const SourcePos top{path, 1, 1};
  std::string name = std::filesystem::path(path).stem().string();
  if (const ConfigNode* n = root.find("name")) {
    if (!n->is_scalar() || n->scalar().empty()) throw ConfigIssue(n->pos(), "name", "expected a run name");
    name = n->scalar();
  }

  if (const ConfigNode* plugins = root.find("plugins")) {
    auto values = read_section(plugins_schema(), plugins, plugins->pos(), "plugins");
    spec.plugin_paths = value_as<std::vector<std::string>>(values, "paths");
  }

  auto settings = read_section(settings_schema(), root.find("settings"), top, "settings");
  spec.context.name = name;
  spec.context.seed = static_cast<std::uint64_t>(value_as<std::int64_t>(settings, "seed"));
  spec.context.device = value_as<std::string>(settings, "device");
  if (!valid_device(spec.context.device)) {
    const ConfigNode* s = root.find("settings");
    const ConfigNode* d = s ? s->find("device") : nullptr;
    throw ConfigIssue(d ? d->pos() : top, "settings.device",
                      "expected cpu, cuda or cuda:N, got \"" + spec.context.device + "\"");
  }
  const Value& run_dir = settings.at("run_dir");
  spec.context.run_dir = !run_dir_override.empty() ? run_dir_override
                         : std::holds_alternative<std::string>(run_dir) ? std::get<std::string>(run_dir)
                                                                         : "runs/" + name;
  spec.deterministic = value_as<bool>(settings, "deterministic");
  spec.num_threads = value_as<std::int64_t>(settings, "num_threads");
  spec.log_level = value_as<std::string>(settings, "log_level");
  spec.collective_timeout_s = value_as<double>(settings, "collective_timeout_s");
  spec.trainer.peak_flops = value_as<double>(settings, "peak_flops");

  const ConfigNode* trainer_node = root.find("trainer");
  auto trainer = read_section(trainer_schema(), trainer_node, top, "trainer");
  spec.trainer.max_steps = value_as<std::int64_t>(trainer, "max_steps");
  spec.trainer.max_tokens = value_as<std::int64_t>(trainer, "max_tokens");
  spec.trainer.max_time_s = value_as<double>(trainer, "max_time_s");
  spec.trainer.grad_accum = value_as<std::int64_t>(trainer, "grad_accum");
  spec.trainer.micro_batch_size = value_as<std::int64_t>(trainer, "micro_batch_size");
  spec.trainer.clip_grad_norm = value_as<double>(trainer, "clip_grad_norm");
  if (spec.trainer.max_steps == 0 && spec.trainer.max_tokens == 0 && spec.trainer.max_time_s == 0) {
    throw ConfigIssue(trainer_node ? trainer_node->pos() : top, "trainer",
                      "no stop condition: set max_steps, max_tokens or max_time_s");
  }

  auto checkpoint = read_section(checkpoint_schema(), root.find("checkpoint"), top, "checkpoint");
  const Value& checkpoint_dir = checkpoint.at("dir");
  spec.checkpoint.dir = std::holds_alternative<std::string>(checkpoint_dir)
                            ? std::get<std::string>(checkpoint_dir)
                            : (std::filesystem::path(spec.context.run_dir) / "checkpoints").string();
  spec.checkpoint.every_steps = value_as<std::int64_t>(checkpoint, "every_steps");
  spec.checkpoint.keep_last = value_as<std::int64_t>(checkpoint, "keep_last");
  spec.checkpoint.at_end = value_as<bool>(checkpoint, "at_end");
  spec.checkpoint.async = value_as<bool>(checkpoint, "async");
  spec.checkpoint.export_every_steps = value_as<std::int64_t>(checkpoint, "export_every_steps");
  spec.checkpoint.export_at_end = value_as<bool>(checkpoint, "export_at_end");

  const ConfigNode* components = root.find("components");
  for (const auto& role : trainer_roles()) {
    const ConfigNode::Entry* entry = components && components->is_map() ? components->find_entry(role.name) : nullptr;
    const std::string role_path = join_path("components", role.name);
    if (!entry) {
      if (role.required) {
        throw ConfigIssue(components ? components->pos() : top, role_path,
                          std::string("missing: the trainer needs a ") + role.kind + " here (" + role.doc + ")");
      }
      continue;
    }
    if (role.list != entry->value.is_sequence()) {
      throw ConfigIssue(entry->value.pos(), role_path,
                        role.list ? "expected a list of components" : "expected one component, not a list");
    }
    auto check_kind = [&](const ConfigNode& node, const std::string& node_path) {
      const ConfigNode* key = node.is_map() ? node.find("component_key") : nullptr;
      if (key && key->is_scalar() && key->scalar() != role.kind) {
        throw ConfigIssue(key->pos(), join_path(node_path, "component_key"),
                          std::string("the trainer uses ") + role_path + " as its " + role.kind + ", got kind " +
                              key->scalar());
      }
    };
    if (role.list) {
      for (size_t i = 0; i < entry->value.items().size(); ++i) {
        check_kind(entry->value.items()[i], index_path(role_path, i));
      }
    } else {
      check_kind(entry->value, role_path);
    }
  }
  return spec;
}

}  // namespace tessera::core
