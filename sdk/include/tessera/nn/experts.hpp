// Mixture-of-experts layers for any kit model: a router (not adaptable: the routing reads its
// weight directly) and experts stacked one tensor per weight, so a checkpoint, fsdp's units and
// expert parallelism's split (TensorShard::expert_stack) see one parameter, not E. The routing,
// capacity, losses, statistics and the all-to-alls of expert parallelism are ExpertRouter's
// (tessera/nn/expert_router.hpp); under expert parallelism a rank holds num_experts / ep of every
// stack, under tensor parallelism every rank holds them whole and routes the same tokens.
//   GeluExperts    GELU MLP experts with optional biases (model/gpt_moe): router, experts.c_fc,
//                  experts.c_proj
//   SwiGluExperts  SwiGLU experts (Mixtral's names by default: gate, experts.w1 / w3 / w2), with
//                  optional shared experts every token passes through (DeepSeek-V3's)
// The router's options (softmax or sigmoid scores, grouped routing, a correction bias, routed
// scaling) are ExpertRouting's; MoeBlockPattern says which blocks of a decoder route (dense first
// blocks, every n-th block). MoeFields are the YAML fields of the routing, declared once for every
// model that has experts.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/nn/expert_router.hpp"
#include "tessera/export.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/nn/layer.hpp"
#include "tessera/parallel/expert_parallel.hpp"
#include "tessera/parallel/tensor_parallel.hpp"
#include "tessera/run/parallel_dims.hpp"

namespace tessera::nn {

// The routing's YAML fields. A model's config derives from MoeFields and sets its own defaults
// in its constructor (a dense-by-default model: num_experts 0).
struct MoeFields {
  std::int64_t num_experts = 8;
  std::int64_t top_k = 2;
  double capacity_factor = 0.0;  // 0: every assignment is kept
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.0;
  bool renormalize_topk = true;

  bool mixture_of_experts() const { return num_experts > 0; }
  ExpertRouting routing() const { return {num_experts, top_k, capacity_factor, renormalize_topk}; }
};

// top_k at most num_experts (when there are experts).
TESSERA_API void check_moe_fields(const MoeFields& c);

// Which blocks of a decoder route their tokens to experts; the others have a dense MLP.
// DeepSeek-V3's first_k_dense_replace is first_dense; Qwen-MoE's decoder_sparse_step is every,
// its mlp_only_layers dense.
struct TESSERA_API MoeBlockPattern {
  std::int64_t first_dense = 0;     // blocks 0 .. first_dense - 1 are dense
  std::int64_t every = 1;           // of the others, block i routes when (i + 1) % every == 0
  std::vector<std::int64_t> dense;  // and is not listed here

  bool routes(std::int64_t block) const;
  // The routed blocks of `blocks`, in order.
  std::vector<std::int64_t> routed_blocks(std::int64_t blocks) const;
};

// What expert parallelism needs: experts, and as many on every expert-parallel rank. `dense`:
// what to tell a dense model's user (empty: the model always has experts).
TESSERA_API void check_expert_parallel(const MoeFields& c, const ParallelDims& dims, const std::string& dense = "");

// What a model's description of its experts says (`tessera describe`).
struct MoeDocs {
  const char* num_experts;  // what an expert is, and what 0 means where the model allows it
  bool dense_allowed;       // num_experts 0: no experts
  const char* scope;        // where the losses are summed: "MoE layers", "blocks"
};

template <class Config>
void declare_moe_fields(ConfigFields<Config>& f, const MoeDocs& docs) {
  using M = MoeFields;
  f.field("num_experts", &M::num_experts, docs.num_experts).at_least(docs.dense_allowed ? 0 : 1);
  f.field("top_k", &M::top_k, "experts each token is routed to (k, at most num_experts; Hugging Face's num_experts_per_tok)")
      .at_least(1);
  f.field("capacity_factor", &M::capacity_factor,
          "per-expert capacity ceil(factor x tokens x k / E) per forward, later assignments dropped; 0 = no limit")
      .at_least(0);
  f.field("aux_loss_coef", &M::aux_loss_coef,
          std::string("weight of the load-balancing loss E x sum_e f_e P_e, summed over ") + docs.scope)
      .at_least(0);
  f.field("z_loss_coef", &M::z_loss_coef,
          std::string("weight of the router z-loss mean(logsumexp(logits)^2), summed over ") + docs.scope)
      .at_least(0);
  f.field("renormalize_topk", &M::renormalize_topk, "divide the k gate probabilities by their sum");
  f.splits_experts();
  f.check([](const Config& c) { check_moe_fields(c); });
}

// weight [E, out, in], bias [E, out] (optional); E is this rank's experts under expert parallelism.
class TESSERA_API ExpertLinear : public torch::nn::Module {
 public:
  ExpertLinear(std::int64_t experts, std::int64_t in, std::int64_t out, bool with_bias);
  // Per-expert views; unbinding once per forward keeps backward to one stack per tensor.
  std::vector<at::Tensor> weights() const { return weight.unbind(0); }
  std::vector<at::Tensor> biases() const;

