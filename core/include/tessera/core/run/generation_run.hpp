// `tessera generate` and `tessera chat`: a spec's model (with its adapters) built to generate, its
// weights from init_from or a checkpoint, and the spec's tokenizer. The rest of a training spec
// may be there; it is neither needed nor built.
//
// The ranks form generation's own mesh: the spec's tensor-parallel degree (each rank its heads
// and its part of the KV cache), every other rank data-parallel, holding the whole model and
// generating its own share of the prompts. Pipeline, context and expert splits are training's:
// under generation each tensor-parallel group holds every block and every expert.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/components/model.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/plugins/plugin_host.hpp"
#include "tessera/core/run/run_plan.hpp"
#include "tessera/generation/generate.hpp"
#include "tessera/text/chat_template.hpp"

namespace tessera::core {

// The mesh generation runs on for `world_size` ranks and a spec's mesh: tp kept (tp 1 for a
// process alone), the rest data-parallel. ConfigIssue (at parallelism.tp) when tp does not
// divide the ranks.
ParallelDims generation_dims(const RunPlan& plan, std::int64_t world_size);

class GenerationRun {
 public:
  // Plans the spec (options.generate_only is set here), loads the plugins and validates the model,
  // its adapters and the tokenizer. Throws ConfigIssue or PluginLoadError.
  explicit GenerationRun(RunOptions options);
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  const RunPlan& plan() const { return plan_; }

  // Joins the ranks, builds the model and the tokenizer on the device, and loads the weights of
  // the checkpoint --resume names (auto: the newest valid one; the model as built without one).
  // Every rank calls it.
  void start();

  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  // The spec's tokenizer (components.tokenizer, else the first one any component holds); null
  // when it has none.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The model's chat template: the tokenizer's folder's, else the init_from folder's.
  const std::optional<text::ChatTemplate>& chat_template() const { return chat_template_; }
  // The ids that end every completion: init_from's generation_config.json (else config.json),
  // else the tokenizer's EOS.
  const std::vector<std::int64_t>& eos_token_ids() const { return eos_token_ids_; }
  std::int64_t rank() const { return plan_.env.rank; }

  // Generates `requests` (every rank passes all of them): each data-parallel group its contiguous
  // share, its tensor-parallel ranks together. `options.after_token` gets indices into
  // `requests`. Rank 0 returns every result in order; the other ranks return their group's share.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests, GenerationOptions options);
  // Closes the process group once the results are out (every rank calls it).
  void finish();

 private:
  void load_checkpoint(const std::string& path);
  // Rank 0 gets every data-parallel group's results (each group's from request `first` of its
  // share), in request order.
  std::vector<GenerationResult> gather_on_rank0(std::vector<GenerationResult> mine, std::size_t first, std::size_t total);

  RunPlan plan_;
  PluginHost host_;
  ConfigNode components_;  // what generation builds: the model, its adapters, the tokenizer
  RunContext context_;     // generation's mesh (generation_dims)
  std::shared_ptr<Communicator> communicator_;
  BuiltComponents built_;
  std::shared_ptr<Model> model_;
  std::shared_ptr<Tokenizer> tokenizer_;
  std::optional<text::ChatTemplate> chat_template_;
  std::vector<std::int64_t> eos_token_ids_;
};

}  // namespace tessera::core
