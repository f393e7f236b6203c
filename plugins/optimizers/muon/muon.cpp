// Optimizer `muon`: torch.optim.Muon's update for the model's hidden matrices (momentum averaged,
// Nesterov, the update orthogonalised by Newton-Schulz, its lr adjusted to the matrix's shape,
// decoupled weight decay), and AdamW inside the same component for every other parameter: the
// token embedding and the output head (names matched by `adamw_params`), norms and biases.
// Orthogonalisation needs the whole matrix: under a sharding strategy each matrix has one owner in
// its share group, which receives every rank's share (one all-to-all per bucket of matrices),
// makes it whole over the model's axis, orthogonalises it and sends each rank its share back
// (OptimizerPlacements::local_at_owners / shares_from_owners): the group's ranks split the
// Newton-Schulz work, as Moonlight's distributed Muon does. Stacked experts are orthogonalised one
// by one. Which parameters are matrices: tessera/components/hidden_matrices.hpp, the rule
// `tessera plan` counts by.
#include <ATen/ops/stack.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "../multi_tensor_optimizer.hpp"
#include "newton_schulz.hpp"
#include "tessera/components/hidden_matrices.hpp"
#include "tessera/config/config_fields.hpp"
#include "tessera/parallel/optimizer_placements.hpp"
#include "tessera/plugin.hpp"

namespace {

struct MuonConfig {
  std::shared_ptr<tessera::Model> model;
  double lr = 1e-3;
  double momentum = 0.95;
  bool nesterov = true;
  std::int64_t ns_steps = 5;
  std::vector<double> ns_coefficients{3.4445, -4.7750, 2.0315};
  double eps = 1e-7;
  double weight_decay = 0.1;
  std::string adjust_lr_fn = "original";
  std::string ns_dtype = "bf16";
  std::optional<double> adamw_lr;
  double adamw_beta1 = 0.9;
  double adamw_beta2 = 0.999;
  double adamw_eps = 1e-8;
  double adamw_weight_decay = 0.01;
  std::vector<std::string> adamw_params{"embed", "wte", "wpe", "lm_head"};

  static void declare(tessera::ConfigFields<MuonConfig>& f) {
    using C = MuonConfig;
    f.field("model", &C::model, "the model whose parameters are optimised");
    f.field("lr", &C::lr, "learning rate of the hidden matrices (the scheduler multiplies it)").greater_than(0);
    f.field("momentum", &C::momentum, "momentum of the averaged buffer").at_least(0).less_than(1);
    f.field("nesterov", &C::nesterov, "orthogonalise the gradient moved toward the buffer (Nesterov)");
    f.field("ns_steps", &C::ns_steps, "Newton-Schulz iterations").at_least(1).less_than(100);
    f.field("ns_coefficients", &C::ns_coefficients, "the quintic's coefficients a, b, c");
    f.field("eps", &C::eps, "floor of the norm the update is divided by").greater_than(0);
    f.field("weight_decay", &C::weight_decay, "decoupled weight decay of the hidden matrices (with the unadjusted lr)")
        .at_least(0);
    f.field("adjust_lr_fn", &C::adjust_lr_fn,
            "original: lr x sqrt(max(1, rows/cols)); match_rms_adamw: lr x 0.2 sqrt(max(rows, cols))")
        .one_of({"original", "match_rms_adamw"});
    f.field("ns_dtype", &C::ns_dtype, "what Newton-Schulz computes in: bf16 (as torch) or fp32").one_of({"bf16", "fp32"});
    f.field("adamw_lr", &C::adamw_lr, "AdamW's learning rate for the other parameters; default: lr").greater_than(0);
    f.field("adamw_beta1", &C::adamw_beta1, "AdamW's first-moment decay").at_least(0).less_than(1);
    f.field("adamw_beta2", &C::adamw_beta2, "AdamW's second-moment decay").at_least(0).less_than(1);
    f.field("adamw_eps", &C::adamw_eps, "AdamW's denominator term").greater_than(0);
    f.field("adamw_weight_decay", &C::adamw_weight_decay, "AdamW's decoupled weight decay").at_least(0);
    f.field("adamw_params", &C::adamw_params,
            "matrices whose name contains one of these go to AdamW (the embedding and the head)");
    f.check([](const C& c) {
      if (c.ns_coefficients.size() != 3) {
        throw tessera::ConfigError("give three coefficients a, b, c", "ns_coefficients");
      }
    });
  }
};

// torch.optim.Muon's lr for a matrix of `rows` x `cols`.
double adjusted_lr(double lr, const std::string& how, std::int64_t rows, std::int64_t cols) {
  const auto a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (how == "match_rms_adamw") return lr * 0.2 * std::sqrt(std::max(a, b));
  return lr * std::sqrt(std::max(1.0, a / b));
}

class MuonOptimizer final : public tessera_plugins::MultiTensorOptimizer {
  // The most elements of updates sent to their owners at once (128 MiB in fp32): the exchanges
  // are batched, but a sharded model's matrices are never all whole together.
  static constexpr std::int64_t kExchangeBucket = std::int64_t{1} << 25;

