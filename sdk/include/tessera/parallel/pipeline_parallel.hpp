// Pipeline parallelism (parallelism.pp): a model's blocks cut into stages held by the ranks of a
// pipeline group, the step's micro-batches streamed through them (the host's schedule, gpipe,
// 1f1b or interleaved_1f1b, decides the order). Stage s of S = pp x stages_per_rank holds a
// contiguous range of blocks and sits on pipeline rank s % pp (interleaved: every pp-th stage on
// the same rank, Megatron-LM's virtual stages); stage 0 also holds the embeddings, stage S - 1
// the final norm and the output head. A model built with PipelineParallel::of(run, blocks) holds
// only its stages' blocks and runs one stage at a time (Model::forward_stage); activations and
// their gradients travel between stages by point-to-point send and receive (send/receive here,
// a small header with the shape and dtype first), activations on the pp group and gradients on a
// second group of the same ranks (DeviceMesh::pipeline_gradients_ptr), so that neither direction
// queues behind the other on transports that run a pair's transfers in order (NCCL).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/run/communicator.hpp"
#include "tessera/run/context.hpp"
#include "tessera/export.hpp"

namespace tessera {

// Which way a transfer goes: forward (activations, to the next stage) or backward (their
// gradients, to the stage before).
enum class PipelineFlow { activations, gradients };

struct PipelineStage {
  std::int64_t index = 0;        // 0 .. stages - 1, in the order data flows
  std::int64_t first_block = 0;  // the blocks [first_block, end_block)
  std::int64_t end_block = 0;
  bool first = true;  // holds the embeddings
  bool last = true;   // holds the final norm and the output head
};

// Sends in flight, by tag: the tensors stay alive until their sends completed. A schedule waits for
// a transfer as soon as it knows it arrived (an activation once its gradient came back), so that
// the sent activations of a 1F1B stage do not pile up over the step.
class TESSERA_API PendingSends {
 public:
  void add(std::int64_t tag, std::vector<at::Tensor> tensors, std::vector<std::shared_ptr<PendingCollective>> sends);
  void wait(std::int64_t tag);  // the sends of that tag (none: nothing to do)
  void wait();                  // every send so far
  bool empty() const { return transfers_.empty(); }

 private:
  struct Transfer {
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<PendingCollective>> sends;
  };
  std::map<std::int64_t, Transfer> transfers_;
};

class TESSERA_API PipelineParallel {
 public:
  // One stage holding every block: no pipeline.
  explicit PipelineParallel(std::int64_t blocks = 0);
  // This rank's stages of `blocks` blocks over `group` (its pipeline peers, in stage order),
  // `stages_per_rank` each, cut at `split_points` (the first block of every stage but the first;
  // empty: balanced by block count). Gradients travel on `gradients` (the same ranks; null: on
  // `group`). Throws tessera::Error for a cut it cannot make.
  PipelineParallel(std::shared_ptr<Communicator> group, std::int64_t blocks, std::int64_t stages_per_rank,
                   const std::vector<std::int64_t>& split_points, std::shared_ptr<Communicator> gradients = nullptr);
  // This run's stages of a model of `blocks` blocks (one stage with every block without pp).
  static PipelineParallel of(const RunContext& run, std::int64_t blocks);
  // This run's stages for moving data between them (the trainer's and evaluate_loss's view):
  // which stages this rank holds and where their neighbours are; the blocks are the model's.
  static PipelineParallel transport_of(const RunContext& run);

  // The block ranges of `stages` stages of `blocks` blocks: at `split_points`, or balanced (the
  // earlier stages take the remainder's extra blocks). Throws tessera::Error for more stages than
  // blocks or split points that do not fit.
  static std::vector<std::pair<std::int64_t, std::int64_t>> block_ranges(std::int64_t blocks, std::int64_t stages,
                                                                         const std::vector<std::int64_t>& split_points);

  std::int64_t size() const { return size_; }  // pipeline ranks
  std::int64_t rank() const { return rank_; }
  const std::shared_ptr<Communicator>& group() const { return group_; }
  std::int64_t stages() const { return stages_; }  // in all
  std::int64_t stages_per_rank() const { return stages_ / size_; }
  // This rank's stages, in the order data flows through them.
  const std::vector<PipelineStage>& local_stages() const { return local_; }
  // Which of local_stages() is global stage `stage`; -1 when another rank holds it.
  std::int64_t local_index(std::int64_t stage) const;
  std::int64_t rank_of(std::int64_t stage) const { return stage % size_; }
  bool holds_block(std::int64_t block) const;
  bool holds_first_stage() const { return local_.front().first; }
  bool holds_last_stage() const { return local_.back().last; }

  // Sends `t` (any shape and dtype) to the rank holding stage `to_stage`: a header (its rank and
  // sizes and dtype), then the data, both tagged with `tag` (which must tell the transfers of a
  // step apart). Returns at once; `pending` keeps the tensors until the sends complete.
  void send(const at::Tensor& t, std::int64_t to_stage, std::int64_t tag, PendingSends& pending,
            PipelineFlow flow = PipelineFlow::activations) const;
  // Receives what the rank holding `from_stage` sent with `tag` (and `flow`), onto `device`;
  // waits for it.
  at::Tensor receive(std::int64_t from_stage, std::int64_t tag, const c10::Device& device,
                     PipelineFlow flow = PipelineFlow::activations) const;

 private:
  Communicator& group_of(PipelineFlow flow) const { return flow == PipelineFlow::gradients ? *gradients_ : *group_; }

  std::shared_ptr<Communicator> group_, gradients_;
  std::int64_t size_ = 1, rank_ = 0, stages_ = 1;
  std::vector<PipelineStage> local_;
};

}  // namespace tessera
