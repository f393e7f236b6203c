#include "tessera/run/token_check.hpp"

#include <string>

#include "tessera/error.hpp"

namespace tessera {
namespace {

void check_ids(const at::Tensor& tensor, const char* name, std::int64_t vocab_size, bool ignore_allowed) {
  if (!tensor.defined() || !tensor.device().is_cpu() || tensor.numel() == 0) return;
  const at::Tensor ids = tensor.to(at::kLong).contiguous();
  const std::int64_t* data = ids.const_data_ptr<std::int64_t>();
  const std::int64_t row_length = ids.dim() > 0 ? ids.size(-1) : 1;
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    const std::int64_t id = data[i];
    if ((id >= 0 && id < vocab_size) || (ignore_allowed && id == kIgnoreIndex)) continue;
    throw Error(std::string(name) + " holds token id " + std::to_string(id) + " (row " +
                std::to_string(i / row_length) + ", position " + std::to_string(i % row_length) +
                "), outside the model's vocabulary of " + std::to_string(vocab_size) +
                " ids: the data was tokenised for a larger vocabulary than the model's vocab_size, or "
                "the token file's dtype is not the one it was written with");
  }
}

}  // namespace

void check_token_ids(const Batch& batch, std::int64_t vocab_size) {
  if (vocab_size <= 0) return;
  check_ids(batch.input_ids, "input_ids", vocab_size, /*ignore_allowed=*/false);
  check_ids(batch.labels, "labels", vocab_size, /*ignore_allowed=*/true);
}

}  // namespace tessera
