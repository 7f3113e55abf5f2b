#include "comm/log.h"

#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace fusebox::comm {

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  const std::string word = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (word == "error") return LogLevel::kError;
  if (word == "warning" || word == "warn") return LogLevel::kWarning;
  if (word == "info") return LogLevel::kInfo;
  if (word == "debug") return LogLevel::kDebug;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a log level (error, warning, info or debug)"));
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

absl::StatusOr<LogLevel> ResolveLogLevel(absl::string_view flag, const char* env,
                                         absl::string_view flag_name) {
  if (!flag.empty()) {
    absl::StatusOr<LogLevel> l = ParseLogLevel(flag);
    if (!l.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag_name, ": ", l.status().message()));
    }
    return l;
  }
  if (env != nullptr && *env != '\0') {
    absl::StatusOr<LogLevel> l = ParseLogLevel(env);
    if (!l.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("FUSEBOX_LOG_LEVEL: ", l.status().message()));
    }
    return l;
  }
  return LogLevel::kWarning;
}

Logger::Logger(std::string tool, LogLevel level, Sink sink)
    : tool_(std::move(tool)), level_(level), sink_(std::move(sink)) {}

void Logger::Log(LogLevel level, absl::string_view message) const {
  if (!Enabled(level)) return;
  std::string line = tool_;
  if (rank_ >= 0) absl::StrAppend(&line, " (rank ", rank_, ")");
  absl::StrAppend(&line, ": ");
  if (level != LogLevel::kError) absl::StrAppend(&line, LogLevelName(level), ": ");
  absl::StrAppend(&line, message, "\n");
  if (sink_) {
    sink_(line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
}

std::function<void(const std::string&)> Logger::At(LogLevel level) const {
  return [self = *this, level](const std::string& message) { self.Log(level, message); };
}

}  // namespace fusebox::comm
