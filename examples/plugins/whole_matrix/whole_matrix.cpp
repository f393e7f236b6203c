// callback/whole_matrix: each step, the Frobenius norm and shape of one whole weight matrix,
// gathered through the SDK's placements (tessera/parallel/placement.hpp) however the mesh splits
// it: an example of a plugin that needs whole matrices (an optimizer orthogonalising them, a
// monitor of their spectra) without knowing the parallel axes.
#include <memory>
#include <string>

#include "tessera/components/callback.hpp"
#include "tessera/components/model.hpp"
#include "tessera/parallel/placement.hpp"
#include "tessera/plugin.hpp"

namespace {

struct WholeMatrixConfig {
  std::string parameter;  // required

  static void declare(tessera::ConfigFields<WholeMatrixConfig>& f) {
    f.field("parameter", &WholeMatrixConfig::parameter, "the model's parameter to gather whole").required();
  }
};

class WholeMatrix : public tessera::Callback {
 public:
  explicit WholeMatrix(WholeMatrixConfig config) : name_(std::move(config.parameter)) {}

  void on_train_begin(tessera::CallbackContext& ctx) override {
    placements_ = tessera::Placements(ctx.run, ctx.model.tensor_parallel_plan(), ctx.model.pipeline_tied_parameters());
  }

  // Every rank of the matrix's axis takes part in the gather (a collective); a pipeline stage that
  // does not hold it adds nothing.
  void on_collect_metrics(tessera::CallbackContext& ctx, tessera::StepMetrics& m) override {
    const auto named = ctx.model.named_parameters();
    const at::Tensor* local = named.find(name_);
    if (!local) return;
    const at::Tensor whole = placements_.whole(name_, local->detach());
    m.extra["whole_matrix/norm"] = whole.to(at::kDouble).norm().item<double>();
    m.extra["whole_matrix/rows"] = static_cast<double>(whole.size(0));
    m.extra["whole_matrix/local_rows"] = static_cast<double>(local->size(0));
  }

 private:
  std::string name_;
  tessera::Placements placements_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, WholeMatrixConfig>(
      "whole_matrix", "logs the norm and shape of one whole weight matrix, gathered over the mesh",
      [](const WholeMatrixConfig& c) { return std::make_shared<WholeMatrix>(c); });
}

}  // namespace

TESSERA_PLUGIN("whole_matrix", "1.0.0", register_components)
