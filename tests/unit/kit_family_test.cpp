// What the kit gives a family spec, each against its definition: Gemma's attention (q/k norms
// scaling by 1 + weight, its own softmax scale, Gemma 2's softcapped scores, a window) written
// out in float64; and the config table (nn::HfFieldTable): a layer list from a pattern, a value
// renamed by a transform, the YAML against config.json, the export's config.json read back, a
// Tessera export's record settled (a left-out field its default), and the keys a family computes
// only some values of.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/nn/attention.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/rotary.hpp"

namespace tessera {
namespace kit_family_test {

constexpr std::int64_t kSeq = 9;

nn::AttentionSpec gemma_like(std::optional<double> softcap) {
  nn::AttentionSpec spec;
  spec.hidden = 16;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 6;
  spec.qk_norm_eps = 1e-6;
  spec.qk_norm_weight = nn::RmsWeight::one_plus;
  spec.scale = 1.0 / std::sqrt(10.0);
  spec.logit_softcap = softcap;
  spec.sliding_window = 4;
  return spec;
}

// In float64: project, normalise each head (x / rms · (1 + w)), rotate, scores q·k · scale capped
// as cap · tanh(s / cap), the window's keys only, softmax, project back.
at::Tensor reference(const StateDict& w, const at::Tensor& x, const nn::AttentionSpec& s, const at::Tensor& cos,
                     const at::Tensor& sin) {
  const std::int64_t batch = x.size(0), group = s.heads / s.kv_heads;
  const auto d = [&](const std::string& name) { return w.at(name).to(at::kDouble); };
  const auto heads = [&](const std::string& proj, std::int64_t n, const std::string& norm) {
    at::Tensor h = at::linear(x.to(at::kDouble), d(proj + ".weight")).view({batch, kSeq, n, s.head_dim});
    if (!norm.empty()) h = h / (h.pow(2).mean(-1, true) + *s.qk_norm_eps).sqrt() * (1 + d(norm + ".weight"));
    h = h.transpose(1, 2);
    return norm.empty() ? h : nn::RotaryEmbedding::apply(h, cos.to(at::kDouble), sin.to(at::kDouble));
  };
  const at::Tensor q = heads("q_proj", s.heads, "q_norm");
  const at::Tensor k = heads("k_proj", s.kv_heads, "k_norm").repeat_interleave(group, 1);
  const at::Tensor v = heads("v_proj", s.kv_heads, "").repeat_interleave(group, 1);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * *s.scale;
  if (s.logit_softcap) scores = at::tanh(scores / *s.logit_softcap) * *s.logit_softcap;
  scores = scores.masked_fill(nn::causal_window_mask(kSeq, s.sliding_window, x.device()).logical_not(),
                              -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(scores, -1), v);
  return at::linear(y.transpose(1, 2).reshape({batch, kSeq, s.heads * s.head_dim}), d("o_proj.weight"));
}

TEST(KitFamily, GemmasAttentionIsItsDefinition) {
  for (const std::optional<double> cap : {std::optional<double>(), std::optional<double>(1.5)}) {
    SCOPED_TRACE(cap ? "softcapped" : "not capped");
    const nn::AttentionSpec spec = gemma_like(cap);
    nn::GroupedQueryAttention attention(spec);
    StateDict w;
    {
      c10::NoGradGuard no_grad;
      for (const auto& item : attention.named_parameters()) {
        item.value().copy_(at::randn(item.value().sizes()) * 0.5);
        w[item.key()] = item.value().detach().clone();
      }
    }
    nn::RotaryEmbedding rotary({spec.head_dim, kSeq, 10000.0});
    nn::AttentionInputs inputs;
    const auto [cos, sin] = rotary.tables(kSeq, {}, at::kFloat, at::kCPU);
    inputs.rotary = {{cos, sin}};
    const at::Tensor x = at::randn({2, kSeq, spec.hidden});
    c10::NoGradGuard no_grad;
    const at::Tensor got = attention.forward(x, inputs).to(at::kDouble);
    const at::Tensor expected = reference(w, x, spec, cos, sin);
    EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-5)) << (got - expected).abs().max().item<double>();
    // The cap is in effect: with it toggled the output differs.
    nn::AttentionSpec other = spec;
    other.logit_softcap = cap ? std::nullopt : std::optional<double>(1.5);
    EXPECT_FALSE(at::allclose(reference(w, x, other, cos, sin), expected, 1e-3, 1e-3));
  }
}

struct Tiny {
  std::int64_t n_layer = 2, pattern = 2, width = 0;  // width 0: 4 · 8
  std::vector<std::string> kinds;
  std::string act = "gelu_tanh";
  double cap = 0;
  std::set<std::string> given;
  std::int64_t resolved_width() const { return width > 0 ? width : 32; }
};