  at::Tensor weight, bias;
};

// A routed layer: the router's weight (and, when the routing has one, its correction bias: a
// float32 buffer `e_score_correction_bias` beside the weight, in checkpoints, no gradient), the
// routing and what it reports.
class TESSERA_API MoeLayer : public FeedForward {
 public:
  MoeLayer(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden, const std::string& router_name);
  // [num_experts]; undefined without one.
  const at::Tensor& correction_bias() const { return correction_bias_; }
  ExpertRouter& router() { return router_; }
  // The unweighted balance and z-losses of the last forward, with their graphs.
  const at::Tensor& last_aux_loss() const { return router_.last_aux_loss(); }
  const at::Tensor& last_z_loss() const { return router_.last_z_loss(); }
  RouterStatistics take_statistics();
  // Auxiliary-loss-free balancing (DeepSeek-V3): the correction bias of each expert moves by
  // `speed` towards balance, b_e += speed * sign(mean load - load_e), the loads being the
  // assignments of the training forwards since the last call summed over `group` (the ranks that
  // route different tokens: the data- and context-parallel ones; null: this rank's). No-op
  // without a correction bias or when nothing was routed.
  void balance_by_bias(double speed, Communicator* group);

  std::shared_ptr<Linear> router_linear;

 protected:
  ExpertRouter router_;
  at::Tensor correction_bias_;
};

class TESSERA_API GeluExperts : public MoeLayer {
 public:
  // `dropout`: of the combined output, the residual branch's.
  GeluExperts(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden, std::int64_t expert_hidden,
              bool bias, double dropout);
  at::Tensor forward(const at::Tensor& x) override;
  static void plan(TensorParallelPlan& plan, const std::string& prefix, bool bias);

  std::shared_ptr<ExpertLinear> up, down;

 private:
  double dropout_;
};

// The names of a SwiGLU experts layer's router and stacks (Mixtral's by default), and of its
// shared experts (DeepSeek-V3's).
struct SwiGluExpertNames {
  std::string router = "gate";
  std::string gate = "w1", up = "w3", down = "w2";
  std::string shared = "shared_experts";
};

class TESSERA_API SwiGluExperts : public MoeLayer {
 public:
  // `shared_hidden`: the hidden units of the shared experts, a SwiGLU MLP every token passes
  // through, added to the routed output (DeepSeek-V3's n_shared_experts x moe_intermediate_size;
  // tensor-parallel as a dense MLP). 0: none.
  SwiGluExperts(const ExpertRouting& routing, ExpertParallel ep, std::int64_t hidden, std::int64_t expert_hidden,
                const SwiGluExpertNames& names = {}, std::int64_t shared_hidden = 0, TensorParallel tp = {});
  at::Tensor forward(const at::Tensor& x) override;
  static void plan(TensorParallelPlan& plan, const std::string& prefix, const SwiGluExpertNames& names = {},
                   bool shared = false);

  std::shared_ptr<ExpertLinear> gate, up, down;
  std::shared_ptr<FeedForward> shared;  // null without shared experts
};

}  // namespace tessera::nn
