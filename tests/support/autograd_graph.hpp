// Looking into the autograd graph a tensor hangs from: tests that a computation really took a
// path (a custom function's node) rather than only that its numbers are right.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <set>
#include <string>
#include <vector>

namespace tessera::testing {

// Nodes of `root`'s backward graph whose name contains `part` (each node counted once).
inline int count_graph_nodes(const at::Tensor& root, const std::string& part) {
  int count = 0;
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (root.grad_fn()) todo.push_back(root.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (node->name().find(part) != std::string::npos) ++count;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) todo.push_back(edge.function.get());
    }
  }
  return count;
}

}  // namespace tessera::testing
