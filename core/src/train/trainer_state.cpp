// The trainer's state for checkpoints: capture() takes host copies at a step boundary (the model
// gathered whole by the strategy and the placements, this rank's optimizer part with the ranges
// it covers, the data position (with a rollout still being trained on), the generators, the
// progress); restore() loads them back, cut by this run's placements and strategy.
#include <c10/core/GradMode.h>

#include "tessera/core/checkpoint/checkpoint_reader.hpp"
#include "tessera/core/checkpoint/generator_state.hpp"
#include "tessera/core/checkpoint/optimizer_state.hpp"
#include "tessera/core/train/trainer.hpp"
#include "tessera/formats/jsonl_steps.hpp"
#include "step_inputs.hpp"
#include "tessera/log.hpp"

namespace tessera::core {
namespace {

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
  // fsdp) onto their rank 0, then by the placements over the model's axes onto rank 0.
  auto gather_whole = [&](bool with_buffers) {
    StateDict local = strategy_.full_parameters(model, /*only_rank=*/0);
    if (with_buffers && !local.empty()) {
      for (const auto& item : model.named_buffers()) local[item.key()] = item.value().detach().to(at::kCPU, false, true);
    }
    return local.empty() ? local : placements_.gather_whole(local);
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
  capture_optimizer_state(st, {*parts_.optimizer, strategy_, *optimizer_placements_});
  st.data = on_host(parts_.train_data->state_dict());
  save_rollout(st.data);
  st.rng = capture_generators(device_, placements_.tensor_ranks());
  return st;
}

StateDict Trainer::whole_weights() {
  // Refused before the strategy's gather (a collective and a host copy of the model) is spent.
  placements_.whole_everywhere({});
  return placements_.whole_everywhere(strategy_.full_parameters(*parts_.model, /*only_rank=*/-1));
}

namespace {

// Runs `load`; an error it throws becomes a CheckpointError led by `where` (the file, the part).
template <class Load>
void naming_the_checkpoint(const std::string& where, Load&& load) {
  try {
    load();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(where + e.what());
  }
}

}  // namespace

void Trainer::load_model_state(const LoadedCheckpoint& ck, const std::string& checkpoint_path) {
  c10::NoGradGuard no_grad;
  // Whole parameters, cut to this rank's parts by its placements.
  naming_the_checkpoint("checkpoint " + checkpoint_path + ": ",
                        [&] { strategy_.load_full_parameters(*parts_.model, placements_.cut(ck.model)); });
  for (auto& item : parts_.model->named_buffers()) {
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
  naming_the_checkpoint("checkpoint " + checkpoint_path + ": the reference model: ", [&] {
    strategy_.with_reference_weights(
        [&] { strategy_.load_full_parameters(*parts_.model, placements_.cut(ck.reference)); });
  });
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
  // By name where the checkpoint has them (another pipeline split numbers parameters otherwise).
  restore_optimizer_state(std::move(ck.optimizer), ck.optimizer_names,
                          {*parts_.optimizer, strategy_, *optimizer_placements_},
                          mesh_->dims().pp > 1, checkpoint_path, parts_.names.model);
  progress_.step = ck.metadata.step;
  load_rollout(ck.data, checkpoint_path);
  parts_.train_data->load_state_dict(ck.data);
  restore_generators(ck.rng, device_, placements_.tensor_ranks());
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

// A checkpoint between a rollout's steps (num_iterations > 1) holds the rollout: its steps still
// to come train on it, and the weights that sampled it are gone. Beside the data's state, by rank.
void Trainer::save_rollout(StateDict& data) const {
  if (!rollout_settings_ || !rollout_ || progress_.step % rollout_settings_->num_iterations == 0) return;
  for (std::size_t i = 0; i < rollout_->micro_batches.size(); ++i) {
    const std::string key = "rollout." + std::to_string(i) + ".";
    data[key + "input_ids"] = rollout_->micro_batches[i].input_ids.clone();
    data[key + "labels"] = rollout_->micro_batches[i].labels.clone();
    data[key + "units"] = at::tensor({rollout_->micro_batches[i].num_target_tokens}, at::kLong);
    data[key + "advantages"] = rollout_->rows[i].advantages.clone();
    if (rollout_->rows[i].old_logps.defined()) data[key + "old_logps"] = rollout_->rows[i].old_logps.to(at::kCPU);
  }
}

void Trainer::load_rollout(StateDict& data, const std::string& checkpoint_path) {
  StateDict saved;
  for (auto it = data.begin(); it != data.end();) {
    if (it->first.rfind("rollout.", 0) == 0) {
      saved.insert(*it);
      it = data.erase(it);
    } else {
      ++it;
    }
  }
  if (!rollout_settings_) return;
  if (context_.rank == 0) {
    // Lines past the checkpoint belong to an attempt that did not reach its next one.
    keep_jsonl_steps_up_to(in_run_dir(context_, "rollouts.jsonl"), progress_.step);
    rollouts_started_ = true;
  }
  if (progress_.step % rollout_settings_->num_iterations == 0) return;
  auto rollout = std::make_unique<Rollout>();
  for (std::size_t i = 0;; ++i) {
    const std::string key = "rollout." + std::to_string(i) + ".";
    const auto ids = saved.find(key + "input_ids");
    if (ids == saved.end()) break;
    Batch batch;
    batch.input_ids = ids->second;
    batch.labels = saved.at(key + "labels");
    batch.num_target_tokens = saved.at(key + "units").item<std::int64_t>();
    RolloutRows rows;
    rows.advantages = saved.at(key + "advantages");
    if (const auto old = saved.find(key + "old_logps"); old != saved.end()) rows.old_logps = old->second.to(device_);
    rollout->micro_batches.push_back(std::move(batch));
    rollout->rows.push_back(std::move(rows));
  }
  if (static_cast<std::int64_t>(rollout->micro_batches.size()) != settings_.grad_accum) {
    throw CheckpointError("checkpoint " + checkpoint_path + " was saved at step " + std::to_string(progress_.step) +
                          ", inside a rollout that num_iterations " + std::to_string(rollout_settings_->num_iterations) +
                          " trains on again, and holds " + std::to_string(rollout->micro_batches.size()) +
                          " of its micro-batches for this rank, not grad_accum's " +
                          std::to_string(settings_.grad_accum) +
                          ": resume it with the ranks and micro-batches that saved it, or from a checkpoint at a multiple "
                          "of num_iterations");
  }
  rollout_ = std::move(rollout);
}

}  // namespace tessera::core
