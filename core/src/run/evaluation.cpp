// `tessera eval`: a run's model, its loss, and the first batches of one of the spec's datasets.
#include <string>

#include "tessera/core/components/component_factory.hpp"
#include "tessera/core/distributed/distributed.hpp"
#include "tessera/core/run/adapter_checks.hpp"
#include "tessera/core/run/training_run.hpp"
#include "tessera/log.hpp"

namespace tessera::core {
namespace {

// The dataset node to evaluate on, its config path, and the micro-batch size the spec gives it.
struct EvalData {
  ConfigNode node;
  std::string path;
  std::int64_t micro_batch_size = 0;  // 0: not given
};

// A reference {instance_key: NAME, ...} is replaced by the named instance's node.
const ConfigNode& dereferenced(const ConfigNode& components, const ConfigNode& node, std::string& path) {
  const ConfigNode* key = node.is_map() ? node.find("instance_key") : nullptr;
  if (!key) return node;
  const ConfigNode* target = key->is_scalar() ? components.find(key->scalar()) : nullptr;
  if (!target) throw ConfigIssue(key->pos(), path, "refers to no instance named '" + key->scalar() + "' under components");
  path = join_path("components", key->scalar());
  return *target;
}

EvalData find_eval_data(const ConfigNode& components, const std::string& split) {
  EvalData out;
  if (split == "train") {
    out.path = "components.train_data";
    out.node = dereferenced(components, *components.find("train_data"), out.path);
    return out;
  }
  // The spec's evaluation dataset: the data of its first evaluation callback.
  const ConfigNode* callbacks = components.find("callbacks");
  if (callbacks && callbacks->is_sequence()) {
    for (std::size_t i = 0; i < callbacks->items().size(); ++i) {
      const ConfigNode& cb = callbacks->items()[i];
      const ConfigNode* variant = cb.is_map() ? cb.find("variant_key") : nullptr;
      const ConfigNode* config = cb.is_map() ? cb.find("config") : nullptr;
      const ConfigNode* data = config && config->is_map() ? config->find("data") : nullptr;
      if (!variant || !variant->is_scalar() || variant->scalar() != "evaluation" || !data) continue;
      out.path = join_path(join_path(index_path("components.callbacks", i), "config"), "data");
      out.node = dereferenced(components, *data, out.path);
      if (const ConfigNode* mbs = config->find("micro_batch_size"); mbs && mbs->is_scalar()) {
        try {
          out.micro_batch_size = std::stoll(mbs->scalar());
        } catch (const std::exception&) {
          throw ConfigIssue(mbs->pos(), join_path(out.path, "micro_batch_size"), "expected an integer");
        }
      }
      return out;
    }
  }
  throw ConfigIssue(callbacks ? callbacks->pos() : components.pos(), "components.callbacks",
                    "the spec has no evaluation dataset (a callback/evaluation with data); add one, or evaluate "
                    "on the training data with --split train");
}

}  // namespace

EvalTotals TrainingRun::evaluate(const EvalOptions& options) {
  const ConfigNode& components = plan_.components();
  const EvalData data_spec = find_eval_data(components, options.split);
  const ConfigNode* kind = data_spec.node.is_map() ? data_spec.node.find("component_key") : nullptr;
  if (!kind || !kind->is_scalar() || kind->scalar() != "dataset") {
    throw ConfigIssue(data_spec.node.pos(), data_spec.path, "expected a component of kind dataset to evaluate on");
  }
  // Split over the data-parallel ranks; tensor-parallel peers evaluate the same batches.
  const std::int64_t world = plan_.context.parallel.data_parallel();
  if (options.batches < 1 || options.batches % world != 0) {
    throw ConfigError("--batches " + std::to_string(options.batches) + " must be a positive multiple of the " +
                          std::to_string(world) + " data-parallel ranks (every rank evaluates the same number)",
                      "");
  }

  auto trainer = make_trainer();
  if (trainer->loss().rollouts()) {
    throw ConfigError("the loss trains on completions it samples and scores with rewards, which no fixed batches "
                      "hold: tessera eval does not evaluate it; read its reward in metrics.jsonl, or try the model "
                      "with tessera generate",
                      "components.loss");
  }
  if (!plan_.resume.empty()) {
    const std::string path = plan_.resume == "auto" ? agreed_resumable_checkpoint(plan_, *communicator_) : plan_.resume;
    if (path.empty()) {
      log::info("--resume auto: no valid checkpoint under ", plan_.checkpoints.dir(), "; evaluating the model as built");
    } else {
      trainer->restore_model(path);
      log::info("evaluating the model of checkpoint ", path);
    }
  }

  // A fresh instance read from its start, whatever position the trainer's own data restored.
  // Under a name no spec uses, beside the instances it refers to.
  const std::string eval_name = "tessera_evaluated_data";
  ConfigNode eval_components = ConfigNode::make_map(components.pos());
  eval_components.set(eval_name, data_spec.node);
  add_referenced_instances(data_spec.node, components, eval_components);
  BuiltComponents built = ComponentFactory(host_.registry(), trainer->context()).build(eval_components);
  auto data = std::static_pointer_cast<Dataset>(built.instances.at(eval_name).object);
  data->set_shard(data_parallel_group(trainer->context())->rank(), world);
  const std::int64_t micro_batch_size =
      options.micro_batch_size > 0 ? options.micro_batch_size
      : data_spec.micro_batch_size > 0 ? data_spec.micro_batch_size
                                        : plan_.trainer.micro_batch_size;
  // A loss with a reference model (loss/dpo) compares with the run's: the base under adapters, or
  // the checkpoint's frozen copy of the starting weights (the model as built, without one).
  const ReferenceLogits reference =
      trainer->loss().needs_reference() ? trainer->reference_forward() : ReferenceLogits();
  const EvalTotals totals = evaluate_loss(trainer->model(), trainer->loss(), *data, options.batches / world,
                                          micro_batch_size, trainer->context(), reference);
  shut_down(*communicator_);
  return totals;
}

}  // namespace tessera::core