 public:
  explicit MuonOptimizer(const MuonConfig& c)
      : MultiTensorOptimizer(c.model, c.lr, "foreach", "optimizer/muon"),
        momentum_(c.momentum),
        nesterov_(c.nesterov),
        weight_decay_(c.weight_decay),
        adjust_lr_fn_(c.adjust_lr_fn),
        adamw_lr_(c.adamw_lr.value_or(c.lr)),
        adamw_({0, c.adamw_beta1, c.adamw_beta2, c.adamw_eps, c.adamw_weight_decay}) {
    ns_.coefficients = {c.ns_coefficients[0], c.ns_coefficients[1], c.ns_coefficients[2]};
    ns_.steps = c.ns_steps;
    ns_.eps = c.eps;
    ns_.dtype = c.ns_dtype == "fp32" ? at::kFloat : at::kBFloat16;
    std::vector<at::Tensor> matrices, others;
    std::unordered_set<const void*> seen;
    for (const auto& item : model_->named_parameters()) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      (tessera::is_hidden_matrix(item.key(), p.dim(), c.adamw_params) ? matrices : others).push_back(p);
    }
    if (matrices.empty() && others.empty()) throw tessera::ConfigError("the model has no trainable parameters", "model");
    matrices_ = matrices.size();
    // Group 0: the matrices Muon updates (when there are any); then AdamW's.
    adopt({std::move(matrices), std::move(others)}, {weight_decay_, c.adamw_weight_decay});
  }

  void set_placements(std::shared_ptr<const tessera::OptimizerPlacements> placements) override {
    placements_ = std::move(placements);
  }

  void step() override {
    for (const auto& group : groups_) {
      const std::vector<std::size_t> members = active(group);
      if (members.empty()) continue;
      for (std::size_t i : members) state_[i].step += 1;
      if (is_matrix(members.front())) {
        muon_step(members);
      } else {
        std::vector<at::Tensor> params = params_of(members);
        std::vector<at::Tensor> exp_avgs = gather(members, 0), exp_avg_sqs = gather(members, 1);
        std::vector<std::int64_t> steps;
        for (std::size_t i : members) steps.push_back(state_[i].step);
        tessera_plugins::AdamWHyper h = adamw_;
        h.lr = adamw_lr_ * lr_ / base_lr_;  // the schedule's factor, as the matrices get it
        tessera_plugins::adamw_foreach_update(params, grads_of(members), exp_avgs, exp_avg_sqs, steps, h);
      }
    }
  }

 protected:
  std::vector<std::string> fields_of(std::size_t i) const override {
    if (is_matrix(i)) return {"momentum_buffer"};
    return {"exp_avg", "exp_avg_sq"};
  }
  bool saves_step_of(std::size_t i) const override { return !is_matrix(i); }

 private:
  bool is_matrix(std::size_t i) const { return i < matrices_; }

