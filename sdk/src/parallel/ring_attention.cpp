// Ring attention (Liu et al.; the online softmax of FlashAttention across ranks). Each rank holds
// two of the sequence's 2 cp chunks as queries and passes its key/value chunks around the ring:
// at step s it attends to rank (r - s)'s chunks and merges the result into a running maximum,
// normaliser and sum per query. A (query chunk, key chunk) pair is skipped when causality masks
// it entirely (the key chunk comes later), computed without a causal mask when it comes entirely
// earlier, and with one on the diagonal. Backward passes keys and values around the ring again
// with the gradients of them accumulated on the way, one more hop bringing each block's home.
// Everything is computed in float32 (the inputs' dtype comes back).
//
// A pair's attention and its gradients come from a fused kernel where there is one (LibTorch's
// flash attention on the CPU, which returns the log-sum-exp the merge needs and takes the whole
// output's log-sum-exp in backward): no [chunk, chunk] score matrix is held, so a rank's memory
// falls as 1 / cp. Elsewhere (CUDA, for now) the pair is computed from its score matrix.
#include "ring_attention.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/run/precision.hpp"

namespace tessera {
namespace {

struct RingGroup : torch::CustomClassHolder {
  explicit RingGroup(std::shared_ptr<Communicator> g) : group(std::move(g)) {}
  std::shared_ptr<Communicator> group;
};

// The global chunk indices rank `r` holds: an early one and a late one.
std::array<std::int64_t, 2> chunks_of(std::int64_t r, std::int64_t cp) { return {r, 2 * cp - 1 - r}; }

enum class Pair { skip, full, diagonal };
Pair relation(std::int64_t query_chunk, std::int64_t key_chunk) {
  if (key_chunk > query_chunk) return Pair::skip;
  return key_chunk < query_chunk ? Pair::full : Pair::diagonal;
}

// Which keys each query of the pair may see ([B or 1, 1, c, c] bool), undefined when all.
at::Tensor pair_mask(Pair pair, std::int64_t query_chunk, std::int64_t key_chunk, std::int64_t c,
                     const at::Tensor& document_ids, const at::TensorOptions& options) {
  at::Tensor mask;
  if (pair == Pair::diagonal) mask = at::ones({c, c}, options.dtype(at::kBool)).tril().view({1, 1, c, c});
  if (document_ids.defined()) {
    const at::Tensor dq = document_ids.narrow(1, query_chunk * c, c), dk = document_ids.narrow(1, key_chunk * c, c);
    const at::Tensor same = dq.unsqueeze(2).eq(dk.unsqueeze(1)).unsqueeze(1);  // [B, 1, c, c]
    mask = mask.defined() ? mask.logical_and(same) : same;
  }
  return mask;
}

at::Tensor expand_heads(const at::Tensor& t, std::int64_t groups) {
  return groups == 1 ? t : t.repeat_interleave(groups, 1);
}
at::Tensor fold_heads(const at::Tensor& t, std::int64_t groups) {
  if (groups == 1) return t;
  return t.view({t.size(0), t.size(1) / groups, groups, t.size(2), t.size(3)}).sum(2);
}

// Sends `out` to the next rank and receives the previous rank's into `in`, tensor by tensor.
class RingExchange {
 public:
  RingExchange(Communicator& group, std::vector<at::Tensor>& out, std::vector<at::Tensor>& in) {
    const std::int64_t cp = group.world_size(), rank = group.rank();
    for (std::size_t i = 0; i < in.size(); ++i) {
      pending_.push_back(group.recv_async(in[i], (rank + cp - 1) % cp, static_cast<int>(i)));
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      pending_.push_back(group.send_async(out[i], (rank + 1) % cp, static_cast<int>(i)));
    }
  }
  void wait() {
    for (auto& p : pending_) p->wait();
    pending_.clear();
  }

