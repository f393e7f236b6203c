// When and how the trainer saves (tessera/core/train/trainer.hpp): checkpoints and exports at
// their steps, captured at a step boundary and written by the Checkpointer (in the background
// when async), every rank learning whether the last save failed anywhere before going on.
#include <ATen/ops/tensor.h>

#include <chrono>
#include <exception>

#include "tessera/core/train/trainer.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"

namespace tessera::core {

using Clock = std::chrono::steady_clock;

void Trainer::enable_checkpoints(CheckpointContext context) {
  if (context.store.dir().empty()) throw Error("trainer: checkpoints enabled without a checkpoint folder");
  checkpoint_ = std::move(context);
  checkpoint_.model_config_json = export_config_json(checkpoint_.model_config_json, parts_.model->architecture_json());
  // Leftovers of saves a crash interrupted; rank 0 alone, before any rank can start a save.
  if (context_.rank == 0) checkpoint_.store.remove_incomplete();
  checkpointer_ = std::make_unique<Checkpointer>(checkpoint_.settings, checkpoint_.store, checkpoint_.timeout);
}

void Trainer::save(bool checkpoint, bool export_model, const char* why) {
  // Every rank saves at the same step. The save before may have failed on one rank after the
  // last step boundary looked (or on rank 0 alone, in its export): all ranks learn it here,
  // before any starts this save (whose capture may be collective) alone.
  wait_for_last_save();
  // A checkpoint's copy waits for the device anyway: the saved step's flag is judged first.
  settle_pending_nonfinite();
  const auto start = Clock::now();
  CheckpointState captured = capture();
  if (export_model && context_.rank == 0) prepare_export(captured);
  auto state = std::make_shared<const CheckpointState>(std::move(captured));
  checkpointer_->save(state, checkpoint, export_model);
  // Written already: every rank learns now whether that failed anywhere.
  if (!checkpointer_->settings().async) wait_for_last_save();
  pause_s_ = std::chrono::duration<double>(Clock::now() - start).count();
  if (checkpoint) last_checkpoint_step_ = progress_.step;
  if (export_model) last_export_step_ = progress_.step;
  const char* what = checkpoint && export_model ? "checkpoint and model export" : checkpoint ? "checkpoint" : "model export";
  log::info(what, " at step ", progress_.step, " (", why, "): state copied in ", pause_s_ * 1000, " ms",
            checkpointer_->settings().async ? "; writing in the background" : "");
}

void Trainer::save_if_due(bool stopping, bool save_requested) {
  const std::int64_t done = progress_.step;
  if (save_requested && !checkpointer_) {
    log::warn("a callback asked for a checkpoint at step ", done, ", but this trainer has no checkpoint writer");
  }
  if (!checkpointer_ || done == 0) return;
  const CheckpointSettings& ck = checkpoint_.settings;
  const bool periodic = ck.every_steps > 0 && done % ck.every_steps == 0;
  const bool final = stopping && ck.at_end;
  const bool save_now = (periodic || final || save_requested) && last_checkpoint_step_ != done;
  const bool export_now =
      ((ck.export_every_steps > 0 && done % ck.export_every_steps == 0) || (stopping && ck.export_at_end)) &&
      last_export_step_ != done;
  if (save_now || export_now) {
    save(save_now, export_now, save_requested ? "a callback asked" : final ? "end of training" : "periodic");
  }
}

void Trainer::announce_saved_checkpoints(CallbackContext& ctx) {
  if (!checkpointer_) return;
  for (const std::int64_t step : checkpointer_->take_completed()) {
    const CheckpointEvent event{step, checkpoint_.store.checkpoint(step).path().string()};
    for_each_callback("on_checkpoint_saved", progress_.step, [&](Callback& cb) { cb.on_checkpoint_saved(ctx, event); });
  }
}

void Trainer::wait_for_last_save() {
  if (!checkpointer_) return;
  std::exception_ptr failure;
  try {
    checkpointer_->wait();
  } catch (...) {
    failure = std::current_exception();
  }
  // Every rank learns whether the last save failed anywhere, so none goes on into on_train_end
  // (where callbacks may run collectives) while another has failed.
  at::Tensor failed = at::tensor({static_cast<std::int64_t>(failure ? 1 : 0)}, at::kLong);
  context_.communicator->all_reduce(failed, ReduceOp::max);
  if (!failure && failed.item<std::int64_t>() != 0) throw Error("the last checkpoint save failed on another rank (see its log)");
  if (failure) std::rethrow_exception(failure);
}

}  // namespace tessera::core