  // torch.optim.Muon's step for the matrices `members`: the momentum first, then, a bucket at a
  // time, each matrix's update made whole on one rank of its share group, orthogonalised there and
  // each rank's share sent back (OptimizerPlacements' owners: the group's ranks split the
  // Newton-Schulz work, as Moonlight's distributed Muon); a matrix nothing shares is whole here.
  void muon_step(const std::vector<std::size_t>& members) {
    std::vector<at::Tensor> updates;
    for (std::size_t i : members) {
      const at::Tensor& grad = params_[i].grad();
      at::Tensor& buf = state_[i].fields[0];
      buf.lerp_(grad, 1 - momentum_);
      updates.push_back(nesterov_ ? grad.lerp(buf, momentum_) : buf);
    }
    std::size_t begin = 0;
    while (begin < members.size()) {
      std::size_t end = begin;
      std::int64_t elements = 0;
      while (end < members.size() && (end == begin || elements + local_numel(members[end]) <= kExchangeBucket)) {
        elements += local_numel(members[end++]);
      }
      const std::vector<std::size_t> bucket(members.begin() + begin, members.begin() + end);
      const std::vector<at::Tensor> shares(updates.begin() + begin, updates.begin() + end);
      std::vector<at::Tensor> locals = placements_ ? placements_->local_at_owners(bucket, shares) : shares;
      std::vector<at::Tensor> results;
      for (std::size_t k = 0; k < bucket.size(); ++k) {
        // Where another rank owns it, the share stands in (its dtype and device are what is read).
        results.push_back(locals[k].defined() ? orthogonalised(bucket[k], locals[k]) : shares[k]);
      }
      const std::vector<at::Tensor> mine = placements_ ? placements_->shares_from_owners(bucket, results) : results;
      for (std::size_t k = 0; k < bucket.size(); ++k) apply(bucket[k], mine[k]);
      begin = end;
    }
  }

  // Parameter i's orthogonalised update as its local tensor, from its local update: made whole
  // over the model's axis, orthogonalised (stacked experts [experts, rows, cols] one by one, whole
  // on their expert-parallel rank) and cut back to the local part.
  at::Tensor orthogonalised(std::size_t i, const at::Tensor& local) const {
    if (whole_dims(i) == 3) {
      std::vector<at::Tensor> each;
      for (std::int64_t e = 0; e < local.size(0); ++e) each.push_back(tessera_plugins::muon::orthogonalise(local[e], ns_));
      return at::stack(each);
    }
    if (!placements_) return tessera_plugins::muon::orthogonalise(local, ns_);
    const std::string& name = (*placements_)[i].name;
    const at::Tensor orthogonal = tessera_plugins::muon::orthogonalise(placements_->model().whole(name, local), ns_);
    return placements_->model().cut({{name, orthogonal}}).at(name);
  }

  // Decoupled weight decay, then this rank's share of the orthogonalised update with the lr
  // adjusted to the whole matrix's shape (an expert's for stacked experts).
  void apply(std::size_t i, const at::Tensor& mine) {
    const at::Tensor p = params_[i].detach();
    const std::vector<std::int64_t> whole =
        placements_ ? (*placements_)[i].placement.whole_shape : params_[i].sizes().vec();
    const std::size_t first = whole.size() == 3 ? 1 : 0;
    p.mul_(1 - lr_ * weight_decay_);
    p.add_(mine.reshape(p.sizes()).to(p.scalar_type()),
           -adjusted_lr(lr_, adjust_lr_fn_, whole.at(first), whole.at(first + 1)));
  }

  // Elements of parameter i's local tensor (its part along the model's axes).
  std::int64_t local_numel(std::size_t i) const {
    if (!placements_) return params_[i].numel();
    std::int64_t n = 1;
    for (const std::int64_t d : (*placements_)[i].local_shape) n *= d;
    return n;
  }

  // Parameter i's dimensions as a whole (its share may be 1-D under a sharding strategy).
  std::int64_t whole_dims(std::size_t i) const {
    if (placements_) return static_cast<std::int64_t>((*placements_)[i].local_shape.size());
    return params_[i].dim();
  }

  double momentum_;
  bool nesterov_;
  double weight_decay_;
  std::string adjust_lr_fn_;
  double adamw_lr_;
  tessera_plugins::AdamWHyper adamw_;
  tessera_plugins::muon::NewtonSchulz ns_;
  std::size_t matrices_ = 0;  // params_[0, matrices_) are Muon's
  std::shared_ptr<const tessera::OptimizerPlacements> placements_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Optimizer, MuonConfig>(
      "muon",
      "Muon (momentum orthogonalised by Newton-Schulz) on the hidden matrices, whole under every mesh; AdamW on the "
      "embedding, the head, norms and biases",
      [](const MuonConfig& c) { return std::make_shared<MuonOptimizer>(c); });
}

}  // namespace

TESSERA_PLUGIN("optimizer_muon", "0.1.0", register_components)