 private:
  std::vector<std::shared_ptr<PendingCollective>> pending_;
};

// Whether a pair runs in a fused kernel here (see the top of the file).
bool fused(const at::Tensor& q) { return q.device().is_cpu(); }

// The fused kernel's masking of a pair: causal on the diagonal without documents; with them, the
// pair's mask as an additive one (the kernel takes the query's dtype).
struct FusedMask {
  bool causal = false;
  std::optional<at::Tensor> additive;
};
FusedMask fused_mask(Pair pair, const at::Tensor& mask, bool documents, const at::TensorOptions& options) {
  if (!documents) return {pair == Pair::diagonal, std::nullopt};
  return {false, at::zeros({}, options).masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity())};
}

// One (query chunk, key chunk) pair's attention: its output [B, H, c, D] and log-sum-exp
// [B, H, c] (float32), -inf (and an output of 0) for a query that may see none of the keys.
// `mask`: which keys each query may see (pair_mask), `documents` whether it holds documents'.
std::pair<at::Tensor, at::Tensor> attend_pair(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              Pair pair, const at::Tensor& mask, bool documents, double scale) {
  if (fused(q)) {
    const FusedMask m = fused_mask(pair, mask, documents, q.options());
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, m.causal, m.additive, scale);
    if (documents) {
      // The kernel gives a query that sees no key an output of 0 and a log-sum-exp of 0: -inf it is.
      const at::Tensor sees_none = mask.logical_not().all(-1);  // [B, 1, c]
      lse = at::where(sees_none, at::full({}, -std::numeric_limits<float>::infinity(), lse.options()), lse);
      out = at::where(sees_none.unsqueeze(-1), at::zeros({}, out.options()), out);
    }
    return {out, lse};
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor lse = at::logsumexp(scores, -1);
  const at::Tensor safe = at::where(lse.isinf(), at::zeros_like(lse), lse);
  return {at::matmul((scores - safe.unsqueeze(-1)).exp(), v), lse};
}

// The gradients of q, k and v of one pair, given the whole output's `out` and `lse` for these
// queries (the pair's share of the softmax is exp(score - lse)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> pair_gradients(const at::Tensor& dout, const at::Tensor& q,
                                                               const at::Tensor& k, const at::Tensor& v,
                                                               const at::Tensor& out, const at::Tensor& lse,
                                                               Pair pair, const at::Tensor& mask, bool documents,
                                                               double scale) {
  if (fused(q)) {
    const FusedMask m = fused_mask(pair, mask, documents, q.options());
    return at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, m.causal, m.additive,
                                                                    scale);
  }
  const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
  at::Tensor p = (scores - lse.unsqueeze(-1)).exp();
  if (mask.defined()) p = p.masked_fill(mask.logical_not(), 0.0);
  const at::Tensor delta = (dout * out).sum(-1);
  const at::Tensor dp = at::matmul(dout, v.transpose(-2, -1));
  const at::Tensor ds = p * (dp - delta.unsqueeze(-1)) * scale;
  return {at::matmul(ds, k), at::matmul(ds.transpose(-2, -1), q), at::matmul(p.transpose(-2, -1), dout)};
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& documents, std::shared_ptr<Communicator> group) {
    NoAutocast plain(q.device());
    const at::Tensor document_ids = documents.numel() > 0 ? documents : at::Tensor();
    Communicator& g = *group;
    const std::int64_t cp = g.world_size(), rank = g.rank();
    const std::int64_t c = q.size(2) / 2, groups = q.size(1) / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor qf = q.to(at::kFloat);
    const auto mine = chunks_of(rank, cp);
    // Each query chunk's output and log-sum-exp over the key chunks merged so far.
    std::vector<at::Tensor> acc(2), lse(2);
    std::vector<at::Tensor> current{k.contiguous(), v.contiguous()};
    for (std::int64_t s = 0; s < cp; ++s) {
      const std::int64_t source = (rank - s + cp) % cp;
      std::vector<at::Tensor> next;
      std::unique_ptr<RingExchange> exchange;
      if (s + 1 < cp) {
        next = {at::empty_like(current[0]), at::empty_like(current[1])};
        exchange = std::make_unique<RingExchange>(g, current, next);
      }
      const auto theirs = chunks_of(source, cp);
      for (int qi = 0; qi < 2; ++qi) {
        for (int ki = 0; ki < 2; ++ki) {
          const Pair pair = relation(mine[qi], theirs[ki]);
          if (pair == Pair::skip) continue;
          const at::Tensor kc = expand_heads(current[0].narrow(2, ki * c, c), groups).to(at::kFloat).contiguous();
          const at::Tensor vc = expand_heads(current[1].narrow(2, ki * c, c), groups).to(at::kFloat).contiguous();
          const at::Tensor mask = pair_mask(pair, mine[qi], theirs[ki], c, document_ids, qf.options());
          auto [out, pair_lse] = attend_pair(qf.narrow(2, qi * c, c).contiguous(), kc, vc, pair, mask,
                                             document_ids.defined(), scale);
          if (!acc[qi].defined()) {
            acc[qi] = out;
            lse[qi] = pair_lse;
            continue;
          }
          // Merged by their log-sum-exps; a row no key has reached yet stays -inf (and 0).
          const at::Tensor merged = at::logaddexp(lse[qi], pair_lse);
          const at::Tensor safe = at::where(merged.isinf(), at::zeros_like(merged), merged);
          acc[qi] = acc[qi] * (lse[qi] - safe).exp().unsqueeze(-1) + out * (pair_lse - safe).exp().unsqueeze(-1);
          lse[qi] = merged;
        }
      }
      if (exchange) {
        exchange->wait();
        current = std::move(next);
      }
    }
    // Every query sees at least itself (its diagonal pair): every log-sum-exp is finite.
    const at::Tensor out = at::cat({acc[0], acc[1]}, 2);
    const at::Tensor whole_lse = at::cat({lse[0], lse[1]}, 2);
    ctx->save_for_backward({q, k, v, out, whole_lse, documents});
    ctx->saved_data["group"] = at::IValue::make_capsule(c10::make_intrusive<RingGroup>(std::move(group)));
    return out.to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const at::Tensor document_ids = saved[5].numel() > 0 ? saved[5] : at::Tensor();
    NoAutocast plain(q.device());
    Communicator& g = *c10::static_intrusive_pointer_cast<RingGroup>(ctx->saved_data["group"].toCapsule())->group;
    const std::int64_t cp = g.world_size(), rank = g.rank();
    const std::int64_t c = q.size(2) / 2, groups = q.size(1) / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor qf = q.to(at::kFloat), dout = grads[0].to(at::kFloat);
    at::Tensor dq = at::zeros_like(qf);
    const auto mine = chunks_of(rank, cp);
    // Travelling with the keys and values: the gradients of them, accumulated on the way.
    std::vector<at::Tensor> current{k.contiguous(), v.contiguous(), at::zeros(k.sizes(), qf.options()),
                                    at::zeros(v.sizes(), qf.options())};
    for (std::int64_t s = 0; s < cp; ++s) {
      const std::int64_t source = (rank - s + cp) % cp;
      const auto theirs = chunks_of(source, cp);
      for (int qi = 0; qi < 2; ++qi) {
        for (int ki = 0; ki < 2; ++ki) {
          const Pair pair = relation(mine[qi], theirs[ki]);
          if (pair == Pair::skip) continue;
          auto chunk = [&](const at::Tensor& t) { return t.narrow(2, qi * c, c).contiguous(); };
          const at::Tensor kc = expand_heads(current[0].narrow(2, ki * c, c), groups).to(at::kFloat).contiguous();
          const at::Tensor vc = expand_heads(current[1].narrow(2, ki * c, c), groups).to(at::kFloat).contiguous();
          const at::Tensor mask = pair_mask(pair, mine[qi], theirs[ki], c, document_ids, qf.options());
          auto [dqc, dkc, dvc] = pair_gradients(chunk(dout), chunk(qf), kc, vc, chunk(out), chunk(lse), pair, mask,
                                                document_ids.defined(), scale);
          dq.narrow(2, qi * c, c).add_(dqc);
          current[2].narrow(2, ki * c, c).add_(fold_heads(dkc, groups));
          current[3].narrow(2, ki * c, c).add_(fold_heads(dvc, groups));
        }
      }
      // Pass keys, values and their gradients on; after the last step only the gradients, which
      // the next rank's block is: each block's gradients come home.
      std::vector<at::Tensor> outgoing = s + 1 < cp ? current : std::vector<at::Tensor>{current[2], current[3]};
      std::vector<at::Tensor> incoming;
      for (const auto& t : outgoing) incoming.push_back(at::empty_like(t));
      RingExchange exchange(g, outgoing, incoming);
      exchange.wait();
      if (s + 1 < cp) {
        current = std::move(incoming);
      } else {
        current = {at::Tensor(), at::Tensor(), incoming[0], incoming[1]};
      }
    }
    return {dq.to(q.scalar_type()), current[2].to(k.scalar_type()), current[3].to(v.scalar_type()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& document_ids,
                          const std::shared_ptr<Communicator>& group) {
  if (q.size(2) % 2 != 0 || k.size(2) != q.size(2) || q.size(1) % k.size(1) != 0) {
    throw Error("ring attention: q " + c10::str(q.sizes()) + ", k " + c10::str(k.sizes()) +
                ": a slice of two equal chunks and heads a multiple of the key/value heads expected");
  }
  // Custom functions take defined tensors only: no documents is an empty one.
  const at::Tensor documents = document_ids.defined() ? document_ids : at::empty({0}, q.options().dtype(at::kLong));
  return RingAttention::apply(q, k, v, documents, group);
}

}  // namespace tessera
