#include "tessera/core/training_run.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/tensor.h>
#include <c10/core/Device.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tessera/callback.hpp"
#include "tessera/core/component_factory.hpp"
#include "tessera/core/checkpoint.hpp"
#include "tessera/core/distributed.hpp"
#include "tessera/log.hpp"
#include "tessera/parallel.hpp"

namespace fs = std::filesystem;

namespace tessera::core {
namespace {

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
  const SourcePos pos{"(default jsonl_metrics callback)"};
  ConfigNode sink = ConfigNode::make_map(pos);
  sink.set("component_key", ConfigNode::make_scalar("callback", true, pos));
  sink.set("variant_key", ConfigNode::make_scalar("jsonl_metrics", true, pos));
  callbacks->items().push_back(std::move(sink));
}

// A CUDA device the machine does not have is a config error, reported before anything is built.
void check_device_exists(const RunSpec& spec) {
  const c10::Device device(spec.context.device);
  if (!device.is_cuda()) return;
  const auto count = at::globalContext().hasCUDA() ? at::detail::getCUDAHooks().deviceCount() : 0;
  if (device.index() < count) return;
  const ConfigNode* settings = spec.root.find("settings");
  const ConfigNode* node = settings ? settings->find("device") : nullptr;
  throw ConfigIssue(node ? node->pos() : spec.root.pos(), "settings.device",
                    "this process needs " + device.str() + " but the machine has " +
                        (count == 0 ? std::string("no usable CUDA device") : std::to_string(count) + " CUDA devices") +
                        "; use device: cpu, or one GPU per local rank");
}

// A run of several ranks needs a strategy: ddp unless the spec names one.
void ensure_parallel_strategy(ConfigNode& root, std::int64_t world_size) {
  ConfigNode* components = root.find("components");
  if (world_size == 1 || !components || !components->is_map() || components->find("parallel")) return;
  const SourcePos pos{"(default parallel strategy for " + std::to_string(world_size) + " ranks)"};
  ConfigNode ddp = ConfigNode::make_map(pos);
  ddp.set("component_key", ConfigNode::make_scalar("parallel", true, pos));
  ddp.set("variant_key", ConfigNode::make_scalar("ddp", true, pos));
  components->set("parallel", std::move(ddp));
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

template <class T>
std::shared_ptr<T> instance(const BuiltComponents& built, const char* name) {
  auto it = built.instances.find(name);
  if (it == built.instances.end()) return nullptr;
  return std::static_pointer_cast<T>(it->second.object);
}

}  // namespace

void seed_everything(std::uint64_t seed, const std::string& device) {
  // A Generator is a handle: seeding the copy seeds the global generator.
  at::Generator cpu = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  cpu.set_current_seed(seed);
  if (device != "cpu") {
    c10::Device d(device);
    if (!d.has_index()) d = c10::Device(c10::kCUDA, 0);
    at::Generator cuda = at::globalContext().defaultGenerator(d);
    cuda.set_current_seed(seed);
  }
}

TrainingRun::TrainingRun(const RunOptions& options)
    : spec_(load_run_spec(options.config_path, options.overrides, options.run_dir)),
      resume_(options.resume),
      env_(read_distributed_env()) {
  log::Level level = log::Level::info;
  if (log::parse_level(spec_.log_level, level)) log::set_level(level);
  spec_.context.rank = env_.rank;
  spec_.context.world_size = env_.world_size;
  // One GPU per local rank: "cuda" means cuda:LOCAL_RANK.
  if (spec_.context.device == "cuda") spec_.context.device = "cuda:" + std::to_string(env_.local_rank);
  // Under `tessera launch` the launcher prefixes every line; under torchrun or srun, do it here.
  if (env_.world_size > 1 && !std::getenv("TESSERA_LAUNCHER")) {
    log::set_prefix("[rank " + std::to_string(env_.rank) + "] ");
  }
  ensure_metrics_sink(spec_.root);
  ensure_parallel_strategy(spec_.root, env_.world_size);
  host_.load_directories(plugin_search_path(spec_.plugin_paths, options.plugin_paths));
  ComponentFactory(host_.registry(), spec_.context).validate(spec_.components());
}

std::string TrainingRun::agreed_resumable_checkpoint() {
  // Rank 0 chooses and tells the others, so every rank restores the same step even if their
  // views of the file system differ.
  std::string path = env_.rank == 0 ? find_resumable_checkpoint(spec_.checkpoint.dir) : std::string();
  if (env_.world_size == 1) return path;
  // find_resumable_checkpoint verified it, including that its metadata's step is its name's.
  at::Tensor step = at::tensor({path.empty() ? std::int64_t{-1} : checkpoint_step(path)}, at::kLong);
  spec_.context.communicator->broadcast(step, 0);
  const std::int64_t chosen = step.item<std::int64_t>();
  if (env_.rank == 0) return path;
  return chosen < 0 ? std::string() : (fs::path(spec_.checkpoint.dir) / checkpoint_name(chosen)).string();
}

std::unique_ptr<Trainer> TrainingRun::make_trainer() {
  // Here rather than at validation: a GPU run's spec may be validated on a machine without one.
  check_device_exists(spec_);
  if (spec_.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  if (spec_.num_threads > 0) at::set_num_threads(static_cast<int>(spec_.num_threads));
  seed_everything(spec_.context.seed, spec_.context.device);
  const std::chrono::milliseconds timeout(static_cast<std::int64_t>(spec_.collective_timeout_s * 1000));
  if (env_.world_size == 1) {
    spec_.context.communicator = make_local_communicator();
  } else if (c10::Device(spec_.context.device).is_cuda()) {
    spec_.context.communicator = make_nccl_communicator(env_, timeout, c10::Device(spec_.context.device));
  } else {
    spec_.context.communicator = make_gloo_communicator(env_, timeout);
  }

  BuiltComponents built = ComponentFactory(host_.registry(), spec_.context).build(spec_.components());
  TrainerParts parts;
  parts.model = instance<Model>(built, "model");
  parts.train_data = instance<Dataset>(built, "train_data");
  parts.loss = instance<Loss>(built, "loss");
  parts.optimizer = instance<Optimizer>(built, "optimizer");
  parts.scheduler = instance<Scheduler>(built, "scheduler");
  parts.parallel = instance<ParallelStrategy>(built, "parallel");
  for (const auto& handle : built.lists["callbacks"]) {
    parts.callbacks.push_back(std::static_pointer_cast<Callback>(handle.object));
  }
  return std::make_unique<Trainer>(std::move(parts), spec_.trainer, spec_.context);
}

TrainResult TrainingRun::train() {
  fs::create_directories(spec_.context.run_dir);
  const fs::path resolved = fs::path(spec_.context.run_dir) / "config.yaml";
  if (env_.rank == 0) {
    std::ofstream out(resolved);
    out << "# Resolved from " << spec_.source << " (includes, --set overrides and ${...} applied)\n"
        << spec_.root.to_yaml();
    if (!out) throw Error("cannot write " + resolved.string());
  }
  auto trainer = make_trainer();
  CheckpointContext checkpoints;
  checkpoints.settings = spec_.checkpoint;
  checkpoints.exports_dir = (fs::path(spec_.context.run_dir) / "exports").string();
  checkpoints.strategy = variant_of(spec_.components(), "parallel", "none");
  checkpoints.config_yaml = spec_.root.to_yaml();
  if (const ConfigNode* model = spec_.components().find("model")) checkpoints.model_config_json = to_json(*model).dump(1);
  checkpoints.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(spec_.collective_timeout_s * 1000));
  trainer->enable_checkpoints(checkpoints);
  if (!resume_.empty()) {
    const std::string path = resume_ == "auto" ? agreed_resumable_checkpoint() : resume_;
    if (path.empty()) {
      log::info("--resume auto: no valid checkpoint under ", spec_.checkpoint.dir, "; starting fresh");
    } else {
      trainer->restore(path);
    }
  }
  log::info("run '", spec_.context.name, "': model has ", trainer->model().num_parameters(),
            " parameters; device ", spec_.context.device, "; run dir ", spec_.context.run_dir);
  TrainResult result = trainer->fit();
  log::info("trained ", result.steps, " steps, ", result.tokens, " tokens in ", result.elapsed_s,
            " s; loss ", result.first_loss, " -> ", result.last_loss);
  return result;
}

}  // namespace tessera::core
