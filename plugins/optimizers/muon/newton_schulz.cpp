// Newton-Schulz orthogonalisation (newton_schulz.hpp): torch.optim.Muon's arithmetic in ATen.
#include "newton_schulz.hpp"

#include <ATen/ops/addmm.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/norm.h>

namespace tessera_plugins::muon {

at::Tensor orthogonalise(const at::Tensor& matrix, const NewtonSchulz& ns) {
  const auto [a, b, c] = ns.coefficients;
  at::Tensor x = matrix.to(ns.dtype, /*non_blocking=*/false, /*copy=*/true);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x.div_(at::norm(x).clamp_min(ns.eps));
  for (std::int64_t k = 0; k < ns.steps; ++k) {
    const at::Tensor gram = at::matmul(x, x.t());
    const at::Tensor polynomial = at::addmm(gram, gram, gram, /*beta=*/b, /*alpha=*/c);  // b G + c G^2
    x = at::addmm(x, polynomial, x, /*beta=*/a);                                         // a X + P X
  }
  return tall ? x.t() : x;
}

}  // namespace tessera_plugins::muon
