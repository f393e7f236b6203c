// Kind `adapter`: parameter-efficient fine-tuning. An adapter changes a built model in place
// (LoRA adds low-rank terms to its linear layers) and says which parameters train; the host
// freezes every other one, so the base gets no gradients and no optimizer state. The run's
// adapters (`components.adapters`, a list) are applied in order to the model right after it is
// built, before the optimizer and the parallel strategy see it, as torchtitan's model converters.
//
// Adapters find a model's layers by their Hugging Face names, the last parts of a layer's module
// path, and wrap the tessera::Linear found there (tessera/nn/linear_layers.hpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "tessera/export.hpp"
#include "tessera/components/model.hpp"
#include "tessera/run/stateful.hpp"

namespace tessera {

class TESSERA_API Adapter {
 public:
  static constexpr const char* kKind = "adapter";
  virtual ~Adapter();

  // Changes `model` (its layers may still be on the meta device) and returns the parameters that
  // train because of this adapter: its own, and any of the model's it leaves trainable. Its own
  // are registered on the modules they belong to (LoRA's on the layer it wraps: the model's
  // parameters, saved, sharded and loaded with that layer). Called once. A configuration that
  // does not fit the model (a target naming no layer) throws tessera::ConfigError naming the
  // config field, which the host reports at its position in the spec.
  virtual std::vector<at::Tensor> apply(Model& model) = 0;

  // --- Exports --------------------------------------------------------------------------------
  // Whether peft_export() can write this adapter as a PEFT folder.
  virtual bool exports_peft() const { return false; }
  // The adapter as a PEFT folder, from `state`: the model's whole state dict by its own names.
  // `base_model`: where the base came from (adapter_config.json's base_model_name_or_path; may
  // be empty). The model gives its layers' Hugging Face names (Model::hugging_face_module).
  // The default throws.
  virtual PeftExport peft_export(const Model& model, const StateDict& state, const std::string& base_model) const;
  // Whether merge() can fold this adapter into the base weights.
  virtual bool merges() const { return false; }
  // Folds this adapter into the base weights of `state` (the model's whole state dict) and
  // removes its own tensors from it: what a merged Hugging Face export writes. The default throws.
  virtual void merge(StateDict& state) const;
};

}  // namespace tessera
