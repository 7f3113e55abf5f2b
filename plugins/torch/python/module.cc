// fusebox.torch._C: the pybind11 binding of the DDP hook. The Python package
// (fusebox/torch/__init__.py) is the user-facing edge: it validates
// arguments, reads the environment and creates the process group; this file
// only converts types.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "autotune/policy_cache.h"
#include "comm/backends.h"
#include "plugins/torch/comm_hook.h"
#include "plugins/torch/process_group_communicator.h"
#include "plugins/torch/torch_store.h"
#include "torch/csrc/distributed/c10d/reducer.hpp"
#include "torch/csrc/utils/pybind.h"

namespace py = pybind11;

namespace fusebox::torch_plugin {
namespace {

// Note [Messages into Python logging]
// The hook's messages (the tuner's progress, cache warnings) are produced on
// whatever thread runs the hook: autograd's, a process group's. Taking the
// GIL there could wait on a Python thread that waits on this one, so a
// message is queued here and handed to Python's logging (logger "fusebox")
// by the Python side at its next call: the forward pre-hook that starts
// every step, register() itself, snapshot() and close(). Python's logging
// then filters by level: warnings show by default, the progress at INFO
// (verbose=True or FUSEBOX_LOG_LEVEL=info). The queue is bounded; what does
// not fit is counted and reported with the next message.
class LogQueue {
 public:
  static constexpr size_t kMaxLines = 4096;
  // Python logging levels.
  static constexpr int kInfo = 20;
  static constexpr int kWarning = 30;

  void Push(const std::string& line) {
    const int level = line.find("warning") != std::string::npos ? kWarning : kInfo;
    std::lock_guard<std::mutex> lock(mu_);
    if (lines_.size() >= kMaxLines) {
      ++dropped_;
      return;
    }
    lines_.emplace_back(level, line);
  }
  std::vector<std::pair<int, std::string>> Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<int, std::string>> out;
    out.swap(lines_);
    if (dropped_ > 0) {
      out.emplace_back(kWarning, absl::StrCat(dropped_, " more messages were dropped (more than ",
                                              kMaxLines, " between two steps)"));
      dropped_ = 0;
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<int, std::string>> lines_;
  uint64_t dropped_ = 0;
};

// The Python handle: shares the state (which owns the communicator) with
// DDP's reducer, so the hook keeps working after the handle is gone.
class Hook {
 public:
  Hook(std::shared_ptr<HookState> state, std::shared_ptr<LogQueue> log)
      : state_(std::move(state)), log_(std::move(log)) {}
  HookState& state() { return *state_; }
  LogQueue& log() { return *log_; }
  int rank() const { return state_->comm().rank(); }
  int size() const { return state_->comm().size(); }

