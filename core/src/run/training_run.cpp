#include "tessera/core/run/training_run.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/tensor.h>
#include <c10/core/Device.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "tessera/components/callback.hpp"
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/run/adapter_checks.hpp"
#include "tessera/core/run/component_defaults.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/log.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/parallel/sharded_rng.hpp"

namespace fs = std::filesystem;

namespace tessera::core {

// The plan, with the process-wide effects of planning it: the log level, and the rank prefix
// under torchrun or srun (`tessera launch` prefixes every line itself).
RunPlan plan_and_configure_logging(const RunOptions& options) {
  const DistributedEnv env = options.single_process ? DistributedEnv{} : read_distributed_env();
  RunPlan plan = plan_run(options, env);
  log::Level level = log::Level::info;
  if (log::parse_level(plan.settings.log_level, level)) log::set_level(level);
  if (env.world_size > 1 && !std::getenv("TESSERA_LAUNCHER")) log::set_prefix("[rank " + std::to_string(env.rank) + "] ");
  return plan;
}

namespace {

// A CUDA device the machine does not have is a config error, reported before anything is built.
void check_device_exists(const RunPlan& plan) {
  const c10::Device device(plan.context.device);
  if (!device.is_cuda()) return;
  const auto count = at::globalContext().hasCUDA() ? at::detail::getCUDAHooks().deviceCount() : 0;
  if (device.index() < count) return;
  const ConfigNode* settings = plan.spec.find("settings");
  const ConfigNode* node = settings ? settings->find("device") : nullptr;
  throw ConfigIssue(node ? node->pos() : plan.spec.pos(), "settings.device",
                    "this process needs " + device.str() + " but the machine has " +
                        (count == 0 ? std::string("no usable CUDA device") : std::to_string(count) + " CUDA devices") +
                        "; use device: cpu, or one GPU per local rank");
}

// Context parallelism cuts every sequence into 2 x cp chunks, and sequence parallelism splits a
// rank's slice over the tensor-parallel ranks: every dataset's seq_len (where its config states
// one: the training data, an evaluation's) must divide.
void check_sequence_splits(const RunPlan& plan) {
  const ParallelDims& dims = plan.context.parallel;
  const std::int64_t parts = (dims.cp > 1 ? 2 * dims.cp : 1) * (dims.sequence_parallel ? dims.tp : 1);
  if (parts == 1) return;
  for_each_component(plan.components(), "dataset", [&](const ConfigNode& dataset, const std::string& path) {
    const ConfigNode* config = dataset.find("config");
    const ConfigNode* seq_len = config && config->is_map() ? config->find("seq_len") : nullptr;
    if (!seq_len || !seq_len->is_scalar()) return;
    char* end = nullptr;
    const long long length = std::strtoll(seq_len->scalar().c_str(), &end, 10);
    if (*end != '\0' || length <= 0 || length % parts == 0) return;
    std::string why;
    if (dims.cp > 1) why = "into the 2 x cp (" + std::to_string(2 * dims.cp) + ") chunks of context parallelism";
    if (dims.sequence_parallel) {
      why += std::string(why.empty() ? "over" : ", each over") + " the " + std::to_string(dims.tp) +
             " tensor-parallel ranks of sequence parallelism";
    }
    throw ConfigIssue(seq_len->pos(), path + ".config.seq_len",
                      "seq_len " + seq_len->scalar() + " does not split " + why + "; make it a multiple of " +
                          std::to_string(parts));
  });
}

}  // namespace

void check_model_splits(const RunPlan& plan, const Registry& registry) {
  check_adapter_splits(plan);
  const ParallelDims& dims = plan.context.parallel;
  if (dims.tp == 1 && dims.cp == 1 && dims.ep == 1 && dims.pp == 1) return;
  if (dims.sequence_parallel || dims.cp > 1) check_sequence_splits(plan);
  const ConfigNode* model = plan.components().find("model");
  const ConfigNode* variant = model && model->is_map() ? model->find("variant_key") : nullptr;
  if (!variant || !variant->is_scalar()) return;
  const ComponentInfo* info = registry.find("model", variant->scalar());
  if (!info) return;
  for (const auto& [axis, degree, what] :
       {std::tuple<const char*, std::int64_t, const char*>{"tp", dims.tp, "its layers over tensor-parallel ranks"},
        {"cp", dims.cp, "its sequences over context-parallel ranks"},
        {"ep", dims.ep, "experts over expert-parallel ranks"},
        {"pp", dims.pp, "its blocks into pipeline stages"}}) {
    if (degree == 1 || info->schema.splits_over_axis(axis)) continue;
    throw ConfigIssue(variant->pos(), "components.model.variant_key",
                      "model/" + variant->scalar() + " does not split " + what + ", but parallelism." + axis + " is " +
                          std::to_string(degree) + "; set parallelism." + axis +
                          ": 1 (or use a model that does: " + (std::string(axis) == "ep" ? "gpt_moe, llama with num_experts"
                                                                                  : "gpt, gpt_moe, llama") +
                          ")");
  }
  if (dims.sequence_parallel && !info->schema.splits_over_axis("sequence_parallel")) {
    const ConfigNode* parallelism = plan.spec.find("parallelism");
    const ConfigNode* flag = parallelism && parallelism->is_map() ? parallelism->find("sequence_parallel") : nullptr;
    throw ConfigIssue(flag ? flag->pos() : variant->pos(), "parallelism.sequence_parallel",
                      "model/" + variant->scalar() + " does not run its layers on sequence slices (its experts, say, "
                      "see the whole sequence); set parallelism.sequence_parallel: false");
  }
}

namespace {

// What a pipeline schedule needs of the step's micro-batches: 1f1b and gpipe at least one per
// pipeline rank (fewer leave stages idle for the whole step), interleaved_1f1b groups of pp.
void check_pipeline_micro_batches(const RunPlan& plan) {
  const ParallelDims& dims = plan.context.parallel;
  if (dims.pp == 1) return;
  const std::int64_t m = plan.trainer.grad_accum;
  std::string problem;
  if (m < dims.pp) {
    problem = "trainer.grad_accum " + std::to_string(m) + " is below parallelism.pp " + std::to_string(dims.pp) +
              ": the step's micro-batches are the pipeline's, and " + dims.pp_schedule +
              " needs at least one per stage; raise grad_accum to " + std::to_string(dims.pp) + " or more";
  } else if (dims.pp_schedule == "interleaved_1f1b" && m % dims.pp != 0) {
    problem = "trainer.grad_accum " + std::to_string(m) + " is not a multiple of parallelism.pp " +
              std::to_string(dims.pp) + ": interleaved_1f1b runs micro-batches in groups of pp";
  }
  if (problem.empty()) return;
  const ConfigNode* trainer = plan.spec.find("trainer");
  const ConfigNode* accum = trainer && trainer->is_map() ? trainer->find("grad_accum") : nullptr;
  throw ConfigIssue(accum ? accum->pos() : (trainer ? trainer->pos() : plan.spec.pos()), "trainer.grad_accum", problem);
}

// `parallelism:` for more ranks than this process runs with (validation of such a spec alone is
// fine; training it is not).
void check_mesh_fits_run(const RunPlan& plan) {
  const ParallelDims& dims = plan.context.parallel;
  if (dims.world_size() == plan.env.world_size) return;
  const ConfigNode* parallelism = plan.spec.find("parallelism");
  throw ConfigIssue(parallelism ? parallelism->pos() : plan.spec.pos(), "parallelism",
                    "the mesh " + dims.describe() + " needs " + std::to_string(dims.world_size()) +
                        " ranks but this run has " + std::to_string(plan.env.world_size) + "; start it with tessera launch "
                        "--nproc-per-node " + std::to_string(dims.world_size()) + " (or torchrun, srun)");
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

std::shared_ptr<Communicator> start_process(const RunPlan& plan) {
  // Here rather than at validation: a GPU run's spec may be validated on a machine without one.
  check_device_exists(plan);
  if (plan.settings.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  at::globalContext().setAllowTF32CuBLAS(plan.settings.tf32);
  at::globalContext().setAllowTF32CuDNN(plan.settings.tf32);
  if (plan.settings.num_threads > 0) at::set_num_threads(static_cast<int>(plan.settings.num_threads));
  seed_everything(plan.context.seed, plan.context.device);
  const c10::Device device(plan.context.device);
  if (plan.env.world_size == 1) {
    return make_local_communicator();
  } else if (device.is_cuda()) {
    return make_nccl_communicator(plan.env, plan.settings.collective_timeout(), device);
  } else {
    return make_gloo_communicator(plan.env, plan.settings.collective_timeout());
  }
}

TrainingRun::TrainingRun(const RunOptions& options) : plan_(plan_and_configure_logging(options)) {
  host_.load_directories(plugin_search_path(plan_.spec_plugin_paths, plan_.cli_plugin_paths));
  if (ConfigNode* components = plan_.spec.find("components")) {
    give_datasets_the_model_vocabulary(*components, host_.registry());
  }
  ComponentFactory(host_.registry(), plan_.context).validate(plan_.components());
  check_model_splits(plan_, host_.registry());
  check_export_of_adapters(plan_, nullptr);
  if (!options.evaluate_only) check_pipeline_micro_batches(plan_);
}

void TrainingRun::check_mesh(const ParallelDims& dims) const {
  RunPlan plan = plan_;
  plan.context.parallel = dims;
  ComponentFactory(host_.registry(), plan.context).validate(plan.components());
  check_model_splits(plan, host_.registry());
  check_pipeline_micro_batches(plan);
  if (plan_.trainer.cuda_graph && dims.world_size() > 1) {
    const ConfigNode* trainer = plan_.spec.find("trainer");
    const ConfigNode* flag = trainer && trainer->is_map() ? trainer->find("cuda_graph") : nullptr;
    throw ConfigIssue(flag ? flag->pos() : plan_.spec.pos(), "trainer.cuda_graph",
                      "captures the step of a single process; a mesh of " + std::to_string(dims.world_size()) +
                          " ranks cannot; set trainer.cuda_graph: false");
  }
}

std::shared_ptr<Model> TrainingRun::build_model(const RunContext& context) const {
  const ConfigNode* model = plan_.components().find("model");
  if (!model) throw ConfigIssue(plan_.spec.pos(), "components.model", "the spec has no model to plan");
  ConfigNode only_model = ConfigNode::make_map(plan_.components().pos());
  only_model.set("model", *model);
  if (const ConfigNode* adapters = plan_.components().find("adapters")) {
    only_model.set("adapters", *adapters);
    // With what they refer to (a component of their own config given by reference).
    add_referenced_instances(*adapters, plan_.components(), only_model);
  }
  DeferredInitScope deferred;
  BuiltComponents built = ComponentFactory(host_.registry(), context).build(only_model);
  return instance<Model>(built, "model");
}

bool TrainingRun::keeps_reference_copy() const {
  const ConfigNode* loss = plan_.components().find("loss");
  const ConfigNode* adapters = plan_.components().find("adapters");
  if (!loss || (adapters && adapters->is_sequence() && !adapters->items().empty())) return false;
  ConfigNode only_loss = ConfigNode::make_map(plan_.components().pos());
  only_loss.set("loss", *loss);
  add_referenced_instances(*loss, plan_.components(), only_loss);
  BuiltComponents built = ComponentFactory(host_.registry(), plan_.context).build(only_loss);
  return instance<Loss>(built, "loss")->needs_reference();
}

void TrainingRun::check_adapters() const {
  const ConfigNode* adapters = plan_.components().find("adapters");
  if (!adapters || !adapters->is_sequence() || adapters->items().empty()) return;
  // validate --skip-path-checks of a spec whose weights (the base's or the adapters') are not
  // here: nothing to adapt.
  if (!path_checks_enabled() && !adapter_weights_present(plan_)) return;
  // The whole model, whatever the mesh: a pipeline stage would check only its own blocks'
  // layers against target_modules and an init_from folder.
  RunContext whole = plan_.context;
  whole.parallel = ParallelDims{};
  whole.rank = 0;
  whole.world_size = 1;
  whole.mesh = nullptr;
  build_model(whole);
}

std::string agreed_resumable_checkpoint(const RunPlan& plan, Communicator& comm) {
  // Rank 0 chooses and tells the others, so every rank restores the same step even if their
  // views of the file system differ. newest_valid() verified it, including that its metadata's
  // step is its name's.
  const std::string path = plan.env.rank == 0 ? plan.checkpoints.newest_valid() : std::string();
  at::Tensor step = at::tensor({path.empty() ? std::int64_t{-1} : CheckpointStore::step_of(path)}, at::kLong);
  comm.broadcast(step, 0);
  const std::int64_t chosen = step.item<std::int64_t>();
  if (plan.env.rank == 0) return path;
  return chosen < 0 ? std::string() : plan.checkpoints.checkpoint(chosen).path().string();
}

std::unique_ptr<Trainer> TrainingRun::make_trainer() {
  // Here rather than at validation: a spec for several ranks may be validated by a process alone.
  check_mesh_fits_run(plan_);
  communicator_ = start_process(plan_);
  RunContext context = plan_.context;
  context.communicator = communicator_;
  context.mesh = make_device_mesh(communicator_, context.parallel);
  // Dropout of activations that differ across tensor-parallel ranks draws from a stream of each
  // rank's own (tessera/parallel/sharded_rng.hpp).
  if (context.parallel.tp > 1) ShardedRng::seed(context.seed, context.mesh->coordinate(MeshAxis::tp));

  // Models that support it build without memory for their parameters; the trainer (or fsdp, a
  // unit at a time) gives them storage and their initial values (tessera/nn/deferred_init.hpp).
  BuiltComponents built = [&] {
    DeferredInitScope deferred;
    return ComponentFactory(host_.registry(), context).build(plan_.components());
  }();
  TrainerParts parts;
  parts.model = instance<Model>(built, "model");
  parts.train_data = instance<Dataset>(built, "train_data");
  parts.loss = instance<Loss>(built, "loss");
  parts.optimizer = instance<Optimizer>(built, "optimizer");
  parts.scheduler = instance<Scheduler>(built, "scheduler");
  parts.parallel = instance<ParallelStrategy>(built, "parallel");
  for (const auto& handle : built.lists["adapters"]) parts.adapters.push_back(std::static_pointer_cast<Adapter>(handle.object));
  parts.adapter_parameters = built.adapter_parameters;
  for (const auto& handle : built.lists["callbacks"]) {
    parts.names.callbacks.push_back(handle.kind + "/" + handle.variant + " (components.callbacks[" +
                                    std::to_string(parts.callbacks.size()) + "])");
    parts.callbacks.push_back(std::static_pointer_cast<Callback>(handle.object));
  }
  auto name_of = [&](const char* instance) {
    const auto it = built.instances.find(instance);
    return it == built.instances.end() ? std::string(instance)
                                       : it->second.kind + "/" + it->second.variant + " (components." + instance + ")";
  };
  parts.names.model = name_of("model");
  parts.names.train_data = name_of("train_data");
  parts.names.loss = name_of("loss");
  parts.names.optimizer = name_of("optimizer");
  parts.names.scheduler = name_of("scheduler");
  auto trainer = std::make_unique<Trainer>(std::move(parts), plan_.trainer, context, plan_.settings.peak_flops);
  // A rollout's completions end where the model's generation_config says, as `tessera generate`'s.
  if (const std::string init_from = model_init_from(plan_); !init_from.empty() && std::filesystem::is_directory(init_from)) {
    trainer->set_eos_token_ids(hf_eos_token_ids(init_from));
  }
  return trainer;
}

TrainResult TrainingRun::train() {
  const RunContext& context = plan_.context;
  fs::create_directories(context.run_dir);
  const fs::path resolved = fs::path(context.run_dir) / "config.yaml";
  if (plan_.env.rank == 0) {
    std::ofstream out(resolved);
    out << "# Resolved from " << plan_.source << " (includes, --set overrides and ${...} applied)\n"
        << plan_.resolved_yaml;
    if (!out) throw Error("cannot write " + resolved.string());
  }
  auto trainer = make_trainer();
  if (plan_.checkpoint.export_format == "hf" && !trainer->model().exports_hugging_face()) {
    // (adapters are merged into the weights of the Hugging Face folder)
    const ConfigNode* section = plan_.spec.find("checkpoint");
    const ConfigNode* node = section ? section->find("export_format") : nullptr;
    throw ConfigIssue(node ? node->pos() : plan_.spec.pos(), "checkpoint.export_format",
                      "this model has no Hugging Face format (model/gpt and model/llama have one); "
                      "use export_format: tessera");
  }
  // Checked here rather than at validation: the tokenizer may be made by the same pipeline that
  // prepares the data, after the spec was written.
  if (!plan_.checkpoint.export_tokenizer.empty() && tokenizer_files_at(plan_.checkpoint.export_tokenizer).empty()) {
    const ConfigNode* section = plan_.spec.find("checkpoint");
    const ConfigNode* node = section ? section->find("export_tokenizer") : nullptr;
    throw ConfigIssue(node ? node->pos() : plan_.spec.pos(), "checkpoint.export_tokenizer",
                      plan_.checkpoint.export_tokenizer +
                          " is not a tokenizer file or a folder holding one (tokenizer.json, tokenizer.model, ...)");
  }
  check_export_of_adapters(plan_, trainer.get());
  CheckpointContext checkpoints;
  checkpoints.base_model = model_init_from(plan_);
  checkpoints.settings = plan_.checkpoint;
  checkpoints.store = plan_.checkpoints;
  checkpoints.strategy = plan_.strategy;
  checkpoints.config_yaml = plan_.resolved_yaml;
  checkpoints.model_config_json = plan_.model_config_json;
  checkpoints.timeout = plan_.settings.collective_timeout();
  trainer->enable_checkpoints(checkpoints);
  std::string resume_from;
  if (!plan_.resume.empty()) {
    resume_from = plan_.resume == "auto" ? agreed_resumable_checkpoint(plan_, *communicator_) : plan_.resume;
    if (resume_from.empty()) {
      log::info("--resume auto: no valid checkpoint under ", plan_.checkpoints.dir(), "; starting fresh");
    }
  }
  if (!resume_from.empty()) {
    trainer->restore(resume_from);  // sets aside the checkpoints after its step
  } else if (plan_.env.rank == 0) {
    // A fresh run in a folder that holds checkpoints: they are another run's history. Left in
    // place, this run would keep them instead of its own saves of the same steps and
    // `--resume auto` could later pick them; set aside before any rank saves.
    plan_.checkpoints.supersede_after(0);
  }
  const std::int64_t total = trainer->total_parameter_count(), trainable = trainer->parameter_count();
  log::info("run '", context.name, "': model has ", total, " parameters",
            trainable == total ? std::string() : " (" + std::to_string(trainable) + " trainable, the adapters')",
            "; device ", context.device, "; run dir ", context.run_dir);
  TrainResult result = trainer->fit();
  trainer.reset();
  shut_down(*communicator_);
  log::info("trained ", result.steps, " steps, ", result.tokens, " tokens in ", result.elapsed_s, " s; loss ",
            result.first_loss, " -> ", result.last_loss);
  return result;
}

}  // namespace tessera::core
