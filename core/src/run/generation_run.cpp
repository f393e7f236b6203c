#include "tessera/core/run/generation_run.hpp"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <filesystem>

#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/run/adapter_checks.hpp"
#include "tessera/core/run/component_defaults.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/core/train/local_strategy.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/log.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/parallel/placement.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/run/precision.hpp"

namespace tessera::core {
namespace {

constexpr const char* kTokenizerInstance = "tessera_generation_tokenizer";

// components.tokenizer when it is one, else the first tokenizer any component holds inline.
const ConfigNode* find_tokenizer(const ConfigNode& components) {
  if (const ConfigNode* top = components.find("tokenizer")) {
    const ConfigNode* kind = top->is_map() ? top->find("component_key") : nullptr;
    if (kind && kind->is_scalar() && kind->scalar() == "tokenizer") return top;
  }
  const ConfigNode* found = nullptr;
  for_each_component(components, "tokenizer", [&](const ConfigNode& node, const std::string&) {
    if (!found) found = &node;
  });
  return found;
}

// The model, its adapters and the tokenizer (under a name of its own), with what they refer to.
ConfigNode generation_components(const ConfigNode& components, const ConfigNode* tokenizer) {
  ConfigNode out = ConfigNode::make_map(components.pos());
  for (const char* role : {"model", "adapters"}) {
    if (const ConfigNode* node = components.find(role)) {
      out.set(role, *node);
      add_referenced_instances(*node, components, out);
    }
  }
  if (tokenizer) {
    out.set(kTokenizerInstance, *tokenizer);
    add_referenced_instances(*tokenizer, components, out);
  }
  return out;
}

// Results packed as float64 (ids below 2^53 exactly): per result its index, finish (1 stop,
// 0 length), length, ids, log-probabilities.
at::Tensor pack(const std::vector<GenerationResult>& results, std::size_t first) {
  std::vector<double> flat;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    flat.push_back(static_cast<double>(first + i));
    flat.push_back(r.finish_reason == "stop" ? 1 : 0);
    flat.push_back(static_cast<double>(r.completion_ids.size()));
    for (const std::int64_t id : r.completion_ids) flat.push_back(static_cast<double>(id));
    flat.insert(flat.end(), r.logprobs.begin(), r.logprobs.end());
  }
  return at::tensor(flat, at::kDouble);
}

void unpack(const at::Tensor& packed, std::int64_t length, std::vector<GenerationResult>& into) {
  const double* v = packed.data_ptr<double>();
  for (std::int64_t pos = 0; pos < length;) {
    GenerationResult& r = into.at(static_cast<std::size_t>(v[pos]));
    r.finish_reason = v[pos + 1] != 0 ? "stop" : "length";
    const auto n = static_cast<std::int64_t>(v[pos + 2]);
    pos += 3;
    for (std::int64_t i = 0; i < n; ++i) r.completion_ids.push_back(static_cast<std::int64_t>(v[pos + i]));
    r.logprobs.assign(v + pos + n, v + pos + 2 * n);
    pos += 2 * n;
  }
}

}  // namespace

ParallelDims generation_dims(const RunPlan& plan, std::int64_t world_size) {
  ParallelDims dims;
  if (world_size == 1) return dims;
  const std::int64_t tp = plan.parallelism.tp;
  if (tp < 1 || world_size % tp != 0) {
    const ConfigNode* parallelism = plan.spec.find("parallelism");
    const ConfigNode* node = parallelism && parallelism->is_map() ? parallelism->find("tp") : nullptr;
    throw ConfigIssue(node ? node->pos() : plan.spec.pos(), "parallelism.tp",
                      "generation splits each model over parallelism.tp " + std::to_string(tp) + " ranks, which does "
                      "not divide the " + std::to_string(world_size) + " ranks launched; launch a multiple of it");
  }
  dims.tp = tp;
  dims.dp_shard = world_size / tp;
  return dims;
}

GenerationRun::GenerationRun(RunOptions options) : plan_([&] {
        options.generate_only = true;
        return plan_and_configure_logging(options);
      }()) {
  host_.load_directories(plugin_search_path(plan_.spec_plugin_paths, plan_.cli_plugin_paths));
  components_ = generation_components(plan_.components(), find_tokenizer(plan_.components()));
  context_ = plan_.context;
  context_.parallel = generation_dims(plan_, plan_.env.world_size);
  RunPlan on_generation_mesh = plan_;
  on_generation_mesh.context = context_;
  ComponentFactory(host_.registry(), context_).validate(components_);
  check_model_splits(on_generation_mesh, host_.registry());
}

GenerationRun::~GenerationRun() = default;

void GenerationRun::finish() {
  if (communicator_) shut_down(*communicator_);
}

