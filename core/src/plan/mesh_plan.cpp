// tessera plan: the candidate meshes, each checked as `tessera validate` would and planned rank
// by rank (one rank per pipeline stage), then ranked. See mesh_plan.hpp.
#include "tessera/core/plan/mesh_plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <variant>

#include "plan_parts.hpp"
#include "tessera/core/run/parallelism_settings.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/error.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/registry.hpp"

namespace tessera::core {

namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> low, high;
  for (std::int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The scalar at a path of the spec, or "".
std::string scalar_at(const ConfigNode& spec, const std::vector<const char*>& path) {
  const ConfigNode* node = &spec;
  for (const char* key : path) {
    if (!node->is_map()) return "";
    node = node->find(key);
    if (!node) return "";
  }
  return node->is_scalar() ? node->scalar() : "";
}

// The strings of a list at a path of the spec, or the field's default in `schema`.
std::vector<std::string> strings_at(const ConfigNode& spec, const std::vector<const char*>& path, const Schema* schema) {
  const ConfigNode* node = &spec;
  for (const char* key : path) {
    node = node && node->is_map() ? node->find(key) : nullptr;
  }
  std::vector<std::string> out;
  if (node && node->is_sequence()) {
    for (const ConfigNode& item : node->items()) out.push_back(item.scalar());
    return out;
  }
  const FieldSpec* field = schema ? schema->find(path.back()) : nullptr;
  if (field && std::holds_alternative<std::vector<std::string>>(field->default_value)) {
    return std::get<std::vector<std::string>>(field->default_value);
  }
  return out;
}

plan::StepFacts step_facts(const RunPlan& run, const Model& model, const Registry& registry) {
  plan::StepFacts step;
  step.micro_batch = run.trainer.micro_batch_size;
  step.micro_batches = run.trainer.grad_accum;
  const std::string seq_len = scalar_at(run.spec, {"components", "train_data", "config", "seq_len"});
  step.seq_len = seq_len.empty() ? model.max_seq_len() : std::atoll(seq_len.c_str());
  step.bf16 = run.settings.precision == "bf16";
  // The ddp the host adds for a spec of several data-parallel ranks without a strategy is not the
  // spec's choice: each mesh gets its own default.
  if (!run.strategy_defaulted && run.strategy != "none") step.strategy = run.strategy;
  step.reduce_bytes = scalar_at(run.spec, {"components", "parallel", "config", "reduce_dtype"}) == "bf16" ? 2 : 4;
  step.gather_bytes = scalar_at(run.spec, {"components", "parallel", "config", "param_dtype"}) == "bf16" ? 2 : 4;
  step.optimizer = scalar_at(run.spec, {"components", "optimizer", "variant_key"});
  const std::string implementation = scalar_at(run.spec, {"components", "optimizer", "config", "implementation"});
  step.fused_optimizer = implementation.empty() || implementation == "auto" || implementation == "fused";
  const std::string momentum = scalar_at(run.spec, {"components", "optimizer", "config", "momentum"});
  step.sgd_momentum = momentum.empty() ? 0 : std::atof(momentum.c_str());
  if (step.optimizer == "muon") {
    step.whole_matrices = true;
    const ComponentInfo* info = registry.find("optimizer", "muon");
    step.element_wise = strings_at(run.spec, {"components", "optimizer", "config", "adamw_params"},
                                   info ? &info->schema : nullptr);
  }
  step.vocab = model.vocab_size();
  return step;
}

bool same_mesh(const ParallelDims& a, const ParallelDims& b) {
  return a.pp == b.pp && a.dp_replicate == b.dp_replicate && a.dp_shard == b.dp_shard && a.cp == b.cp && a.tp == b.tp &&
         a.ep == b.ep && a.sequence_parallel == b.sequence_parallel;
}

// What tells the parameters of one pipeline rank from another's: its stages' ends and their
// blocks' kinds (dense or MoE, checkpointed or not); "" when the model does not say its shape.
std::string stage_key(const RunContext& context, const TransformerShape& shape) {
  if (shape.blocks <= 0) return "";
  auto has = [](const std::vector<std::int64_t>& v, std::int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  std::string key;
  const PipelineParallel pipeline = PipelineParallel::of(context, shape.blocks);
  for (const auto& stage : pipeline.local_stages()) {
    key += stage.first ? "F" : "-";
    key += stage.last ? "L" : "-";
    for (std::int64_t b = stage.first_block; b < stage.end_block; ++b) {
      key += has(shape.moe_blocks, b) ? (has(shape.checkpointed_blocks, b) ? 'M' : 'm')
                                      : (has(shape.checkpointed_blocks, b) ? 'D' : 'd');
    }
    key += '|';
  }
  return key;
}

// The first line of a validation message, for the list of refused meshes.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// One mesh, rank by rank (one rank per pipeline stage). Throws ConfigError where the model refuses
// the mesh as it is built.
PlannedMesh plan_mesh(const TrainingRun& run, const RunPlan& spec, const ParallelDims& dims, const TransformerShape& shape,
                      const plan::StepFacts& step) {
  PlannedMesh mesh;
  mesh.dims = dims;
  mesh.strategy = plan::resolved_strategy(step, dims);
  const std::int64_t per_stage = dims.world_size() / dims.pp;
  // Pipeline ranks whose stages hold the same kinds of blocks at the same ends hold the same
  // parameters: the model is built once for them (a deep model's middle stages).
  std::map<std::string, plan::RankModel> built;
  for (std::int64_t stage = 0; stage < dims.pp; ++stage) {
    RunContext context = spec.context;
    context.parallel = dims;
    context.rank = stage * per_stage;
    context.world_size = dims.world_size();
    context.mesh = plan::make_layout_mesh(dims, context.rank);
    const std::string key = stage_key(context, shape);
    auto found = key.empty() ? built.end() : built.find(key);
    if (found == built.end()) {
      const auto model = run.build_model(context);
      found = built.emplace(key.empty() ? std::to_string(stage) : key, plan::describe_rank(*model, context, shape, step))
                  .first;
    }
    plan::RankModel part = found->second;
    part.rank = context.rank;
    part.blocks = plan::rank_blocks(context, shape);
    PlannedRank rank;
    rank.rank = context.rank;
    rank.memory = plan::plan_model_state(part, step, dims);
    rank.memory.activations = plan::plan_activations(part, shape, step, dims);
    rank.communicated = plan::plan_communication(part, shape, step, dims);
    mesh.ranks.push_back(std::move(rank));
  }
  if (dims.pp > 1) mesh.bubble = pipeline_bubble(dims.pp_schedule, dims.pp, dims.pp_stages_per_rank, step.micro_batches);
  return mesh;
}

}  // namespace

double PlannedRank::communicated_total() const {
  double total = 0;
  for (const auto& [group, bytes] : communicated) total += bytes;
  return total;
}

PlannedMemory PlannedMesh::largest() const {
  PlannedMemory m;
  for (const auto& r : ranks) {
    m.parameters = std::max(m.parameters, r.memory.parameters);
    m.reference = std::max(m.reference, r.memory.reference);
    m.gradients = std::max(m.gradients, r.memory.gradients);
    m.optimizer_state = std::max(m.optimizer_state, r.memory.optimizer_state);
    m.activations = std::max(m.activations, r.memory.activations);
  }
  return m;
}

double PlannedMesh::largest_total() const {
  double most = 0;
  for (const auto& r : ranks) most = std::max(most, r.memory.total());
  return most;
}

double PlannedMesh::largest_communicated() const {
  double most = 0;
  for (const auto& r : ranks) most = std::max(most, r.communicated_total());
  return most;
}

std::vector<ParallelDims> candidate_meshes(std::int64_t ranks, const ParallelDims& spec,
                                           const std::vector<std::string>& model_axes, bool hybrid_sharding) {
  auto splits = [&](const char* axis) { return std::find(model_axes.begin(), model_axes.end(), axis) != model_axes.end(); };
  std::vector<ParallelDims> out;
  for (std::int64_t pp : divisors(ranks)) {
    if (pp > 1 && !splits("pp")) continue;
    for (std::int64_t tp : divisors(ranks / pp)) {
      if (tp > 1 && !splits("tp")) continue;
      for (std::int64_t cp : divisors(ranks / pp / tp)) {
        if (cp > 1 && !splits("cp")) continue;
        for (std::int64_t replicate : divisors(ranks / pp / tp / cp)) {
          if (replicate > 1 && !hybrid_sharding) continue;
          const std::int64_t shard = ranks / pp / tp / cp / replicate;
          for (std::int64_t ep : divisors(shard)) {
            if (ep > 1 && (!splits("ep") || replicate > 1)) continue;
            for (bool sp : {false, true}) {
              if (sp && (tp == 1 || !splits("sequence_parallel"))) continue;
              ParallelDims d = spec;
              d.pp = pp;
              d.tp = tp;
              d.cp = cp;
              d.dp_replicate = replicate;
              d.dp_shard = shard;
              d.ep = ep;
              d.sequence_parallel = sp;
              if (pp != spec.pp) d.pp_split_points.clear();
              if (pp == 1) d.pp_stages_per_rank = 1;
              out.push_back(d);
            }
          }
        }
      }
    }
  }
  return out;
}

void rank_meshes(std::vector<PlannedMesh>& meshes) {
  std::stable_sort(meshes.begin(), meshes.end(), [](const PlannedMesh& a, const PlannedMesh& b) {
    return std::make_tuple(!a.fits, a.bubble, a.largest_communicated(), a.largest_total()) <
           std::make_tuple(!b.fits, b.bubble, b.largest_communicated(), b.largest_total());
  });
}

PlanResult plan_meshes(const PlanRequest& request) {
  if (request.ranks < 1 || request.ranks > kMaxPlannedRanks) {
    throw Error("tessera plan: --ranks must be between 1 and " + std::to_string(kMaxPlannedRanks));
  }
  RunOptions options = request.run;
  options.evaluate_only = false;
  options.single_process = true;
  TrainingRun run(options);
  const RunPlan& spec = run.plan();
  PlanResult result;
  const std::string variant = scalar_at(spec.spec, {"components", "model", "variant_key"});
  result.model = "model/" + variant;
  std::vector<std::string> axes;
  if (const ComponentInfo* info = run.plugins().registry().find("model", variant)) {
    for (const char* axis : {"tp", "cp", "ep", "pp", "sequence_parallel"}) {
      if (info->schema.splits_over_axis(axis)) axes.push_back(axis);
    }
  }
  // The model's shape and the step's facts, from the model built for one rank.
  TransformerShape shape;
  plan::StepFacts step;
  {
    RunContext alone = spec.context;
    alone.parallel = ParallelDims{};
    alone.mesh = plan::make_layout_mesh(alone.parallel, 0);
    const auto model = run.build_model(alone);
    shape = model->transformer_shape();
    step = step_facts(spec, *model, run.plugins().registry());
  }
  step.reference_copy = run.keeps_reference_copy();
  result.model_describes_shape = shape.hidden > 0;
  ParallelDims base = spec.context.parallel;
  // The spec's own mesh for this many ranks, where its parallelism: section makes one.
  bool has_own = false;
  ParallelDims own;
  try {
    own = resolve_parallel_dims(spec.parallelism, request.ranks, /*launched=*/true);
    has_own = true;
  } catch (const ConfigError&) {
  }
  std::vector<ParallelDims> candidates = candidate_meshes(request.ranks, base, axes, step.strategy == "fsdp");
  // The spec's own mesh is planned too where the enumeration leaves it out (dp_replicate under a
  // strategy that treats it as dp_shard).
  if (has_own && std::none_of(candidates.begin(), candidates.end(),
                              [&](const ParallelDims& d) { return same_mesh(d, own); })) {
    candidates.push_back(own);
  }
  for (const ParallelDims& dims : candidates) {
    const std::string name = dims.describe();
    try {
      run.check_mesh(dims);
    } catch (const ConfigError& e) {
      result.rejected.push_back(name + ": " + first_line(e.what()));
      continue;
    }
    PlannedMesh mesh;
    try {
      mesh = plan_mesh(run, spec, dims, shape, step);
    } catch (const ConfigError& e) {
      // A model with init_from checks the mesh only as it is built (against its weights' sizes).
      result.rejected.push_back(name + ": " + first_line(e.what()));
      continue;
    } catch (const std::exception& e) {
      throw Error("tessera plan: planning the mesh " + name + ": " + e.what());
    }
    mesh.spec_mesh = has_own && same_mesh(own, dims);
    mesh.fits = request.device_memory_bytes <= 0 || mesh.largest_total() <= request.device_memory_bytes;
    result.meshes.push_back(std::move(mesh));
  }
  rank_meshes(result.meshes);
  return result;
}

}  // namespace tessera::core
