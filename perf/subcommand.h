// What fusebox-perf's subcommands share (perf/main.cc dispatches to them):
// the flags both read (-n, -w, --json, --backend, --timeout_s and the UCX
// settings, defined in perf/subcommand.cc), the checks of a thread's
// scheduling flags, and the communicator they run on. Flags and the
// environment are read here and in the subcommands' files only: the edge
// of the perf tool.
#ifndef FUSEBOX_PERF_SUBCOMMAND_H_
#define FUSEBOX_PERF_SUBCOMMAND_H_

#include <functional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/backends.h"
#include "comm/log.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(int, n);
ABSL_DECLARE_FLAG(int, w);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, json);

namespace fusebox::perf {

// fusebox-perf allreduce and fusebox-perf overlap: the exit status (0, 1
// when a rank failed or a result was wrong, 2 for bad flags).
int AllReduceMain(const comm::Logger& log, int argc, char** argv);
int OverlapMain(const comm::Logger& log, int argc, char** argv);

// A thread's nice value from --`flag`: in [-20, 19].
absl::StatusOr<int> NiceFromFlag(const char* flag, int nice);

// A thread's requested scheduler slice from --`flag`, in microseconds: in
// [0, 100000] (0: the kernel's default).
absl::StatusOr<absl::Duration> SliceFromFlag(const char* flag, double us);

// Logs the error (naming the rank once the rendezvous has) and returns 1.
int Fail(const comm::Logger& log, const absl::Status& s);

// Writes `j` to `path` (a subcommand's --json); 0, or Fail's 1 when it
// cannot.
int WriteJson(const comm::Logger& log, const std::string& path, const nlohmann::json& j);

// Connects to the launcher (fusebox-run, torchrun, mpirun or none), creates
// the --backend communicator, runs `body` with it and shuts the launch down.
// Returns body's exit status, 2 for bad backend flags, 1 when setting up
// fails.
int WithCommunicator(
    comm::Logger log, int argc, char** argv,
    const std::function<int(comm::Communicator&, comm::Launch&, const comm::Logger&)>& body);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_SUBCOMMAND_H_
