// `tessera plan SPEC --ranks N [--device-memory GiB] [--json]`: the meshes the spec can run on
// over N ranks, what each rank holds and moves per step, ranked (core/src/plan/).
#include <boost/program_options.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "tessera/core/config/field_reader.hpp"
#include "tessera/core/plan/mesh_plan.hpp"

namespace po = boost::program_options;

namespace tessera::cli {
namespace {

std::string gib(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  } else if (bytes >= 1024.0 * 1024) {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  }
  return text;
}

std::string mesh_name(const core::PlannedMesh& mesh) {
  std::string name = mesh.dims.describe();
  if (mesh.dims.cp > 1) name += " (" + mesh.dims.cp_type + ")";
  if (mesh.dims.pp > 1) name += " (" + mesh.dims.pp_schedule + ")";
  return name;
}

nlohmann::json to_json(const core::PlanResult& result, std::int64_t ranks, double device_memory) {
  nlohmann::json out;
  out["ranks"] = ranks;
  out["model"] = result.model;
  out["device_memory_bytes"] = device_memory;
  out["model_parallel_traffic_planned"] = result.model_describes_shape;
  out["meshes"] = nlohmann::json::array();
  for (const auto& mesh : result.meshes) {
    nlohmann::json m;
    const auto& d = mesh.dims;
    m["mesh"] = {{"pp", d.pp},           {"dp_replicate", d.dp_replicate}, {"dp_shard", d.dp_shard},
                 {"cp", d.cp},           {"tp", d.tp},                     {"ep", d.ep},
                 {"sequence_parallel", d.sequence_parallel}, {"cp_type", d.cp_type},
                 {"pp_schedule", d.pp_schedule},             {"pp_stages_per_rank", d.pp_stages_per_rank}};
    m["name"] = mesh_name(mesh);
    m["strategy"] = mesh.strategy;
    m["fits"] = mesh.fits;
    m["spec_mesh"] = mesh.spec_mesh;
    m["bubble"] = mesh.bubble;
    const core::PlannedMemory largest = mesh.largest();
    m["largest"] = {{"parameter_bytes", largest.parameters},    {"reference_bytes", largest.reference},
                    {"gradient_bytes", largest.gradients},
                    {"optimizer_bytes", largest.optimizer_state}, {"activation_bytes", largest.activations},
                    {"total_bytes", mesh.largest_total()},          {"communicated_bytes", mesh.largest_communicated()}};
    m["ranks"] = nlohmann::json::array();
    for (const auto& r : mesh.ranks) {
      nlohmann::json rank = {{"rank", r.rank},
                             {"parameter_bytes", r.memory.parameters},
                             {"reference_bytes", r.memory.reference},
                             {"gradient_bytes", r.memory.gradients},
                             {"optimizer_bytes", r.memory.optimizer_state},
                             {"activation_bytes", r.memory.activations},
                             {"communicated_bytes", r.communicated_total()}};
      for (const auto& [group, bytes] : r.communicated) rank["communicated_bytes/" + group] = bytes;
      m["ranks"].push_back(rank);
    }
    out["meshes"].push_back(m);
  }
  out["refused"] = result.rejected;
  return out;
}

void print_table(const core::PlanResult& result, std::int64_t ranks, double device_memory) {
  std::cout << result.model << " on " << ranks << " ranks: " << result.meshes.size() << " meshes";
  if (!result.rejected.empty()) std::cout << " (" << result.rejected.size() << " more refused by validation, --json lists why)";
  std::cout << "; per rank, the largest" << (device_memory > 0 ? ", against " + gib(device_memory) : std::string()) << "\n";
  std::size_t width = 6;
  for (const auto& mesh : result.meshes) width = std::max(width, mesh_name(mesh).size() + 3);
  const int name_width = static_cast<int>(width);
  std::cout << std::left << std::setw(4) << "#" << std::setw(name_width) << "mesh" << std::setw(9) << "strategy" << std::setw(5)
            << "fits" << std::right << std::setw(12) << "parameters" << std::setw(12) << "gradients" << std::setw(12)
            << "optimizer" << std::setw(13) << "activations" << std::setw(12) << "total" << std::setw(14)
            << "moved/step" << std::setw(8) << "bubble" << "\n";
  int index = 0;
  for (const auto& mesh : result.meshes) {
    const core::PlannedMemory m = mesh.largest();
    char bubble[16];
    std::snprintf(bubble, sizeof bubble, "%.3f", mesh.bubble);
    std::cout << std::left << std::setw(4) << ++index << std::setw(name_width) << (mesh.spec_mesh ? "*" : "") + mesh_name(mesh) << std::setw(9)
              << mesh.strategy << std::setw(5) << (mesh.fits ? "yes" : "no") << std::right << std::setw(12)
              << gib(m.parameters + m.reference) << std::setw(12) << gib(m.gradients) << std::setw(12) << gib(m.optimizer_state)
              << std::setw(13) << gib(m.activations) << std::setw(12) << gib(mesh.largest_total()) << std::setw(14)
              << gib(mesh.largest_communicated()) << std::setw(8) << bubble << "\n";
  }
  for (const auto& mesh : result.meshes) {
    if (mesh.spec_mesh) std::cout << "* the spec's own parallelism: section\n";
  }
  if (!result.meshes.empty() && result.meshes.front().largest().reference > 0) {
    std::cout << "parameters include the loss's reference model, a frozen copy of the starting weights\n";
  }
  if (!result.model_describes_shape) {
    std::cout << "note: " << result.model << " does not describe its shape (Model::transformer_shape): the bytes "
              << "tp, cp, ep and pp move are not counted, nor its activations\n";
  }
}

}  // namespace

