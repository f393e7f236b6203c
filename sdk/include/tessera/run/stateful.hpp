// State that a checkpoint saves and restores. Every component holding state between steps
// (optimizer moments, data position) implements this so a resumed run continues exactly.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "tessera/export.hpp"

namespace tessera {

using StateDict = std::map<std::string, at::Tensor>;

class TESSERA_API Stateful {
 public:
  virtual ~Stateful();
  // Copies, never views of live buffers (a checkpoint writes them while training goes on);
  // host copies spare device memory. The trainer moves device tensors to the host itself.
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;
};

}  // namespace tessera