nn::HfFieldTable<Tiny> tiny_table() {
  namespace t = nn::hf_transforms;
  nn::HfFieldTable<Tiny> table("model/tiny");
  table.written("model_type", [](const Tiny&) { return "tiny"; });
  table.field("n_layer", &Tiny::n_layer, "num_hidden_layers", 26);
  table.field<std::int64_t>("width", &Tiny::width, "intermediate_size", 9216, &Tiny::resolved_width);
  table.field("kinds", &Tiny::kinds, "layer_types", {})
      .transform(t::layers_from_pattern("sliding_window_pattern", 6, "sliding", "full"));
  table.field("cap", &Tiny::cap, "softcap", nullptr).transform(t::null_as_zero(), t::zero_as_null());
  table.field("act", &Tiny::act, "activation").transform(t::renamed({{"gelu_new", "gelu_tanh"}}, "model/tiny"),
                                                          t::renamed_out({{"gelu_tanh", "gelu_new"}}));
  table.expect("hidden_act", {"gelu", "gelu_tanh"}, "gelu");
  return table;
}

HfConfig json(const std::string& text) { return HfConfig::parse(text, "config.json"); }

TEST(KitFamily, TheConfigTableSettlesWritesAndRefusesAsOneTable) {
  const nn::HfFieldTable<Tiny> table = tiny_table();
  // Left out: transformers' defaults; the layer list from the pattern; null as 0.
  Tiny c = table.settle_hf(Tiny{}, json(R"({"num_hidden_layers": 4, "sliding_window_pattern": 2, "softcap": null})"));
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.width, 9216);
  EXPECT_EQ(c.kinds, (std::vector<std::string>{"sliding", "full", "sliding", "full"}));
  EXPECT_EQ(c.cap, 0);
  // The export writes what the import reads.
  const nlohmann::ordered_json written = table.hf_config(c);
  EXPECT_EQ(written.at("model_type"), "tiny");
  EXPECT_TRUE(written.at("softcap").is_null());
  EXPECT_EQ(written.at("hidden_act"), "gelu");
  const Tiny back = table.settle_hf(Tiny{}, json(written.dump()));
  EXPECT_EQ(table.architecture(back), table.architecture(c));
  // A field the YAML gives must agree, in what it means (width 0 is the derived 32).
  Tiny yaml;
  yaml.given = {"width", "cap"};
  yaml.cap = 30;
  EXPECT_NO_THROW(table.settle_hf(yaml, json(R"({"intermediate_size": 32, "softcap": 30.0})")));
  try {
    table.settle_hf(yaml, json(R"({"intermediate_size": 64, "softcap": 30.0})"));
    ADD_FAILURE() << "a disagreement was taken";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "width");
    EXPECT_NE(std::string(e.what()).find("config.json says intermediate_size: 64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(table.settle_hf(Tiny{}, json(R"({"hidden_act": "relu"})")), ConfigError);
  EXPECT_THROW(table.settle_hf(Tiny{}, json(R"({"num_hidden_layers": "four"})")), ConfigError);
  // A renamed value: config.json's spelling in, the YAML's kept, config.json's written; another refused.
  EXPECT_EQ(table.settle_hf(Tiny{}, json(R"({"activation": "gelu_new"})")).act, "gelu_tanh");
  EXPECT_EQ(table.hf_config(Tiny{}).at("activation"), "gelu_new");
  EXPECT_THROW(table.settle_hf(Tiny{}, json(R"({"activation": "relu"})")), ConfigError);
}

// A Tessera export's record: what it wrote settles the fields the YAML leaves out; one it left
// out stands for its default, and a YAML saying otherwise is told so; an export whose run took its
// architecture from an init_from of its own leaves such a field unknown.
TEST(KitFamily, TheTableSettlesATesseraExportsRecord) {
  const nn::HfFieldTable<Tiny> table = tiny_table();
  const Tiny c = table.settle_export(Tiny{}, json(R"({"config": {"n_layer": 3, "width": 48}})"));
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.width, 48);
  Tiny yaml;
  yaml.given = {"cap"};
  yaml.cap = 5;
  try {
    table.settle_export(yaml, json(R"({"config": {"n_layer": 3}})"));
    ADD_FAILURE() << "a YAML against the default the export's run had was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("says cap: left out, so the default (0)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.settle_export(yaml, json(R"({"config": {"init_from": "/elsewhere"}})")).cap, 5);
}

}  // namespace kit_family_test
}  // namespace tessera
