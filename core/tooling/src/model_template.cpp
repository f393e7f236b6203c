// The scaffold of kind model: a small Llama-style decoder as a family spec over the SDK's kit and
// its config.json as one table, whose generated tests train it on one rank and on two Gloo ranks
// under tp, pp and fsdp and require the same per-step losses (docs/writing-a-model.md follows it).
#include "scaffold_template.hpp"

namespace tessera::tooling {

KindTemplate model_template() {
  KindTemplate t{
      "#include <set>\n#include <string>\n#include <vector>\n\n#include \"tessera/nn/decoder_factory.hpp\"\n"
      "#include \"tessera/nn/mesh_rules.hpp\"\n",
      "tessera::Model",
      R"tpl(// config.json as one table, read by init_from and written by hf exports: each row a YAML field,
// the Hugging Face key it is, its value when config.json leaves it out. A LlamaForCausalLM here.
const tessera::nn::HfFieldTable<@CLASS@Config>& @NAME@_table() {
  using C = @CLASS@Config;
  static const auto table = [] {
    tessera::nn::HfFieldTable<C> f("model/@NAME@");
    f.architecture("LlamaForCausalLM", "llama");
    tessera::nn::causal_lm_rows(f);
    f.field("n_kv_head", &C::n_kv_head, "num_key_value_heads");
    f.field("intermediate_size", &C::intermediate_size, "intermediate_size");
    f.field("rope_theta", &C::rope_theta, "rope_theta|rope_parameters.rope_theta", 10000.0);
    // What this model computes one way only (transformers' defaults when absent): anything else
    // is refused at init_from.
    f.expect("hidden_act", {"silu"}, "silu").expect("rms_norm_eps", {1e-5}, 1e-6);
    f.expect("tie_word_embeddings", {false}, false);
    return f;
  }();
  return table;
}

@CLASS@Config @CLASS@Config::settled(const @CLASS@Config& yaml) {
  return tessera::nn::settled_by_table(yaml, "@NAME@", @NAME@_table(), &check);
}

// The model as the kit's family spec (tessera/nn/family.hpp): what its blocks are. The kit
// builds the blocks this rank holds and derives the rest: the tensor-parallel plan, the shape
// `tessera plan` reads, the parameter and FLOP counts, the init, import and export, pipeline
// stages and fsdp units. Here a Llama-style decoder: pre-norm blocks of RMSNorm -> grouped-query
// attention with rotary positions -> RMSNorm -> SwiGLU, a final RMSNorm and an output head.
tessera::nn::FamilySpec @NAME@_family(const @CLASS@Config& c) {
  tessera::nn::FamilySpec f = tessera::nn::FamilySpec::of("model/@NAME@", c);
  f.rotaries = {{c.head_dim(), c.max_seq_len, c.rope_theta}};
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    tessera::nn::BlockSpec block;  // RMSNorms; a block's attention and SwiGLU MLP:
    block.attention = {c.n_embd, c.n_head, c.n_kv_head, c.head_dim(), false, false, c.dropout};
    block.feed_forward.width = c.intermediate_size;
    f.blocks.push_back(block);
  }
  tessera::nn::describe_by_table(f, @NAME@_table(), c);
  return f;
}
)tpl",
      R"tpl(  // The kit's decoder fields (vocab_size, n_layer, n_head, n_embd, max_seq_len, dropout,
  // init_std, activation checkpointing) come from tessera::nn::DecoderFields; these are the
  // family's own. A small model by default.
  std::int64_t n_kv_head = 2;
  std::int64_t intermediate_size = 128;
  double rope_theta = 10000.0;
  std::string init_from;         // weights to start from: a Hugging Face folder or a Tessera export
  std::set<std::string> given;   // the fields the YAML gave (the others may come from init_from)

  @CLASS@Config() {
    n_layer = 2;
    n_embd = 64;
    max_seq_len = 64;
  }
  std::int64_t head_dim() const { return n_embd / n_head; }

