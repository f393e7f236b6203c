// Out-of-line destructors give each SDK interface one home for its vtable and type info, so
// host and plugins agree on them across shared-library boundaries.
#include <ATen/ops/linear.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tanh.h>
#include <torch/nn/module.h>

#include <set>

#include "tessera/components/callback.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/components/dataset.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/components/loss.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/components/optimizer.hpp"
#include "tessera/components/prompt_source.hpp"
#include "tessera/components/reward.hpp"
#include "tessera/components/strategy.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/parallel/collectives.hpp"
#include "tessera/components/scheduler.hpp"
#include "tessera/run/stateful.hpp"
#include "tessera/version.hpp"

namespace tessera {

const char* sdk_version() { return TESSERA_VERSION_STRING; }
std::uint32_t sdk_abi_version() { return kSdkAbiVersion; }

Error::~Error() = default;
ConfigError::ConfigError(const std::string& message, std::string field)
    : Error(message), field_(std::move(field)) {}
ConfigError::~ConfigError() = default;

Stateful::~Stateful() = default;
Model::~Model() = default;
ForwardHooks::~ForwardHooks() = default;
ParallelStrategy::~ParallelStrategy() = default;

LossAndGradNorm ParallelStrategy::reduce_loss_and_grad_norm(Communicator& comm, const at::Tensor& loss_sum) {
  at::Tensor sums = at::stack({loss_sum, grad_norm_squared_share().to(loss_sum.device(), at::kFloat)});
  comm.all_reduce(sums);
  return {sums[0], sums[1].sqrt()};
}
at::Tensor ParallelStrategy::gradient_of(const at::Tensor& param) { return param.grad(); }

void ParallelStrategy::with_whole_parameters(Model& /*model*/, const std::function<void()>& fn) { fn(); }

std::vector<Communicator*> ParallelStrategy::state_share_groups() const {
  return std::vector<Communicator*>(owned_ranges().size(), nullptr);
}

void ParallelStrategy::count_in_grad_norm(const std::vector<bool>& counted) {
  for (bool c : counted) {
    if (!c) {
      throw Error("this parallel strategy counts every parameter in the gradient norm and cannot leave the replicated "
                  "ones of tensor parallelism out; use ddp, zero1, zero2 or fsdp with parallelism.tp > 1");
    }
  }
}
PendingCollective::~PendingCollective() = default;

namespace {

// Holds a model's document ids for one forward pass, and clears them however it ends.
class DocumentScope {
 public:
  DocumentScope(at::Tensor& slot, const at::Tensor& ids) : slot_(slot) { slot_ = ids; }
  ~DocumentScope() { slot_ = at::Tensor(); }
  DocumentScope(const DocumentScope&) = delete;
  DocumentScope& operator=(const DocumentScope&) = delete;

 private:
  at::Tensor& slot_;
};

}  // namespace

at::Tensor Model::forward(const at::Tensor& input_ids, const at::Tensor& document_ids) {
  DocumentScope documents(document_ids_, document_ids);
  if (!hooks_) return compute(input_ids);
  hooks_->before_forward(ForwardHooks::kWholeModel);
  return hooks_->after_forward(ForwardHooks::kWholeModel, compute(input_ids));
}

at::Tensor Model::forward_hidden(const at::Tensor& input_ids, const at::Tensor& document_ids) {
  if (!has_output_head()) {
    throw Error("this model does not expose its hidden states and output head (Model::has_output_head); "
                "use a loss without chunk_size");
  }
  DocumentScope documents(document_ids_, document_ids);
  if (!hooks_) return compute_hidden(input_ids);
  hooks_->before_forward(ForwardHooks::kWholeModel);
  return hooks_->after_forward(ForwardHooks::kWholeModel, compute_hidden(input_ids));
}

at::Tensor Model::forward_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden,
                                const at::Tensor& document_ids) {
  DocumentScope documents(document_ids_, document_ids);
  if (!hooks_) return compute_stage(local_stage, input_ids, hidden);
  hooks_->before_forward(ForwardHooks::kWholeModel);
  return hooks_->after_forward(ForwardHooks::kWholeModel, compute_stage(local_stage, input_ids, hidden));
}

at::Tensor Model::decode(const at::Tensor& tokens, const at::Tensor& positions, KvCache& cache, bool last_only) {
  if (!hooks_) return compute_decode(tokens, positions, cache, last_only);
  hooks_->before_forward(ForwardHooks::kWholeModel);
  return hooks_->after_forward(ForwardHooks::kWholeModel, compute_decode(tokens, positions, cache, last_only));
}

