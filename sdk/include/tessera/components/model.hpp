// Kind `model`: a LibTorch module that maps token ids to next-token logits, and says how much
// compute a token costs so the host can report MFU.
//
// Sharding support: a model names its wrapping units (a GPT's blocks) in sharding_units() and
// runs each one through run_unit(). A sharding strategy (fsdp) then gathers a unit's parameters
// just before it runs and frees them after; the parameters outside every unit are gathered for
// the whole forward pass. Models that name no units still train under every strategy.
#pragma once

#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/components/kv_cache.hpp"
#include "tessera/components/output_head.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

// A transformer's shape, as `tessera plan` needs it to count the bytes each mesh axis moves and
// the activations a block keeps (core/src/plan/). Sizes are the whole model's, before any split.
// hidden == 0 (the default): the model does not describe itself; its parameters and the
// data-parallel strategies' traffic are still planned, the model-parallel axes' traffic is not.
struct TransformerShape {
  std::int64_t hidden = 0;      // width of the residual stream (d_model)
  std::int64_t blocks = 0;      // transformer blocks
  std::int64_t heads = 0;       // query heads
  std::int64_t kv_heads = 0;    // key/value heads (heads without grouping)
  std::int64_t head_dim = 0;
  std::int64_t mlp_hidden = 0;  // a dense block's MLP inner width
  bool gated_mlp = false;       // SwiGLU: two inner projections
  // Blocks whose MLP is a mixture of experts (by index), its experts and their routing.
  std::vector<std::int64_t> moe_blocks;
  std::int64_t experts = 0;
  std::int64_t experts_per_token = 0;
  std::int64_t expert_hidden = 0;  // an expert's inner width
  // Shared experts beside the routed ones (DeepSeek-V3's): a dense MLP of this inner width in
  // every MoE block, split over tensor-parallel ranks as a dense block's. 0: none.
  std::int64_t shared_expert_hidden = 0;
  // Blocks that recompute their activations in backward (activation checkpointing), by index.
  std::vector<std::int64_t> checkpointed_blocks;
};

// What a strategy does around the forward pass. Installed by the strategy, called by Model.
class TESSERA_API ForwardHooks {
 public:
  // The unit index of the whole model (the parameters outside every unit).
  static constexpr std::size_t kWholeModel = static_cast<std::size_t>(-1);
  virtual ~ForwardHooks();
  virtual void before_forward(std::size_t unit) = 0;
  // Gets what the unit computed and returns it; a strategy may attach a backward hook to it.
  virtual at::Tensor after_forward(std::size_t unit, const at::Tensor& output) = 0;
};

class TESSERA_API Model : public torch::nn::Module {
 public:
  static constexpr const char* kKind = "model";
  Model() = default;
  // `name`: the module's name (torch::nn::Module::name), where the class's is not the model's.
  explicit Model(std::string name) : torch::nn::Module(std::move(name)) {}
  ~Model() override;

  // input_ids [batch, seq] int64 -> logits [batch, seq, vocab_size()]. Runs compute() between
  // the installed hooks; callers (the trainer, callbacks, tests) always come through here.
  // `document_ids` (optional, Batch::document_ids): packed documents, kept apart by a model that
  // masks_documents() and ignored by others.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& document_ids = {});
  // Whether compute() honours document_ids(): attention within a document only, positions
  // counted from each document's start.
  virtual bool masks_documents() const { return false; }

  // --- Generation (tessera/components/kv_cache.hpp) ---------------------------------------------
  // The logits of `tokens` [batch, n] int64 at `positions` [batch, n] int64 (-1: padding, whose
  // logits are never read), attending to the keys `cache` holds and to this pass' own, which it
  // appends: a pure function of (tokens, positions, cache), the same weights as training. The
  // prefill passes the prompts (left-padded to one length), each decode step one token a row.
  // [batch, n, vocab_size()] in the compute dtype; `last_only`: the last slot's, [batch, 1,
  // vocab_size()] (what a prefill samples from, without the whole prompt's logits). Runs
  // compute_decode() between the installed hooks. Call it without gradients, in eval mode.
  at::Tensor decode(const at::Tensor& tokens, const at::Tensor& positions, KvCache& cache, bool last_only = false);
  // Whether decode() works (a kit model's does).
  virtual bool decodes() const { return false; }
  // The cache slots a pass of n tokens takes (more than n where the model pads a pass).
  virtual std::int64_t decode_slots(std::int64_t n) const { return n; }

  virtual std::int64_t vocab_size() const = 0;
  virtual std::int64_t max_seq_len() const = 0;
  // Training FLOPs (forward + backward) per token at this sequence length.
  virtual double flops_per_token(std::int64_t seq_len) const = 0;
  // Number of trainable parameter elements.
  std::int64_t num_parameters() const;
  // Loss terms of the model's own from the last forward() (an MoE router's load-balancing and
  // z-losses), already weighted by their coefficients; undefined when there are none. The
  // trainer adds it to every micro-batch's objective, scaled by 1 / (micro-batches x ranks),
  // so the step optimises the mean over all micro-batches. Not part of the reported loss.
  virtual at::Tensor auxiliary_loss() { return {}; }
  // Called on every rank once per training step, after the optimizer (`applied`: it updated the
  // weights; false when the step was skipped). A model updates its non-gradient state here, as
  // DeepSeek-V3's auxiliary-loss-free balancing moves its routing bias. Must not wait on the
  // device.
  virtual void after_optimizer_step(bool /*applied*/) {}

