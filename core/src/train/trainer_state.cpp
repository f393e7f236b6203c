// The trainer's state for checkpoints: capture() takes host copies at a step boundary (the model
// gathered by the strategy, this rank's optimizer part with the ranges it covers, the data
// position, the generators, the progress); restore() loads them back, resharding the optimizer
// state to this run's ranks and strategy.
#include <ATen/Context.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/checkpoint/reshard.hpp"
#include "tessera/core/checkpoint/state_transfer.hpp"
#include "tessera/core/train/tensor_parallel_state.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/log.hpp"
#include "tessera/parallel/sharded_rng.hpp"

namespace tessera::core {
namespace {

// owned_ranges() names one range per optimizer parameter (tessera/components/strategy.hpp).
std::vector<std::pair<std::int64_t, std::int64_t>> owned_ranges_of(ParallelStrategy& strategy, std::size_t params) {
  auto ranges = strategy.owned_ranges();
  if (ranges.size() != params) {
    throw Error("the parallel strategy's owned_ranges() has " + std::to_string(ranges.size()) +
                " ranges for the optimizer's " + std::to_string(params) + " parameters");
  }
  return ranges;
}

// A Stateful's state_dict() is already a copy (tessera/run/stateful.hpp): only device tensors move.
StateDict on_host(StateDict state) {
  for (auto& [key, t] : state) t = t.detach().to(at::kCPU);
  return state;
}

}  // namespace

CheckpointState Trainer::capture() {
  CheckpointState st;
  st.step = progress_.step;
  st.tokens = progress_.tokens;
  st.samples = progress_.samples;
  st.elapsed_s = elapsed_s();
  st.rank = context_.rank;
  st.world_size = context_.world_size;
  st.strategy = checkpoint_.strategy;
  st.mesh = mesh_->dims().describe();
  Model& model = *parts_.model;
  // The whole model: gathered by the strategy over the data-parallel ranks (a collective under
  // fsdp) onto their rank 0 (a stacked expert's onto the first rank holding it), joined over the
  // tensor-parallel ranks, then the expert-parallel ones, then (with their buffers) over the
  // pipeline's stages, kept by rank 0 as host copies. A group's ranks all hold parts or none do,
  // so every join is a collective of all its ranks or of none.
  auto gather_whole = [&](bool with_buffers) {
    StateDict whole = strategy_.full_parameters(model, /*only_rank=*/0);
    const TensorParallelPlan plan = model.tensor_parallel_plan();
    if (!whole.empty()) whole = join_tensor_parallel(whole, plan, tp_);  // one rank too: its padding
    if (ep_.size() > 1 && !whole.empty()) whole = join_expert_parallel(whole, plan, ep_);
    if (with_buffers && !whole.empty()) {
      for (const auto& item : model.named_buffers()) whole[item.key()] = item.value().detach().to(at::kCPU, false, true);
    }
    if (pp_ && !whole.empty()) whole = gather_state_dicts(whole, *pp_->group());
    return whole;
  };
  StateDict whole = gather_whole(/*with_buffers=*/true);
  // A full fine-tuning run's reference model (its starting weights), gathered the same way: a
  // resume under any mesh goes on comparing with the same reference.
  StateDict reference;
  if (keeps_reference_copy_) {
    keep_reference_copy();
    strategy_.with_reference_weights([&] { reference = gather_whole(/*with_buffers=*/false); });
  }
  if (context_.rank == 0) {
    st.model = std::move(whole);
    st.reference = std::move(reference);
    st.config_yaml = checkpoint_.config_yaml;
    st.model_config_json = checkpoint_.model_config_json;
  }
  st.optimizer_sharded = strategy_.shards_optimizer_state();
  // One writer per distinct part of each parameter's state: every rank of sharded state but a
  // hybrid replica's copy; without sharding, the strategy's rank 0 (one per tensor-parallel rank),
  // and for a stacked expert the first rank holding it (one per expert-parallel rank). Stacked
  // experts are whole on every tensor-parallel rank: tensor-parallel rank 0 writes theirs.
  const auto params = parts_.optimizer->parameters();
  const auto shards = optimizer_shards();
  std::vector<bool> writes(params.size());
  const std::set<const c10::TensorImpl*> tied_copies = pipeline_tied_copies();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (st.optimizer_sharded) {
      writes[i] = !strategy_.is_optimizer_state_replica();
    } else {
      writes[i] = (shards[i].experts ? mesh_->expert_data_parallel() : mesh_->gradient_group()).rank() == 0;
    }
    if (shards[i].experts && tp_.rank() != 0) writes[i] = false;
    // A pipeline's tied embedding is written by its first stage; the last stage's copy is equal.
    if (tied_copies.count(params[i].unsafeGetTensorImpl())) writes[i] = false;
    st.write_optimizer = st.write_optimizer || writes[i];
  }
  if (st.write_optimizer) {
    const auto ranges = owned_ranges_of(strategy_, params.size());
    // A padded vocabulary (pad_vocab_to_multiple_of) has a layout on one rank too: its padding.
    const bool split = tp_.size() > 1 || ep_.size() > 1 || std::any_of(shards.begin(), shards.end(), [](const TensorShard& s) {
                         return s.padded() && s.padded_part(1) != s.whole;
                       });
    for (auto& [key, t] : on_host(parts_.optimizer->state_dict())) {
      const long long index = optimizer_param_index(key);
      if (index < 0 || writes[static_cast<std::size_t>(index)]) st.optimizer[key] = t;
    }
    // Each parameter's name beside its index: a checkpoint resumes under another pipeline split,
    // whose optimizers number their parameters otherwise.
    std::map<const c10::TensorImpl*, std::string> names;
    for (const auto& item : model.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!writes[i]) continue;
      const auto [begin, end] = ranges[i];
      const std::string key = "param." + std::to_string(i);
      const auto name = names.find(params[i].unsafeGetTensorImpl());
      if (name != names.end()) st.optimizer_names[key] = name->second;
      st.optimizer_ranges[key] = at::tensor({begin, end, params[i].numel()}, at::kLong);
      if (split) st.optimizer_layouts[key] = shard_layout(ranks_of(shards[i], tp_, ep_), shards[i], params[i].sizes());
    }
  }
  st.data = on_host(parts_.train_data->state_dict());
  st.rng["cpu"] = at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state();
  if (device_.is_cuda()) st.rng["cuda"] = at::globalContext().defaultGenerator(device_).get_state();
  for (const auto& [key, state] : ShardedRng::state_dict()) st.rng["sharded/" + key] = state;
  // Whose sharded stream it is: only the same tensor-parallel rank may continue it.
  if (ShardedRng::seeded()) st.rng["sharded/tp"] = at::tensor({tp_.rank(), tp_.size()}, at::kLong);
  return st;
}