 private:
  std::shared_ptr<HookState> state_;
  std::shared_ptr<LogQueue> log_;
};

// absl codes as the Python exceptions a user would catch: a missing file is
// FileNotFoundError, a bad argument ValueError, a peer that never answered
// TimeoutError; the rest RuntimeError. The message is fusebox's, without the
// code's name.
[[noreturn]] void Throw(const absl::Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      type = PyExc_ValueError;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    case absl::StatusCode::kPermissionDenied:
      type = PyExc_PermissionError;
      break;
    case absl::StatusCode::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, std::string(s.message()).c_str());
  throw py::error_already_set();
}

py::dict PlanToDict(const bucketing::Plan& plan) {
  py::list buckets;
  py::list elements;
  for (const bucketing::Bucket& b : plan.buckets) {
    py::list slices;
    for (const bucketing::Slice& s : b.slices) slices.append(py::make_tuple(s.tensor, s.offset, s.count));
    buckets.append(slices);
    elements.append(b.count());
  }
  py::dict d;
  d["name"] = plan.name;
  d["buckets"] = buckets;
  d["bucket_elements"] = elements;
  d["hash"] = absl::StrCat(absl::Hex(bucketing::PlanHash(plan), absl::kZeroPad16));
  return d;
}

py::dict SnapshotToDict(const HookSnapshot& s) {
  py::dict d;
  d["phase"] = HookPhaseName(s.phase);
  d["layout"] = s.layout;
  d["plan"] = s.plan ? py::object(PlanToDict(*s.plan)) : py::object(py::none());
  d["cache_hit"] = s.cache_hit;
  d["derived_from_cache"] = s.derived_from_cache;
  d["tuning_iterations"] = s.tuning_iterations;
  d["names"] = s.names;
  d["tuning_cost_ms"] = s.tuning_cost_ms;
  d["checks"] = s.checks;
  d["fallbacks"] = s.fallbacks;
  d["decision"] = s.decision;
  d["summary"] = s.summary;
  d["hit_check_iterations"] = s.hit_check_iterations;
  d["seed"] = s.seed;
  d["cost_model"] = s.cost_model;
  d["plan_installs"] = s.plan_installs;
  d["iterations"] = s.iterations;
  d["passthrough_iterations"] = s.passthrough_iterations;
  d["cache_key"] = s.cache_key;
  d["backend"] = s.backend;
  d["last_allreduce_counts"] = s.last_allreduce_counts;
  py::list measured;
  for (const autotune::MeasuredPlan& m : s.measured) {
    py::dict e;
    e["name"] = m.name;
    e["hash"] = m.hash;
    e["measured_ms"] = m.measured_us / 1e3;
    // A 95% interval of the median where the samples allow one, else their
    // range (say which: "interval" names it).
    e["ci95_ms"] = py::make_tuple(m.ci_low_us / 1e3, m.ci_high_us / 1e3);
    e["interval"] = m.interval_exact ? "95% CI" : "range";
    e["samples"] = m.samples;
    e["verified"] = m.verified;
    e["screened"] = m.screened;
    e["buckets"] = m.buckets;
    e["predicted_ms"] = m.predicted_us / 1e3;
    measured.append(e);
  }
  d["measured"] = measured;
  d["chosen"] = s.chosen;
  py::list stats;
  for (const bucketing::IterationStats& st : s.stats) {
    py::dict e;
    e["iteration"] = st.iteration;
    e["iteration_ms"] = st.whole_us() / 1e3;  // forward start to the next forward start
    e["backward_ms"] = st.backward_us() / 1e3;
    e["exposed_ms"] = st.exposed_comm_us() / 1e3;
    e["comm_ms"] = st.comm_us / 1e3;
    e["copy_in_ms"] = st.copy_in_us / 1e3;
    e["copy_back_ms"] = st.copy_back_us / 1e3;
    e["buckets"] = st.buckets;
    stats.append(e);
  }
  d["stats"] = stats;
  return d;
}

// The communicator the hook reduces through: `group` itself, or a fusebox
// backend whose rendezvous runs over torch's `store` (ranks numbered as in
// `group`, which then spans the store's job).
absl::StatusOr<std::pair<std::shared_ptr<comm::Communicator>, ProcessGroupCommunicator*>>
MakeCommunicator(py::object group_obj, py::object store_obj, const py::dict& o) {
  auto group = group_obj.cast<c10::intrusive_ptr<::c10d::ProcessGroup>>();
  const std::string kind = o["communicator"].cast<std::string>();
  if (kind == "process_group" || kind == "ddp") {
    auto pg = std::make_shared<ProcessGroupCommunicator>(group);
    ProcessGroupCommunicator* raw = pg.get();
    return std::make_pair(std::shared_ptr<comm::Communicator>(std::move(pg)), raw);
  }
  TorchStoreCommOptions options;
  options.backend = kind;
  options.prefix = "fusebox";
  options.rank = group->getRank();
  options.size = group->getSize();
  options.local_rank = o["local_rank"].cast<int>();
  options.timeout = absl::Seconds(o["timeout_s"].cast<double>());
  // One knob for the hook: rendezvous, each collective and the engine.
  comm::SetCollectiveTimeout(options.timeout, &options.backend_options);
  auto store = store_obj.cast<c10::intrusive_ptr<::c10d::Store>>();
  absl::StatusOr<std::shared_ptr<comm::Communicator>> comm;
  {
    py::gil_scoped_release release;  // a rendezvous: may wait for the other ranks
    comm = CreateCommunicatorOverTorchStore(std::move(store), options);
  }
  if (!comm.ok()) return comm.status();
  return std::make_pair(*std::move(comm), static_cast<ProcessGroupCommunicator*>(nullptr));
}

// TunerOptions::measure_allreduce from a Python callable (sizes, reps) ->
// one time in microseconds per size. The tuner calls it with the GIL
// released (from on_forward_start): it takes the GIL to call, and the
// callable is released under the GIL too (never at interpreter exit).
std::function<absl::StatusOr<std::vector<autotune::AllReduceSample>>(const std::vector<int64_t>&,
                                                                     int)>
MeasureThroughPython(py::object callable) {
  std::shared_ptr<py::object> fn(new py::object(std::move(callable)), [](py::object* p) {
    if (!Py_IsInitialized()) return;  // leaked at exit: no interpreter to release it
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [fn](const std::vector<int64_t>& sizes,
              int reps) -> absl::StatusOr<std::vector<autotune::AllReduceSample>> {
    py::gil_scoped_acquire gil;
    std::vector<double> times;
    int world = 0;
    try {
      py::tuple r = (*fn)(sizes, reps).cast<py::tuple>();
      world = r[0].cast<int>();
      times = r[1].cast<std::vector<double>>();
    } catch (const std::exception& e) {  // py::error_already_set, py::cast_error
      return absl::InternalError(absl::StrCat("measuring the allreduce through DDP's group: ",
                                              e.what()));
    }
    if (times.size() != sizes.size()) {
      return absl::InternalError(absl::StrCat("measuring the allreduce through DDP's group: ",
                                              times.size(), " times for ", sizes.size(),
                                              " sizes"));
    }
    std::vector<autotune::AllReduceSample> samples;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!(std::isfinite(times[i]) && times[i] > 0)) {
        return absl::InternalError(absl::StrCat("measuring the allreduce through DDP's group: ",
                                                "time ", times[i], " us at ", sizes[i],
                                                " bytes is not a positive number"));
      }
      samples.push_back({world, sizes[i], times[i]});
    }
    return samples;
  };
}

std::unique_ptr<Hook> Register(py::object reducer_obj, py::object group_obj, py::dict o,
                               py::object store_obj, std::vector<at::Tensor> params,
                               std::vector<std::string> names) {
  auto reducer = reducer_obj.cast<std::shared_ptr<::c10d::Reducer>>();
  auto made = MakeCommunicator(group_obj, store_obj, o);
  if (!made.ok()) Throw(made.status());
  std::shared_ptr<comm::Communicator> comm = made->first;
  ProcessGroupCommunicator* pg_comm = made->second;
  HookOptions options;
  options.fixed_plan = o["plan"].cast<std::string>();
  options.cache_dir = o["cache_dir"].cast<std::string>();
  options.tuner.network = o["network"].cast<std::string>();
  options.tuner.ranks_per_node = o["ranks_per_node"].cast<int>();
  options.tuner.model_label = o["model_label"].cast<std::string>();
  // The backend family of the cache key ("unknown": the communicator's).
  if (o.contains("backend")) options.tuner.backend = o["backend"].cast<std::string>();
  options.tuner.candidates = o["candidates"].cast<int>();
  options.tuner.candidates_when_derived = std::min(options.tuner.candidates, 1);
  options.tuner.screening_blocks = o["screening_blocks"].cast<int>();
  options.tuner.verify_pairs = o["verify_pairs"].cast<int>();
  options.tuner.check_every = o["check_every"].cast<int>();
  options.tuner.check_pairs = o["check_pairs"].cast<int>();
  // register's min_effect: the gain a candidate must show to replace the
  // user's buckets (the rule's minimum gain).
  options.tuner.rule.min_gain = o["min_effect"].cast<double>();
  // The user's own DDP: the baseline and the fallback.
  if (o.contains("baseline_cap_bytes")) {
    options.tuner.baseline_cap_bytes = o["baseline_cap_bytes"].cast<int64_t>();
    options.tuner.baseline_first_bucket_bytes = o["baseline_first_bucket_bytes"].cast<int64_t>();
  }
  if (o.contains("seed")) options.tuner.seed = o["seed"].cast<uint64_t>();
  if (o.contains("measure_allreduce") && !o["measure_allreduce"].is_none()) {
    options.tuner.measure_allreduce = MeasureThroughPython(o["measure_allreduce"]);
    options.tuner.measured_on = o["measured_on"].cast<std::string>();
  }
  options.tuner.wall_clock_s = [] { return absl::ToUnixSeconds(absl::Now()); };
  options.engine.max_in_flight = o["max_in_flight"].cast<int>();
  options.engine.timeout = absl::Seconds(o["timeout_s"].cast<double>());
  options.engine.record_timeline = o["timeline"].cast<bool>();
  // Note [Messages into Python logging].
  auto log = std::make_shared<LogQueue>();
  options.log = [log](const std::string& line) { log->Push(line); };
  absl::StatusOr<std::shared_ptr<HookState>> state =
      o["communicator"].cast<std::string>() == "ddp"
          ? RegisterDdpBuckets(*reducer, std::move(params), std::move(names), comm,
                               std::move(options))
          : RegisterCommHook(*reducer, std::move(params), std::move(names), comm, pg_comm,
                             std::move(options));
  if (!state.ok()) Throw(state.status());
  return std::make_unique<Hook>(*std::move(state), std::move(log));
}

}  // namespace
}  // namespace fusebox::torch_plugin