int plan_command(const Args& args) {
  core::PlanRequest request;
  request.ranks = 0;
  double device_memory_gib = 0;
  bool json = false;
  po::options_description visible(
      "usage: tessera plan CONFIG --ranks N [options]\n\n"
      "The meshes CONFIG can run on over N ranks: per rank the bytes of parameters, gradients,\n"
      "optimizer state and activations, the bytes moved per step and the pipeline bubble, best first.\n\n"
      "options");
  visible.add_options()
      ("ranks", po::value<std::int64_t>(&request.ranks)->value_name("N"), "the number of ranks (GPUs) to plan for (required)")
      ("device-memory", po::value<double>(&device_memory_gib)->value_name("GiB"),
       "each device's memory in GiB: meshes whose largest rank needs more are marked as not fitting")
      ("json", po::bool_switch(&json), "print the plan as one JSON document (every rank and group)")
      ("set", po::value<std::vector<std::string>>(&request.run.overrides)->composing(),
       "override a value: --set trainer.grad_accum=8 (VALUE is YAML)")
      ("plugin-path", po::value<std::vector<std::string>>(&request.run.plugin_paths)->composing(),
       "also search DIR for plugins (after the spec's plugins.paths)")
      ("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("config", po::value<std::string>(&request.run.config_path));
  po::positional_options_description positional;
  positional.add("config", 1);
  if (!parse_command_line(args, visible, hidden, positional)) return 0;
  if (request.run.config_path.empty()) throw UsageError("missing CONFIG (a run spec YAML file)");
  if (request.ranks < 1) throw UsageError("--ranks must be at least 1 (the number of ranks to plan for)");
  if (request.ranks > core::kMaxPlannedRanks) {
    throw UsageError("--ranks must be at most " + std::to_string(core::kMaxPlannedRanks));
  }
  if (device_memory_gib < 0) throw UsageError("--device-memory must not be negative (GiB; 0: not given)");
  request.device_memory_bytes = device_memory_gib * 1024.0 * 1024.0 * 1024.0;
  // A plan is for a cluster elsewhere: the data need not be on this machine.
  core::set_path_checks(false);
  const core::PlanResult result = core::plan_meshes(request);
  if (json) {
    std::cout << to_json(result, request.ranks, request.device_memory_bytes).dump(1) << "\n";
  } else {
    print_table(result, request.ranks, request.device_memory_bytes);
  }
  return 0;
}

}  // namespace tessera::cli