void Trainer::load_model_state(const LoadedCheckpoint& ck, const std::string& checkpoint_path) {
  Model& model = *parts_.model;
  c10::NoGradGuard no_grad;
  try {
    // Whole parameters, cut to this rank's parts under tensor parallelism.
    strategy_.load_full_parameters(model, cut_tensor_parallel(ck.model, model.tensor_parallel_plan(), tp_, ep_));
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError("checkpoint " + checkpoint_path + ": " + e.what());
  }
  for (auto& item : model.named_buffers()) {
    auto it = ck.model.find(item.key());
    if (it != ck.model.end()) item.value().copy_(it->second);
  }
}

void Trainer::load_reference_copy(const LoadedCheckpoint& ck, const std::string& checkpoint_path) {
  if (!keeps_reference_copy_) return;
  if (ck.reference.empty()) {
    throw CheckpointError("checkpoint " + checkpoint_path + " holds no reference model, which " + parts_.names.loss +
                          " without adapters compares with (it was written by a run without one): start this run "
                          "from its weights with init_from instead of resuming it");
  }
  c10::NoGradGuard no_grad;
  keep_reference_copy();
  Model& model = *parts_.model;
  try {
    strategy_.with_reference_weights([&] {
      strategy_.load_full_parameters(model, cut_tensor_parallel(ck.reference, model.tensor_parallel_plan(), tp_, ep_));
    });
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError("checkpoint " + checkpoint_path + ": the reference model: " + e.what());
  }
}

void Trainer::restore_model(const std::string& checkpoint_path) {
  const LoadedCheckpoint ck = read_checkpoint(
      checkpoint_path, context_.rank, keeps_reference_copy_ ? CheckpointParts::model_and_reference : CheckpointParts::model);
  load_model_state(ck, checkpoint_path);
  load_reference_copy(ck, checkpoint_path);
}