  static void check(const @CLASS@Config& c) {
    tessera::nn::check_grouped_heads(c.n_embd, c.n_head, c.n_kv_head, 0, c.head_dim());
  }
  // What each mesh axis needs of the sizes: refused by `tessera validate` before anything is built.
  static void check_mesh(const @CLASS@Config& c, const tessera::RunContext& run, const @CLASS@Config&) {
    tessera::nn::check_tensor_parallel({c.n_head, c.n_kv_head, c.intermediate_size, c.vocab_size}, run.parallel);
    tessera::nn::check_context_parallel(c.n_head, c.dropout, run.parallel);
    tessera::nn::check_pipeline_parallel(c.n_layer, run.parallel);
  }
  // The YAML's fields with init_from's config.json settled in by the table below.
  static @CLASS@Config settled(const @CLASS@Config& yaml);
)tpl",
      R"tpl(    using C = @CLASS@Config;
    tessera::nn::declare_decoder_fields(f, {});  // and that the model splits over tp, cp and pp
    f.field("n_kv_head", &C::n_kv_head, "key/value heads (divides n_head)").at_least(1);
    f.field("intermediate_size", &C::intermediate_size, "hidden width of the SwiGLU MLP").at_least(1);
    f.field("rope_theta", &C::rope_theta, "base of the rotary frequencies").greater_than(0);
    tessera::nn::declare_init_from<C>(f, "weights to start from: a Hugging Face Llama folder or a Tessera export",
                                      &C::check, &C::settled, &C::check_mesh);
)tpl",
      "  model: {component_key: model, variant_key: @NAME@}\n"};
  t.config_bases = " : tessera::nn::DecoderFields";
  t.factory =
      "[](const @CLASS@Config& config, const tessera::RunContext& run) {\n"
      "        return tessera::nn::build_family(config, run, &@CLASS@Config::settled, &@CLASS@Config::check_mesh,\n"
      "                                         &@NAME@_family);\n      }";
  t.extra_tests = R"tpl(foreach(_mesh "tp2|--set parallelism.tp=2|" "pp2|--set parallelism.pp=2 --set trainer.grad_accum=2|--set trainer.grad_accum=2"
                    "fsdp2|--set parallelism.dp_shard=2 --set components.parallel.component_key=parallel --set components.parallel.variant_key=fsdp|--set trainer.grad_accum=2")
  string(REPLACE "|" ";" _mesh "${_mesh}")
  list(GET _mesh 0 _name)
  list(GET _mesh 1 _sets)
  list(GET _mesh 2 _one)
  add_test(NAME @NAME@_${_name}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_mesh.sh ${TESSERA_EXECUTABLE} ${TESSERA_PLUGIN_OUTPUT_DIR}
                   @NAME@_test.yaml ${CMAKE_CURRENT_BINARY_DIR}/mesh-${_name} "${_sets}" "${_one}"
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
endforeach()
)tpl";
  t.extra_file_name = "check_mesh.sh";
  t.extra_file = R"tpl(#!/bin/sh
# check_mesh.sh TESSERA PLUGINS SPEC OUT "MESH SETS" "ONE-RANK SETS": trains SPEC on one rank and
# on two Gloo ranks with MESH SETS, and fails unless every step's loss agrees within 1e-4.
set -e
tessera=$1 plugins=$2 spec=$3 out=$4 mesh=$5 one=$6
rm -rf "$out"
"$tessera" train "$spec" --plugin-path "$plugins" --run-dir "$out/one" $one
"$tessera" launch --nproc-per-node 2 -- train "$spec" --plugin-path "$plugins" --run-dir "$out/mesh" $mesh
losses() { sed -n 's/.*"loss":\([-0-9.eE+]*\).*/\1/p' "$1/metrics.jsonl"; }
losses "$out/one" >"$out/one.txt"
losses "$out/mesh" >"$out/mesh.txt"
paste "$out/one.txt" "$out/mesh.txt" | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 1e-4) { print "step " n ": one rank " $1 ", two ranks " $2; bad = 1 } }
  END { if (n == 0) { print "no steps"; exit 1 } if (bad) exit 1; print n " steps agree within 1e-4" }'
)tpl";
  return t;
}

}  // namespace tessera::tooling
