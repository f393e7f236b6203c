// Muon's orthogonalisation: the quintic Newton-Schulz iteration torch.optim.Muon runs (Keller
// Jordan's coefficients by default), which takes a matrix G = U S V^T to about U S' V^T with S'
// near 1, in bf16 as torch does or in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace tessera_plugins::muon {

struct NewtonSchulz {
  std::array<double, 3> coefficients{3.4445, -4.7750, 2.0315};  // a, b, c
  std::int64_t steps = 5;
  double eps = 1e-7;                     // the norm's floor
  at::ScalarType dtype = at::kBFloat16;  // what the iteration computes in
};

// `matrix` [rows, cols] orthogonalised: a new tensor in ns.dtype (the input is never written).
// A wide matrix is iterated as it is, a tall one transposed, so the Gram matrix is the small one.
at::Tensor orthogonalise(const at::Tensor& matrix, const NewtonSchulz& ns);

}  // namespace tessera_plugins::muon