  // --- The output head apart (optional) ---------------------------------------------------------
  // A model that overrides compute_hidden() and output_head() says so here. Then a loss that
  // computes logits chunk by chunk (Loss::takes_hidden_states) gets the hidden states instead of
  // the logits, and the whole [tokens, vocab] logits are never materialised.
  virtual bool has_output_head() const { return false; }
  // input_ids [batch, seq] -> hidden states [batch, seq, hidden] before the output projection,
  // through the installed hooks like forward(). Throws if has_output_head() is false.
  at::Tensor forward_hidden(const at::Tensor& input_ids, const at::Tensor& document_ids = {});
  // The projection compute() applies to compute_hidden()'s result (parameters, not copies).
  virtual OutputHead output_head() { return {}; }

  // --- Deferred initialisation (tessera/nn/deferred_init.hpp) ---------------------------------------
  // Whether some parameters are still on the meta device (built inside a DeferredInitScope by a
  // model that supports it).
  bool has_deferred_parameters() const;
  // Writes the initial values of these parameters of this model (which have storage by now),
  // exactly those the model has when built without deferral, for any subset in any order.
  // The default throws: a model that never defers is never asked.
  virtual void initialize_parameters(const std::vector<at::Tensor>& params);

  // --- Hugging Face format (tessera/formats/hugging_face.hpp) ---------------------------------------------
  // Whether hugging_face_export() can write this model as a Hugging Face folder.
  virtual bool exports_hugging_face() const { return false; }
  // This model's config.json and tensors by Hugging Face name and layout, from `state`: its own
  // state dict, every tensor whole (a sharded run gathers it first). The default throws.
  virtual HfExport hugging_face_export(const StateDict& state) const;

  // The Hugging Face name of the module at `module` ("layers.0.self_attn.q_proj"): what
  // adapters' exports (PEFT) call the layers they wrap. The default: none.
  virtual HfModuleName hugging_face_module(const std::string& /*module*/) const { return {}; }

  // --- Tessera exports ----------------------------------------------------------------------------
  // The config fields this model was built with, as a JSON object in its YAML's names, after
  // init_from filled in what the YAML left out (e.g. {"n_head": 12, "rope_theta": 500000.0}).
  // The host writes them into an export's config.json, so that init_from of that export knows
  // the architecture even where the run's YAML never spelled it out. "" (the default): the
  // YAML's fields alone are written.
  virtual std::string architecture_json() const { return {}; }

  // --- Tensor parallelism (tessera/parallel/tensor_parallel.hpp) --------------------------------
  // How each parameter splits over the run's tensor-parallel ranks, by name (absent: replicated);
  // with tp > 1 this rank's parameters are its parts of them. A model that splits nothing returns
  // the empty plan, and its config declares no splits_over(tp), so validation refuses tp > 1.
  // The host reads the plan to gather whole parameters for checkpoints and exports and to cut
  // them again under another mesh, and to count replicated gradients once in the global norm.
  virtual TensorParallelPlan tensor_parallel_plan() const { return {}; }

  // --- Pipeline parallelism (tessera/parallel/pipeline_parallel.hpp) -----------------------------
  // A model whose config declares splits_over(MeshAxis::pp) is built with this rank's stages only
  // (PipelineParallel::of: their blocks, the embeddings on the first stage, the final norm and the
  // output head on the last) and runs one of them here. `input_ids` [batch, seq]: the
  // micro-batch, which every stage gets (the first embeds it, the others take the sequence's
  // length and positions from it); `hidden`: what the stage before returned (undefined for the
  // first stage). The last stage returns the hidden states before the output head (output_head()
  // applies, as after forward_hidden()). Through the installed hooks like forward().
  // `document_ids` as for forward().
  at::Tensor forward_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden,
                           const at::Tensor& document_ids = {});
  // Parameters held by both the first and the last stage (an embedding tied to the output head):
  // their gradients are summed over the two, so their values stay equal; the first stage's copy
  // is the one saved. By name.
  virtual std::vector<std::string> pipeline_tied_parameters() const { return {}; }

  // --- Planning (tessera plan) ---------------------------------------------------------------------
  // The whole model's shape (TransformerShape above); the default describes nothing.
  virtual TransformerShape transformer_shape() const { return {}; }

  // The submodules a sharding strategy gathers one at a time, in the order compute() runs them.
  // Empty (the default): the model is one unit.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() { return {}; }
  // Set by a strategy at setup; null (the default) runs compute() bare.
  void set_forward_hooks(std::shared_ptr<ForwardHooks> hooks) { hooks_ = std::move(hooks); }

 protected:
  // The document_ids of the forward pass in progress (undefined when it has none). A model that
  // recomputes in backward (activation checkpointing) captures what it derives from them.
  const at::Tensor& document_ids() const { return document_ids_; }
  // The model's computation: what forward() used to be.
  virtual at::Tensor compute(const at::Tensor& input_ids) = 0;
  // compute() without the output projection; only for models with has_output_head().
  virtual at::Tensor compute_hidden(const at::Tensor& input_ids);
  // One of this rank's pipeline stages (forward_stage); the default throws.
  virtual at::Tensor compute_stage(std::size_t local_stage, const at::Tensor& input_ids, const at::Tensor& hidden);
  // decode()'s computation; the default refuses (decodes() is false).
  virtual at::Tensor compute_decode(const at::Tensor& tokens, const at::Tensor& positions, KvCache& cache,
                                    bool last_only);
  // compute() calls unit `index` of sharding_units() through this.
  at::Tensor run_unit(std::size_t index, const at::Tensor& input,
                      const std::function<at::Tensor(const at::Tensor&)>& body);

 private:
  std::shared_ptr<ForwardHooks> hooks_;
  at::Tensor document_ids_;  // set for the duration of one forward()
};

}  // namespace tessera
