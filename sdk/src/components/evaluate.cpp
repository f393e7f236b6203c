#include "tessera/components/evaluate.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>

#include <exception>

#include "tessera/run/communicator.hpp"
#include "tessera/parallel/context_parallel.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/parallel/pipeline_parallel.hpp"
#include "tessera/error.hpp"
#include "tessera/run/precision.hpp"
#include "tessera/run/token_check.hpp"

namespace tessera {
namespace {

// The next batch, checked, with every rank's word on whether drawing it worked: a rank whose
// data fails (a read error, a token id past the vocabulary) must not leave the others waiting in
// the next forward pass's collective (fsdp) or pairing the result's all-reduce with some other
// collective of the failed rank. Each rank throws: its own error, or one naming the other rank.
Batch draw_agreed(Dataset& data, std::int64_t micro_batch_size, std::int64_t vocab_size, const RunContext& run) {
  Batch batch;
  std::exception_ptr failure;
  try {
    batch = data.next_batch(micro_batch_size);
    check_token_ids(batch, vocab_size);
  } catch (...) {
    failure = std::current_exception();
  }
  if (run.communicator && run.communicator->world_size() > 1) {
    at::Tensor failed = at::scalar_tensor(failure ? 1 : 0, at::kLong);
    run.communicator->all_reduce(failed, ReduceOp::max);
    if (!failure && failed.item<std::int64_t>() != 0) {
      throw Error("the evaluation data failed on another rank (its log says why); no rank went on evaluating");
    }
  }
  if (failure) std::rethrow_exception(failure);
  return batch;
}

}  // namespace

EvalTotals evaluate_loss(Model& model, Loss& loss, Dataset& data, std::int64_t batches,
                         std::int64_t micro_batch_size, const RunContext& run, const ReferenceLogits& reference) {
  const c10::Device device(run.device);
  const bool needs_reference = loss.needs_reference();
  if (needs_reference && !reference) {
    throw Error("the loss compares the model with a reference model (Loss::needs_reference), which nothing here "
                "provides: evaluate it in a trainer's run (callback/evaluation, tessera eval)");
  }
  const std::vector<std::string> metric_names = loss.metric_names();
  (void)loss.take_metric_sums();  // a step's, if any were left: the evaluation's start from nothing
  model.eval();
  at::Tensor sums;  // summed loss, target tokens, input tokens, batches
  try {
    c10::NoGradGuard no_grad;
    AutocastGuard autocast(device, run.precision);
    // A vocabulary split over tensor-parallel ranks goes to the loss as hidden states and head, as
    // in training: the loss reduces over the ranks instead of gathering whole logits.
    // So does a context-parallel slice, whose loss is taken on its labels and summed over the
    // slices below.
    // So do pipeline stages: the batch goes through this rank's stages, the last takes the loss.
    const ContextParallel cp = ContextParallel::of(run);
    const PipelineParallel pp = PipelineParallel::transport_of(run);
    const bool from_hidden = pp.size() > 1 || (model.has_output_head() && (loss.takes_hidden_states() ||
                                                                           model.output_head().vocab_parallel() ||
                                                                           cp.size() > 1));
    // Summed on the device: no host synchronisation until the loop is done.
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
    std::int64_t targets = 0, inputs = 0;
    const std::int64_t vocab_size = model.vocab_size();
    for (std::int64_t i = 0; i < batches; ++i) {
      Batch batch = draw_agreed(data, micro_batch_size, vocab_size, run);
      const at::Tensor input_ids = batch.input_ids.to(device), labels = batch.labels.to(device);
      const at::Tensor documents = batch.document_ids.defined() ? batch.document_ids.to(device) : at::Tensor();
      if (needs_reference) {
        if (pp.size() > 1) throw Error("a loss with a reference model is not evaluated under pipeline parallelism");
        loss.take_reference(reference(input_ids, documents), labels);
        model.eval();  // the reference forward may have left it in training mode
      }
      if (pp.size() > 1) {
        // Stage by stage in the data's order: each takes the stage before's output, the last the loss.
        PendingSends sends;
        at::Tensor hidden;
        for (std::size_t local = 0; local < pp.local_stages().size(); ++local) {
          const PipelineStage& stage = pp.local_stages()[local];
          if (!stage.first) hidden = pp.receive(stage.index - 1, (stage.index - 1) * batches + i, device);
          const at::Tensor out = model.forward_stage(local, input_ids, hidden, documents);
          if (stage.last) {
            loss_sum += loss_from_hidden(loss, out, model.output_head(), cp.slice(labels)).sum.to(at::kDouble);
          } else {
            pp.send(out, stage.index + 1, stage.index * batches + i, sends);
          }
        }
        sends.wait();
      } else {
        const LossSum part = from_hidden ? loss_from_hidden(loss, model.forward_hidden(input_ids, documents),
                                                            model.output_head(), cp.slice(labels))
                                         : loss.compute(model.forward(input_ids, documents), labels);
        loss_sum += part.sum.to(at::kDouble);
      }
      targets += batch.num_target_tokens;
      inputs += batch.input_ids.numel();
    }
    if (cp.size() > 1) cp.group()->all_reduce(loss_sum);  // the slices' losses of the same batches
    if (pp.size() > 1) pp.group()->all_reduce(loss_sum);  // the last stage's, to every stage
    sums = at::stack({loss_sum.cpu(), at::scalar_tensor(static_cast<double>(targets), at::kDouble),
                      at::scalar_tensor(static_cast<double>(inputs), at::kDouble),
                      at::scalar_tensor(static_cast<double>(batches), at::kDouble)});
    if (!metric_names.empty()) {
      // The loss's metric sums and their count (Loss::take_metric_sums), reduced with the rest.
      at::Tensor metric_sums = loss.take_metric_sums();
      if (!metric_sums.defined() || metric_sums.numel() != static_cast<std::int64_t>(metric_names.size()) + 1) {
        metric_sums = at::zeros({static_cast<std::int64_t>(metric_names.size()) + 1}, at::kDouble);
      }
      sums = at::cat({sums, metric_sums.detach().to(at::kCPU, at::kDouble).reshape({-1})});
    }
  } catch (...) {
    model.train();
    throw;
  }
  model.train();
  // Over the data-parallel ranks: tensor-parallel peers evaluated the same batches.
  data_parallel_group(run)->all_reduce(sums);
  EvalTotals totals;
  totals.loss_sum = sums[0].item<double>();
  totals.target_tokens = sums[1].item<double>();
  totals.input_tokens = sums[2].item<double>();
  totals.batches = static_cast<std::int64_t>(sums[3].item<double>());
  if (!metric_names.empty()) {
    const double count = sums[4 + static_cast<std::int64_t>(metric_names.size())].item<double>();
    for (std::size_t i = 0; i < metric_names.size(); ++i) {
      if (count > 0) totals.metrics.emplace_back(metric_names[i], sums[4 + static_cast<std::int64_t>(i)].item<double>() / count);
    }
  }
  return totals;
}

}  // namespace tessera
