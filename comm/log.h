// Messages with a level, for fusebox's tools and whatever else prints.
//
//   LogLevel level = ResolveLogLevel(absl::GetFlag(FLAGS_log_level),
//                                    std::getenv("FUSEBOX_LOG_LEVEL")).value();
//   Logger log("fusebox-perf", level);
//   log.set_rank(rank);                  // once the rendezvous has named it
//   log.Warning("the cache is not writable");   // fusebox-perf (rank 1): warning: ...
//   options.warn = log.At(LogLevel::kWarning);  // a library's callback
//
// A Logger is a value: the tool builds one at its edge from its flag and the
// environment and hands it (or callbacks made from it) inward. There is no
// process-wide level. Libraries keep taking callbacks (`warn`, `log`,
// `progress`) and never read the environment.
//
// Levels, most severe first: error, warning (the default), info, debug. A
// logger shows its level and everything more severe, so warnings show
// unless the user asked for errors only.
#ifndef FUSEBOX_COMM_LOG_H_
#define FUSEBOX_COMM_LOG_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusebox::comm {

enum class LogLevel : int { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// "error", "warning" (or "warn"), "info", "debug", any case. InvalidArgument
// names the accepted words.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
absl::string_view LogLevelName(LogLevel level);

// The level a tool runs at: `flag` when not empty (the level flag the user
// gave, spelt `flag_name` in errors), else `env` when set and not empty
// (FUSEBOX_LOG_LEVEL), else warning. The error names which of the two did
// not parse.
absl::StatusOr<LogLevel> ResolveLogLevel(absl::string_view flag, const char* env,
                                         absl::string_view flag_name = "--log_level");

class Logger {
 public:
  // Receives each shown line, newline included. The default writes it to
  // stderr in one call, so lines of concurrent threads do not interleave.
  using Sink = std::function<void(const std::string& line)>;

  explicit Logger(std::string tool, LogLevel level = LogLevel::kWarning, Sink sink = nullptr);

  // Lines say "(rank R)" after the tool's name from now on; -1: no rank.
  void set_rank(int rank) { rank_ = rank; }
  LogLevel level() const { return level_; }
  bool Enabled(LogLevel level) const { return level <= level_; }

  // "<tool>[ (rank R)]: <level>: <message>\n", the level word left out for
  // errors (the exit status says it); nothing when the level is not shown.
  void Log(LogLevel level, absl::string_view message) const;
  void Error(absl::string_view message) const { Log(LogLevel::kError, message); }
  void Warning(absl::string_view message) const { Log(LogLevel::kWarning, message); }
  void Info(absl::string_view message) const { Log(LogLevel::kInfo, message); }
  void Debug(absl::string_view message) const { Log(LogLevel::kDebug, message); }

  // A callback that logs each message at `level` through a copy of this
  // logger (as it is now), for options such as PolicyCacheOptions::warn.
  std::function<void(const std::string&)> At(LogLevel level) const;

 private:
  std::string tool_;
  LogLevel level_;
  Sink sink_;
  int rank_ = -1;
};

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_LOG_H_