void GenerationRun::start() {
  communicator_ = start_process(plan_);
  context_.communicator = communicator_;
  context_.mesh = make_device_mesh(communicator_, context_.parallel);
  built_ = [&] {
    DeferredInitScope deferred;
    return ComponentFactory(host_.registry(), context_).build(components_);
  }();
  model_ = std::static_pointer_cast<Model>(built_.instances.at("model").object);
  if (auto it = built_.instances.find(kTokenizerInstance); it != built_.instances.end()) {
    tokenizer_ = std::static_pointer_cast<Tokenizer>(it->second.object);
  }
  const c10::Device device(context_.device);
  place_model(*model_, device, /*keep_deferred=*/false);

  std::string checkpoint;
  if (!plan_.resume.empty()) {
    checkpoint = plan_.resume == "auto" ? agreed_resumable_checkpoint(plan_, *communicator_) : plan_.resume;
    if (checkpoint.empty()) {
      log::info("--resume auto: no valid checkpoint under ", plan_.checkpoints.dir(), "; generating with the model as built");
    }
  }
  if (!checkpoint.empty()) load_checkpoint(checkpoint);

  const std::string init_from = model_init_from(plan_);
  if (!init_from.empty()) eos_token_ids_ = hf_eos_token_ids(init_from);
  if (eos_token_ids_.empty() && tokenizer_ && tokenizer_->eos_id() >= 0) eos_token_ids_ = {tokenizer_->eos_id()};
  if (tokenizer_ && !tokenizer_->folder().empty()) chat_template_ = text::ChatTemplate::from_folder(tokenizer_->folder());
  if (!chat_template_ && !init_from.empty() && std::filesystem::is_directory(init_from)) {
    chat_template_ = text::ChatTemplate::from_folder(init_from);
  }
  log::info("generating with ", init_from.empty() ? "model/" + built_.instances.at("model").variant : init_from,
            checkpoint.empty() ? std::string() : " from checkpoint " + checkpoint, " on ", context_.device,
            context_.parallel.world_size() > 1 ? " (mesh " + context_.parallel.describe() + ")" : std::string());
}

void GenerationRun::load_checkpoint(const std::string& path) {
  const LoadedCheckpoint ck = read_checkpoint(path, plan_.env.rank, CheckpointParts::model);
  const Placements placements(context_, model_->tensor_parallel_plan(), model_->pipeline_tied_parameters());
  try {
    make_local_strategy()->load_full_parameters(*model_, placements.cut(ck.model));
  } catch (const Error& e) {
    throw CheckpointError("checkpoint " + path + ": " + e.what() +
                          " (the spec's model and adapters must be those of the run that saved it)");
  }
  c10::NoGradGuard no_grad;
  for (auto& item : model_->named_buffers()) {
    if (auto it = ck.model.find(item.key()); it != ck.model.end()) item.value().copy_(it->second);
  }
}

std::vector<GenerationResult> GenerationRun::generate(const std::vector<GenerationRequest>& requests,
                                                      GenerationOptions options) {
  const DeviceMesh& mesh = *context_.mesh;
  const auto groups = static_cast<std::size_t>(mesh.data_parallel().world_size());
  const auto group = static_cast<std::size_t>(mesh.data_parallel().rank());
  // Shares rounded up: rank 0's group holds the first prompt (a single one is printed as it comes).
  const std::size_t first = (requests.size() * group + groups - 1) / groups;
  const std::size_t end = (requests.size() * (group + 1) + groups - 1) / groups;
  const std::vector<GenerationRequest> mine(requests.begin() + static_cast<std::ptrdiff_t>(first),
                                            requests.begin() + static_cast<std::ptrdiff_t>(end));
  if (options.after_token) {
    options.after_token = [first, inner = options.after_token](std::size_t i, const std::vector<std::int64_t>& c) {
      return inner(first + i, c);
    };
  }
  options.device = c10::Device(context_.device);
  std::vector<GenerationResult> results;
  {
    AutocastGuard autocast(options.device, context_.precision);
    results = tessera::generate(*model_, mine, options);
  }
  if (context_.world_size == 1) return results;
  return gather_on_rank0(std::move(results), first, requests.size());
}

std::vector<GenerationResult> GenerationRun::gather_on_rank0(std::vector<GenerationResult> mine, std::size_t first,
                                                            std::size_t total) {
  const DeviceMesh& mesh = *context_.mesh;
  // Tensor-parallel rank 0 of each group speaks for it; the results travel as float64 on the run's
  // device (a few kilobytes, once per call), as its communicator moves tensors.
  const bool speaks = mesh.coordinate(MeshAxis::tp) == 0;
  const at::Tensor packed = speaks ? pack(mine, first) : at::zeros({0}, at::kDouble);
  const std::vector<at::Tensor> all =
      collectives::all_gather_uneven(packed, *communicator_, c10::Device(context_.device));
  if (plan_.env.rank != 0) return mine;
  std::vector<GenerationResult> every(total);
  for (const at::Tensor& rank : all) unpack(rank.contiguous(), rank.numel(), every);
  return every;
}

}  // namespace tessera::core
