// Which parameters an optimizer of whole matrices (optimizer/muon) updates as matrices: the
// trained parameters of two or more dimensions (stacked experts are matrices each) whose name
// contains none of `element_wise`, the patterns that send the token embedding and the output head
// to the element-wise optimizer beside it, with the norms and the biases. One rule, read by the
// optimizer and by `tessera plan`, which counts the state and the gathers it implies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// `name` as Model::named_parameters() gives it; `dims` the parameter's dimensions as the model
// built it (before a sharding strategy flattens it).
inline bool is_hidden_matrix(const std::string& name, std::int64_t dims, const std::vector<std::string>& element_wise) {
  if (dims < 2) return false;
  for (const std::string& pattern : element_wise) {
    if (name.find(pattern) != std::string::npos) return false;
  }
  return true;
}

}  // namespace tessera