PYBIND11_MODULE(_C, m) {
  using fusebox::torch_plugin::Hook;
  m.doc() = "fusebox DDP communication hook (internal; use fusebox.torch.register)";
  m.def("_default_cache_dir", [] {
    return fusebox::autotune::DefaultCacheDir(std::getenv("FUSEBOX_CACHE_DIR"),
                                              std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"));
  });
  py::class_<Hook>(m, "_Hook")
      .def("drain_log", [](Hook& h) { return h.log().Drain(); })
      .def("snapshot",
           [](Hook& h) { return fusebox::torch_plugin::SnapshotToDict(h.state().Snapshot()); })
      .def("write_timeline",
           [](Hook& h, const std::string& path) {
             absl::Status s = h.state().WriteTimeline(path);
             if (!s.ok()) fusebox::torch_plugin::Throw(s);
           })
      .def("on_forward_start",
           [](Hook& h) {
             absl::Status s;
             {
               py::gil_scoped_release release;  // collective: may wait for the other ranks
               s = h.state().OnForwardStart();
             }
             if (!s.ok()) fusebox::torch_plugin::Throw(s);
           })
      .def("on_grad_ready", [](Hook& h, int param) { h.state().OnGradReady(param); })
      .def("grad_hooks", [](Hook& h) { return h.state().GradHooks(); })
      .def("last_ready_param", [](Hook& h) { return h.state().LastReadyParam(); })
      .def("on_backward_end", [](Hook& h) { h.state().OnBackwardEnd(); })
      .def("times_next_boundary", [](Hook& h) { return h.state().TimesNextBoundary(); })
      .def("summary_line", [](Hook& h) { return h.state().SummaryLine(); })
      .def("plan_hash", [](Hook& h) { return h.state().PlanHash(); })
      .def("exclude_from_step",
           [](Hook& h, double us) {
             absl::Status s = h.state().ExcludeFromStep(us);
             if (!s.ok()) fusebox::torch_plugin::Throw(s);
           })
      .def(
          "_force_plan",
          [](Hook& h, const std::string& spec, bool checks) {
            absl::Status s = h.state().ForcePlan(spec, checks);
            if (!s.ok()) fusebox::torch_plugin::Throw(s);
          },
          py::arg("spec"), py::arg("checks") = true)
      .def_property_readonly("rank", &Hook::rank)
      .def_property_readonly("world_size", &Hook::size);
  m.def("_register", &fusebox::torch_plugin::Register, py::arg("reducer"), py::arg("group"),
        py::arg("options"), py::arg("store"), py::arg("params"), py::arg("names"));
}
