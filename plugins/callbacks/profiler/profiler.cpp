// Callback `profiler`: records a window of optimizer steps on chosen ranks and writes it as a
// Chrome trace (chrome://tracing, Perfetto, TensorBoard's profiler view): LibTorch's Kineto
// profiler with every ATen op and, on a GPU, every kernel; or, where this LibTorch has no Kineto,
// the step's phases as seen from the callback events.
#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/error.hpp"
#include "tessera/log.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace fs = std::filesystem;
namespace kineto_api = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

// Whether the loaded LibTorch carries Kineto. torch::profiler::kKinetoAvailable cannot say: it
// follows USE_KINETO at our compile time, which the wheel's CMake package does not define (and
// its header needs torch/include/kineto). So look in the library that defines the profiler API
// for Kineto's entry point, libkineto::api().
bool kineto_available() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&kineto_api::disableProfiler), &info) == 0 ||
      info.dli_fname == nullptr) {
    return false;
  }
  void* library = ::dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return false;
  const bool found = ::dlsym(library, "_ZN9libkineto3apiEv") != nullptr;
  ::dlclose(library);
  return found;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string step_range_name(std::int64_t step) { return "ProfilerStep#" + std::to_string(step); }

struct ProfilerConfig {
  std::int64_t start_step = 5;
  std::int64_t steps = 2;
  std::vector<std::int64_t> ranks{0};
  std::string dir = "profiles";
  std::string backend = "auto";
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;

  static void declare(tessera::ConfigFields<ProfilerConfig>& f) {
    using C = ProfilerConfig;
    f.field("start_step", &C::start_step, "first profiled optimizer step (1-based)").at_least(1);
    f.field("steps", &C::steps, "number of steps profiled").at_least(1);
    f.field("ranks", &C::ranks, "ranks that profile");
    f.field("dir", &C::dir, "output folder, relative to the run directory unless absolute");
    f.field("backend", &C::backend, "kineto: LibTorch's profiler; phases: the step's phases; auto: kineto where available")
        .one_of({"auto", "kineto", "phases"});
    f.field("record_shapes", &C::record_shapes, "kineto: record operator input shapes");
    f.field("profile_memory", &C::profile_memory, "kineto: record tensor allocations");
    f.field("with_stack", &C::with_stack, "kineto: record source stacks of operators");
    f.check([](const C& c) {
      if (c.backend == "kineto" && !kineto_available()) {
        throw tessera::ConfigError("Kineto is not available in this LibTorch; use backend: phases (or auto)", "backend");
      }
    });
  }
};

class Profiler final : public tessera::Callback {
 public:
  Profiler(const ProfilerConfig& config, const tessera::RunContext& run)
      : config_(config),
        dir_(tessera::in_run_dir(run, config.dir)),
        kineto_(config.backend == "kineto" || (config.backend == "auto" && kineto_available())) {}

  ~Profiler() override {
    // A window still open (no train end or exception event came): leave LibTorch unprofiled.
    if (active_ && kineto_) {
      step_range_.reset();
      try {
        kineto_api::disableProfiler();
      } catch (const std::exception&) {  // nothing to report to at teardown
      }
    }
  }

  void on_train_begin(tessera::CallbackContext& ctx) override {
    selected_ = std::find(config_.ranks.begin(), config_.ranks.end(), ctx.run.rank) != config_.ranks.end();
  }

  void on_step_begin(tessera::CallbackContext& ctx) override {
    if (!selected_) return;
    const std::int64_t step = ctx.progress.step + 1;  // the step about to run, 1-based
    if (!active_ && step == config_.start_step && !done_) start(ctx);
    if (!active_) return;
    step_ = step;
    step_begin_us_ = phase_begin_us_ = now_us();
    optimizer_begin_us_.reset();
    if (kineto_) {
      // A user range over the whole step, as torch.profiler's schedule marks steps, so the
      // trace shows exactly which work belongs to which step.
      step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
      if (step_range_->isActive()) step_range_->before(step_range_name(step));
    }
  }

  void on_micro_batch_end(tessera::CallbackContext&, const tessera::MicroBatchEnd& mb) override {
    if (!active_ || step_ == 0 || kineto_) return;
    const double now = now_us();
    // The trainer draws every micro-batch before the first forward, so the first span also
    // holds the step's data loading.
    span("data + forward/backward (micro-batch " + std::to_string(mb.index) + ")", phase_begin_us_,
         now, "phase");
    phase_begin_us_ = now;
  }

