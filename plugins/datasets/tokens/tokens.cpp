// Dataset `tokens`: fixed-length windows over a flat binary file of token ids (uint8, uint16 or uint32,
// little-endian, as numpy's tofile writes them), memory-mapped read-only. Each sample is a window
// of seq_len + 1 tokens: the first seq_len are the input, the last seq_len the labels. The same
// plugin registers `mixture` (mixture.cpp): several such files drawn by weight.
#include <memory>

#include "mixture.hpp"
#include "tessera/plugin.hpp"
#include "token_windows.hpp"

namespace {

using tessera::token_data::MixtureConfig;
using tessera::token_data::TokensConfig;
using tessera::token_data::TokenWindowDataset;

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Dataset, TokensConfig>(
      "tokens", "fixed-length windows over a memory-mapped flat token file",
      [](const TokensConfig& c, const tessera::RunContext& run) { return std::make_shared<TokenWindowDataset>(c, run.seed); });
  registrar.add<tessera::Dataset, MixtureConfig>(
      "mixture", "several token files drawn by weight, deterministically; every member's position in checkpoints",
      [](const MixtureConfig& c, const tessera::RunContext& run) { return tessera::token_data::make_mixture(c, run.seed); });
}

}  // namespace

TESSERA_PLUGIN("dataset_tokens", "0.1.0", register_components)
