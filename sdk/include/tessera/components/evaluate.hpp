// A model's loss over fixed batches of a dataset, reduced over the ranks: what the evaluation
// callback reports during training and `tessera eval` prints. Computed as training computes (the
// run's precision, logits chunk by chunk when the loss makes them so), in eval mode, no grad.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/run/context.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/export.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/model.hpp"

namespace tessera {

struct EvalTotals {
  double loss_sum = 0;       // summed token losses, all ranks
  double target_tokens = 0;  // tokens the loss was taken on, all ranks
  double input_tokens = 0;   // tokens fed to the model, all ranks
  std::int64_t batches = 0;  // micro-batches, all ranks
  // The loss's own metrics (Loss::metric_names) as means over the evaluated batches, all ranks:
  // loss/dpo's rewards/chosen, rewards/accuracies, ... Empty for a loss without any.
  std::vector<std::pair<std::string, double>> metrics;

  // The mean loss per target token; throws tessera::Error when there were none.
  double mean_loss() const {
    if (target_tokens <= 0) throw Error("the evaluation batches hold no target tokens");
    return loss_sum / target_tokens;
  }
};

// Runs `batches` micro-batches of `micro_batch_size` from `data` (read from where it stands;
// every data-parallel rank reads its own shard: set_shard(data_parallel_group(run))) through
// `model` and `loss` on run.device in run.precision, then all-reduces the sums over the
// data-parallel ranks (tensor-parallel peers evaluate the same batches). Every rank must
// call it with the same `batches`: under fsdp each forward pass is a collective. Every batch's
// token ids are checked against model.vocab_size() first (check_token_ids), and with several
// ranks they agree on each batch's draw before its forward pass: a rank whose data fails throws
// its error, the others an error saying so, all at the same batch. The model is left in training
// mode. A loss that needs a reference model gets `reference`'s logits for each batch first (an
// Error without one); the metric sums the loss held before are dropped, so call it between steps.
TESSERA_API EvalTotals evaluate_loss(Model& model, Loss& loss, Dataset& data, std::int64_t batches,
                                     std::int64_t micro_batch_size, const RunContext& run,
                                     const ReferenceLogits& reference = {});

}  // namespace tessera