  void on_before_optimizer_step(tessera::CallbackContext&, const tessera::BeforeOptimizerStep&) override {
    if (!active_ || step_ == 0 || kineto_) return;
    const double now = now_us();
    span("finish gradients (reduce, norm)", phase_begin_us_, now, "phase");
    optimizer_begin_us_ = now;
  }

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (!active_ || step_ == 0 || m.step != step_) return;
    end_step();
    if (step_recorded_ >= config_.start_step + config_.steps - 1) stop();
  }

  // Training ended inside the window: keep what was recorded.
  void on_train_end(tessera::CallbackContext& ctx) override {
    if (!active_) return;
    end_step();
    stop();
  }
  void on_exception(tessera::CallbackContext& ctx, const std::string&) override {
    if (!active_) return;
    end_step();
    stop();
  }

 private:
  void start(const tessera::CallbackContext& ctx) {
    rank_ = ctx.run.rank;
    if (kineto_) {
      std::set<ActivityType> activities{ActivityType::CPU};
      if (ctx.run.device.rfind("cuda", 0) == 0) {
        activities.insert(ActivityType::CUDA);
        cuda_device_ = c10::Device(ctx.run.device);
      }
      const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                         config_.record_shapes, config_.profile_memory, config_.with_stack);
      try {
        kineto_api::prepareProfiler(config, activities);
        kineto_api::enableProfiler(config, activities);
      } catch (const std::exception& e) {
        // Profiling must never end a training run (e.g. another profiler is already on).
        tessera::log::warn("profiler: could not start Kineto: ", e.what());
        done_ = true;
        return;
      }
    } else {
      events_ = nlohmann::json::array();
      metadata("process_name", {{"name", "rank " + std::to_string(rank_)}});
      metadata("thread_name", {{"name", "training loop"}});
    }
    active_ = true;
    tessera::log::info("profiler: recording steps ", config_.start_step, "-", config_.start_step + config_.steps - 1,
                       " (", kineto_ ? "kineto" : "phases", ")");
  }

  // Closes the step in progress, if any.
  void end_step() {
    if (step_ == 0) return;
    const double now = now_us();
    if (kineto_) {
      if (step_range_) step_range_->end();
      step_range_.reset();
    } else {
      if (optimizer_begin_us_) span("optimizer", *optimizer_begin_us_, now, "phase");
      span("step " + std::to_string(step_), step_begin_us_, now, "step");
      span(step_range_name(step_), step_begin_us_, now, "user_annotation");
    }
    step_recorded_ = step_;
    step_ = 0;
  }

  void stop() {
    active_ = false;
    done_ = true;
    const fs::path path = dir_ / ("rank_" + std::to_string(rank_)) /
                          ("trace_steps_" + std::to_string(config_.start_step) + "-" +
                           std::to_string(std::max(step_recorded_, config_.start_step)) + ".json");
    try {
      std::unique_ptr<kineto_api::ProfilerResult> result;
      // The last step's kernels may still be queued: Kineto keeps only the GPU activity that
      // finished before it stops, so wait for the device first.
      // A failed wait (the run is ending on a CUDA error) must not keep the profiler on.
      if (kineto_ && cuda_device_) {
        try {
          c10::impl::getDeviceGuardImpl(c10::kCUDA)->synchronizeDevice(cuda_device_->has_index() ? cuda_device_->index() : 0);
        } catch (const std::exception& e) {
          tessera::log::warn("profiler: could not wait for ", cuda_device_->str(), ": ", e.what());
        }
      }
      if (kineto_) result = kineto_api::disableProfiler();  // first: whatever happens next
      fs::create_directories(path.parent_path());
      if (result) {
        result->save(path.string());
      } else if (!kineto_) {
        std::ofstream out(path, std::ios::out | std::ios::trunc);
        out << nlohmann::json{{"traceEvents", std::move(events_)}, {"displayTimeUnit", "ms"}}.dump();
        if (!out) throw tessera::Error("cannot write " + path.string());
      }
    } catch (const std::exception& e) {
      tessera::log::warn("profiler: could not write ", path.string(), ": ", e.what());
      return;
    }
    tessera::log::info("profiler: wrote ", path.string());
  }

  // A complete ("X") event of the Chrome trace format; times in microseconds.
  void span(const std::string& name, double begin_us, double end_us, const char* category) {
    events_.push_back({{"name", name},
                       {"cat", category},
                       {"ph", "X"},
                       {"ts", begin_us},
                       {"dur", std::max(0.0, end_us - begin_us)},
                       {"pid", rank_},
                       {"tid", 0},
                       {"args", {{"step", step_}}}});
  }

  void metadata(const char* what, nlohmann::json args) {
    events_.push_back({{"name", what}, {"ph", "M"}, {"pid", rank_}, {"tid", 0}, {"args", std::move(args)}});
  }

  const ProfilerConfig config_;
  fs::path dir_;  // config_.dir inside the run directory
  bool kineto_ = false;

  bool selected_ = false;  // this rank is in `ranks`
  bool active_ = false;    // the window is being recorded
  bool done_ = false;      // the window was recorded (once per run)
  std::int64_t rank_ = 0;
  std::optional<c10::Device> cuda_device_;  // set when Kineto records CUDA activity
  std::int64_t step_ = 0;           // the step in progress inside the window; 0 between steps
  std::int64_t step_recorded_ = 0;  // the last step closed inside the window
  std::unique_ptr<at::RecordFunction> step_range_;
  double step_begin_us_ = 0, phase_begin_us_ = 0;
  std::optional<double> optimizer_begin_us_;
  nlohmann::json events_ = nlohmann::json::array();
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, ProfilerConfig>(
      "profiler", "Chrome trace of a window of steps on chosen ranks (Kineto, or the step phases)",
      [](const ProfilerConfig& c, const tessera::RunContext& run) { return std::make_shared<Profiler>(c, run); });
}

}  // namespace

TESSERA_PLUGIN("callback_profiler", "0.1.0", register_components)