void Trainer::restore(const std::string& checkpoint_path) {
  LoadedCheckpoint ck = read_checkpoint(checkpoint_path, context_.rank);
  load_model_state(ck, checkpoint_path);
  load_reference_copy(ck, checkpoint_path);
  c10::NoGradGuard no_grad;
  const auto params = parts_.optimizer->parameters();
  // By name where the checkpoint has them (another pipeline split numbers parameters otherwise).
  StateDict whole_state = std::move(ck.optimizer);
  if (ck.optimizer_names.empty() && pp_ && pp_->size() > 1 && !whole_state.empty()) {
    // Saved before optimizer state carried names: its indices are a whole model's, not a stage's.
    throw CheckpointError("checkpoint " + checkpoint_path + " numbers its optimizer state by position only (written "
                          "by an older Tessera), which a pipeline stage cannot map to its parameters; resume it "
                          "with parallelism.pp: 1 once and save again");
  }
  if (!ck.optimizer_names.empty()) {
    std::map<const c10::TensorImpl*, std::string> names;
    for (const auto& item : parts_.model->named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
    std::vector<std::string> params_names;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto name = names.find(params[i].unsafeGetTensorImpl());
      if (name == names.end()) {
        throw Error("trainer: the optimizer's parameter " + std::to_string(i) + " is not among " + parts_.names.model +
                    "'s named parameters, so its state cannot be found by name in " + checkpoint_path);
      }
      params_names.push_back(name->second);
    }
    try {
      whole_state = optimizer_state_by_index(whole_state, ck.optimizer_names, params_names);
    } catch (const CheckpointError& e) {
      throw CheckpointError("checkpoint " + checkpoint_path + ": " + e.what());
    }
  }
  // The whole parameters' state cut to this tensor-parallel rank's parts, then to its ranges.
  const auto shards = optimizer_shards();
  std::vector<ShardRanks> ranks;
  for (const auto& shard : shards) ranks.push_back(ranks_of(shard, tp_, ep_));
  const StateDict local = shard_part(whole_state, params, shards, ranks);
  if (strategy_.shards_optimizer_state()) {
    const auto ranges = owned_ranges_of(strategy_, params.size());
    StateDict mine = optimizer_state_for(local, params, &ranges);
    strategy_.with_owned_parameters([&] { parts_.optimizer->load_state_dict(mine); });
  } else {
    parts_.optimizer->load_state_dict(optimizer_state_for(local, params, nullptr));
  }
  parts_.train_data->load_state_dict(ck.data);
  // A Generator is a handle: setting the copy's state sets the global generator's.
  if (ck.rng.count("cpu")) {
    at::Generator cpu = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
    cpu.set_state(ck.rng.at("cpu"));
  }
  if (ck.rng.count("cuda") && device_.is_cuda()) {
    at::Generator cuda = at::globalContext().defaultGenerator(device_);
    cuda.set_state(ck.rng.at("cuda"));
  }
  StateDict sharded;
  for (const auto& [key, state] : ck.rng) {
    if (key.rfind("sharded/", 0) == 0) sharded[key.substr(8)] = state;
  }
  // The sharded stream of the same tensor-parallel rank of the same size continues; under another
  // mesh it starts afresh from this rank's seed (seeded by the run): two ranks must never share one.
  const auto owner = sharded.find("tp");
  if (owner != sharded.end() && owner->second.numel() == 2 && owner->second[0].item<std::int64_t>() == tp_.rank() &&
      owner->second[1].item<std::int64_t>() == tp_.size()) {
    sharded.erase(owner);
    ShardedRng::load_state_dict(sharded);
  }
  progress_.step = ck.metadata.step;
  progress_.tokens = ck.metadata.tokens;
  progress_.samples = ck.metadata.samples;
  progress_.elapsed_s = elapsed_before_ = ck.metadata.elapsed_s;
  last_checkpoint_step_ = ck.metadata.step;
  restored_from_ = checkpoint_path;
  if (context_.rank == 0 && checkpointer_) checkpoint_.store.supersede_after(ck.metadata.step);
  log::info("resumed from ", checkpoint_path, " at step ", ck.metadata.step, " (saved by ", ck.metadata.world_size,
            ck.metadata.world_size == 1 ? " rank" : " ranks", " with ", ck.metadata.strategy, "; now ",
            context_.world_size, context_.world_size == 1 ? " rank" : " ranks", ")");
}

}  // namespace tessera::core
