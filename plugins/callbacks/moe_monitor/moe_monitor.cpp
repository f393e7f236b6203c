// Callback `moe_monitor`: per-layer expert load of a mixture-of-experts model (max violation,
// router entropy, dead experts, dropped assignments, each expert's share), summed over all ranks
// in one all-reduce and put into the step's metrics for every sink.
#include <ATen/ops/cat.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/run/communicator.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/error.hpp"
#include "tessera/components/model.hpp"
#include "tessera/components/moe_routing.hpp"
#include "tessera/plugin.hpp"

namespace {

// One layer's routing summed over the window and over ranks, on the host.
struct LayerLoad {
  std::int64_t layer = 0;           // the block index, for the metric names
  std::vector<double> assignments;  // per expert
  double dropped = 0, tokens = 0, entropy_sum = 0, aux_sum = 0, z_sum = 0, forwards = 0;

  double total() const {
    double sum = 0;
    for (double a : assignments) sum += a;
    return sum;
  }
  // Max load over mean load, minus one: 0 when balanced, E - 1 when one expert takes everything.
  double max_violation() const {
    const double mean = total() / static_cast<double>(assignments.size());
    return mean > 0 ? *std::max_element(assignments.begin(), assignments.end()) / mean - 1.0 : 0.0;
  }
  double dead_experts() const {
    return static_cast<double>(std::count(assignments.begin(), assignments.end(), 0.0));
  }
};

// Per layer: [assignments (E), dropped, tokens, entropy, aux, z, forwards], in doubles so counts
// over a long window stay exact.
constexpr std::int64_t kScalarsPerLayer = 6;

struct MoeMonitorConfig {
  std::int64_t every = 1;
  bool per_expert = true;

  static void declare(tessera::ConfigFields<MoeMonitorConfig>& f) {
    f.field("every", &MoeMonitorConfig::every, "collect every N steps; the model keeps summing its routing in between")
        .at_least(1);
    f.field("per_expert", &MoeMonitorConfig::per_expert, "also write each expert's share of the assignments");
  }
};

class MoeMonitor final : public tessera::Callback {
 public:
  explicit MoeMonitor(const MoeMonitorConfig& config) : every_(config.every), per_expert_(config.per_expert) {}

  void on_train_begin(tessera::CallbackContext& ctx) override { routing_of(ctx.model); }

  // Every rank takes its statistics and joins the one all-reduce, so all ranks write the same values.
  void on_collect_metrics(tessera::CallbackContext& ctx, tessera::StepMetrics& metrics) override {
    if (metrics.step % every_ != 0) return;  // between collections the model keeps summing
    tessera::MoeRouting& routing = routing_of(ctx.model);
    const std::vector<LayerLoad> layers = reduce(routing.take_router_statistics(), routing.num_experts(), ctx.run);
    double maxvio = 0, dead = 0, aux = 0, z = 0;
    std::int64_t reported = 0;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const LayerLoad& layer = layers[l];
      if (layer.forwards == 0) continue;  // no training forward in the window
      const std::string prefix = "moe/layer" + std::to_string(layer.layer) + "/";
      const double total = layer.total();
      metrics.extra[prefix + "maxvio"] = layer.max_violation();
      metrics.extra[prefix + "entropy"] = layer.tokens > 0 ? layer.entropy_sum / layer.tokens : 0.0;
      metrics.extra[prefix + "dead_experts"] = layer.dead_experts();
      metrics.extra[prefix + "dropped_fraction"] = total > 0 ? layer.dropped / total : 0.0;
      if (per_expert_) {
        for (std::size_t e = 0; e < layer.assignments.size(); ++e) {
          metrics.extra[prefix + "expert" + std::to_string(e) + "_fraction"] =
              total > 0 ? layer.assignments[e] / total : 0.0;
        }
      }
      maxvio = std::max(maxvio, layer.max_violation());
      dead += layer.dead_experts();
      aux += layer.aux_sum / layer.forwards;
      z += layer.z_sum / layer.forwards;
      ++reported;
    }
    if (reported == 0) return;
    metrics.extra["moe/maxvio"] = maxvio;
    metrics.extra["moe/dead_experts"] = dead;
    metrics.extra["moe/aux_loss"] = aux / static_cast<double>(reported);
    metrics.extra["moe/z_loss"] = z / static_cast<double>(reported);
  }

 private:
  static tessera::MoeRouting& routing_of(tessera::Model& model) {
    auto* routing = dynamic_cast<tessera::MoeRouting*>(&model);
    if (!routing || routing->num_experts() == 0) {
      throw tessera::Error(
          "callback/moe_monitor needs a model with mixture-of-experts layers (model/gpt_moe, model/llama with "
          "num_experts); this run's model is " + model.name() + (routing ? " without experts" : "") +
          "; remove the callback or use an MoE model");
    }
    return *routing;
  }

  // Packs every layer into one tensor, sums it over ranks (one collective) and reads it back once.
  static std::vector<LayerLoad> reduce(const std::vector<tessera::RouterStatistics>& stats, std::int64_t experts,
                                       const tessera::RunContext& run) {
    if (stats.empty()) return {};
    std::vector<at::Tensor> parts;
    for (const auto& s : stats) {
      const auto options = s.expert_assignments.options().dtype(at::kDouble);
      parts.push_back(s.expert_assignments.reshape({-1}).to(at::kDouble));
      parts.push_back(at::stack({s.dropped_assignments, s.tokens, s.entropy_sum, s.aux_loss_sum, s.z_loss_sum,
                                 at::scalar_tensor(static_cast<double>(s.forwards), options)})
                          .to(at::kDouble));
    }
    at::Tensor packed = at::cat(parts);
    // Over the data-parallel ranks: tensor-parallel peers route the same tokens.
    tessera::data_parallel_group(run)->all_reduce(packed);
    const at::Tensor host = packed.to(at::kCPU).contiguous();
    const double* v = host.data_ptr<double>();
    std::vector<LayerLoad> layers(stats.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      LayerLoad& layer = layers[i];
      layer.layer = stats[i].layer >= 0 ? stats[i].layer : static_cast<std::int64_t>(i);
      layer.assignments.assign(v, v + experts);
      v += experts;
      layer.dropped = v[0];
      layer.tokens = v[1];
      layer.entropy_sum = v[2];
      layer.aux_sum = v[3];
      layer.z_sum = v[4];
      layer.forwards = v[5];
      v += kScalarsPerLayer;
    }
    return layers;
  }

  std::int64_t every_;
  bool per_expert_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, MoeMonitorConfig>(
      "moe_monitor", "per-layer MoE expert load: max violation, router entropy, dead experts, drops",
      [](const MoeMonitorConfig& c) { return std::make_shared<MoeMonitor>(c); });
}

}  // namespace

TESSERA_PLUGIN("callback_moe_monitor", "0.1.0", register_components)
