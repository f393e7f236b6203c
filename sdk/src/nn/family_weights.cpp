// FamilyDecoder's weights: the init rule, and reading and writing Hugging Face folders and
// Tessera exports.
#include <cmath>

#include "tessera/nn/family.hpp"
#include "tessera/log.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/norms.hpp"
#include "tessera/nn/parameters.hpp"

namespace tessera::nn {
namespace {

// The row-parallel projections back into the residual stream, in every family's names.
bool residual_output(const std::string& name) {
  return name.find("o_proj.") != std::string::npos || name.find("down_proj.") != std::string::npos ||
         name.find(".w2.") != std::string::npos || ends_with(name, "c_proj.weight");
}

}  // namespace

void FamilyDecoder::load(const HfCheckpoint* hf, const std::string& init_from) {
  // Each norm parameter's identity, known by the module it belongs to rather than by its name.
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    if (!dynamic_cast<const Norm*>(item.value().get())) continue;
    const auto* rms = dynamic_cast<const RmsNorm*>(item.value().get());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      const bool zero = p.key() == "bias" || (rms && rms->kind() == RmsWeight::one_plus);
      norm_start_[item.key() + "." + p.key()] = zero ? 0.0 : 1.0;
    }
  }
  if (!has_deferred_parameters()) initialize_parameters(parameters());
  const std::int64_t experts = num_experts();
  if (hf && family_.skipped_tensors && !family_.why_skipped.empty()) {
    std::int64_t skipped = 0;
    for (const auto& item : hf->tensors) skipped += family_.skipped_tensors(item.first) ? 1 : 0;
    if (skipped > 0) log::warn(spec_.kind, ": skipped ", skipped, " tensors of ", hf->folder, ": ", family_.why_skipped);
  }
  if (hf) {
    const HfWeightNames names = family_.names_in ? family_.names_in(*hf) : family_.names;
    const std::string head = names.hf_name(family_.layout.head + ".weight");
    // A tied checkpoint may still store the head; it must be the embedding. Rotary tables some
    // converters store with every layer are derived, not weights.
    if (family_.tied) {
      check_tied_head(*hf, head, names.hf_name(family_.layout.embedding + ".weight"), ", but the model ties them");
    }
    import_hf_weights(*hf, *this, names, plan_, tp_, ep_, experts, /*partial=*/pp_.size() > 1,
                      [&](const std::string& name) {
                        return (family_.tied && name == head) || name.find("rotary_emb.inv_freq") != std::string::npos ||
                               (family_.skipped_tensors && family_.skipped_tensors(name));
                      });
    tokenizer_files_ = hf->tokenizer_files;
    special_ids_ = hf_import::special_token_ids(hf->config);
  } else if (!init_from.empty()) {
    hf_import::load_tessera_weights(*this, init_from, plan_, tp_, ep_, /*partial=*/pp_.size() > 1);
  }
}

HfExport FamilyDecoder::hugging_face_export(const StateDict& state) const {
  HfExport out;
  out.config_json = family_.hf_config_json(special_ids_);
  out.tensors = family_.names.export_tensors(state);
  out.files_to_copy = tokenizer_files_;
  return out;
}

void FamilyDecoder::initialize_parameters(const std::vector<at::Tensor>& params) {
  const InitSpec init = family_.init;
  const double residual_std =
      init.scaled_residual ? init.std / std::sqrt(2.0 * static_cast<double>(family_.blocks.size())) : init.std;
  nn::initialize_parameters(
      *this, spec_.kind, params, init_seed_,
      [&](const std::string& name) {
        if (const auto norm = norm_start_.find(name); norm != norm_start_.end()) {
          return InitialValue::constant(norm->second);
        }
        if (ends_with(name, ".bias")) return InitialValue::constant(0.0);
        return InitialValue::normal_with_std(residual_output(name) ? residual_std : init.std);
      },
      plan_, tp_, ep_);
}

}  // namespace tessera::nn