at::Tensor Model::compute_decode(const at::Tensor&, const at::Tensor&, KvCache&, bool) {
  throw Error("model/" + name() + " does not decode from a KV cache (Model::decodes); generate with a model built "
              "on the transformer kit");
}

at::Tensor Model::compute_stage(std::size_t, const at::Tensor&, const at::Tensor&) {
  throw Error("this model does not run as pipeline stages (Model::compute_stage); set parallelism.pp: 1");
}

bool Model::has_deferred_parameters() const {
  for (const auto& p : parameters()) {
    if (p.is_meta()) return true;
  }
  return false;
}

HfExport Model::hugging_face_export(const StateDict&) const {
  throw Error("this model has no Hugging Face format; export it with checkpoint.export_format: tessera");
}

void Model::initialize_parameters(const std::vector<at::Tensor>&) {
  throw Error("this model has no deferred initialisation (Model::initialize_parameters)");
}

at::Tensor Model::compute_hidden(const at::Tensor&) {
  throw Error("Model::compute_hidden is not implemented by this model (has_output_head() must stay false)");
}

at::Tensor Model::run_unit(std::size_t index, const at::Tensor& input,
                           const std::function<at::Tensor(const at::Tensor&)>& body) {
  if (!hooks_) return body(input);
  hooks_->before_forward(index);
  return hooks_->after_forward(index, body(input));
}
Dataset::~Dataset() = default;
Loss::~Loss() = default;
Tokenizer::~Tokenizer() = default;
Reward::~Reward() = default;
PromptSource::~PromptSource() = default;

std::vector<std::int64_t> encode_written_text(const Tokenizer& tokenizer, const std::string& text,
                                              std::vector<std::pair<std::size_t, std::size_t>>* offsets) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  const std::vector<std::int64_t> ids = tokenizer.encode_with_offsets(text, spans);
  std::vector<std::int64_t> kept;
  if (offsets) offsets->clear();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (spans[i].first == spans[i].second) continue;  // what encode() adds covers no text
    kept.push_back(ids[i]);
    if (offsets) offsets->push_back(spans[i]);
  }
  return kept;
}
at::Tensor softcapped(const at::Tensor& logits, double cap) {
  return cap > 0 ? at::tanh(logits / cap) * cap : logits;
}
at::Tensor OutputHead::logits(const at::Tensor& hidden) const {
  return softcapped(at::linear(hidden, weight, bias), logit_softcap);
}
LossSum Loss::compute_from_hidden(const at::Tensor& hidden, const OutputHead& head, const at::Tensor& labels) {
  const at::Tensor logits = head.logits(hidden);
  return compute(head.real_logits(head.vocab_parallel() ? collectives::gather_from(logits, -1, head.vocab_group) : logits),
                 labels);
}
LossSum loss_from_hidden(Loss& loss, const at::Tensor& hidden, const OutputHead& head, const at::Tensor& labels) {
  if (head.vocab_parallel() && !loss.handles_vocab_parallel_head()) return loss.Loss::compute_from_hidden(hidden, head, labels);
  return loss.compute_from_hidden(hidden, head, labels);
}
Optimizer::~Optimizer() = default;
Scheduler::~Scheduler() = default;
Callback::~Callback() = default;
CallbackEvents::~CallbackEvents() = default;
MoeRouting::~MoeRouting() = default;
Communicator::~Communicator() = default;

void Communicator::all_reduce(at::Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op)->wait(); }
void Communicator::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  all_gather_async(outputs, input)->wait();
}
void Communicator::reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, ReduceOp op) {
  reduce_scatter_async(output, inputs, op)->wait();
}
void Communicator::all_to_all(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs) {
  all_to_all_async(outputs, inputs)->wait();
}

std::int64_t frozen_parameter_bytes(const Model& model, const std::vector<at::Tensor>& trained) {
  std::set<const c10::TensorImpl*> updated;
  for (const auto& p : trained) updated.insert(p.unsafeGetTensorImpl());
  std::int64_t bytes = 0;
  for (const auto& p : model.parameters()) {
    if (!updated.count(p.unsafeGetTensorImpl())) bytes += static_cast<std::int64_t>(p.nbytes());
  }
  return bytes;
}

std::int64_t Model::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) {
    if (p.requires_grad()) n += p.numel();
  }
  return n;
}

void TrainerControl::request_stop(std::string reason) {
  stop_ = true;
  if (stop_reason_.empty()) stop_reason_ = std::move(reason);
}
void TrainerControl::request_skip_step(std::string reason) {
  skip_ = true;
  log::warn("skipping this optimizer step: ", reason);
}
void TrainerControl::request_save(std::string reason) {
  save_ = true;
  log::info("save requested: ", reason);
}

}  // namespace tessera
