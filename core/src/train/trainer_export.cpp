// What a model export holds, by checkpoint.export_format, made on rank 0 from the weights a
// save captured (the writer may run after the model has moved on):
//   tessera  every tensor by the model's names; the adapters' apart from the base
//   hf       the model's Hugging Face folder, every adapter merged into the base weights
//   peft     the one adapter as a PEFT folder, over the base the model was imported from
#include <memory>
#include <utility>

#include "tessera/core/train/trainer.hpp"
#include "tessera/error.hpp"

namespace tessera::core {

void Trainer::prepare_export(CheckpointState& captured) const {
  const std::string& format = checkpoint_.settings.export_format;
  if (format == "hf") {
    StateDict merged;
    const StateDict* weights = &captured.model;
    if (!parts_.adapters.empty()) {
      merged = captured.model;
      for (const auto& adapter : parts_.adapters) adapter->merge(merged);
      for (const std::string& name : parts_.adapter_parameters) {
        if (merged.count(name)) throw Error("export_format hf: an adapter left its tensor " + name + " unmerged");
      }
      weights = &merged;
    }
    HfExport hf = parts_.model->hugging_face_export(*weights);
    // The run's tokenizer, when named, goes with the weights (an imported model's own files the
    // model lists already; the named ones take their place).
    if (!checkpoint_.settings.export_tokenizer.empty()) {
      hf.files_to_copy = tokenizer_files_at(checkpoint_.settings.export_tokenizer);
    }
    captured.hf_export = std::make_shared<const HfExport>(std::move(hf));
  } else if (format == "peft") {
    // TrainingRun::train checked that there is exactly one adapter and that it exports PEFT.
    if (parts_.adapters.size() != 1) throw Error("export_format peft: the run needs exactly one adapter");
    captured.peft_export = std::make_shared<const PeftExport>(
        parts_.adapters.front()->peft_export(*parts_.model, captured.model, checkpoint_.base_model));
  } else {
    captured.adapter_tensors = parts_.adapter_parameters;
  }
}

}  // namespace tessera::core
