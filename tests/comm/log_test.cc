#include "comm/log.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LogLevelTest, ParsesEveryLevelInAnyCase) {
  EXPECT_EQ(ParseLogLevel("error").value(), LogLevel::kError);
  EXPECT_EQ(ParseLogLevel("WARNING").value(), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel("warn").value(), LogLevel::kWarning);
  EXPECT_EQ(ParseLogLevel(" Info ").value(), LogLevel::kInfo);
  EXPECT_EQ(ParseLogLevel("debug").value(), LogLevel::kDebug);
  for (LogLevel l : {LogLevel::kError, LogLevel::kWarning, LogLevel::kInfo, LogLevel::kDebug}) {
    EXPECT_EQ(ParseLogLevel(LogLevelName(l)).value(), l);
  }
  absl::StatusOr<LogLevel> bad = ParseLogLevel("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'verbose'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("error, warning, info or debug"));
  EXPECT_FALSE(ParseLogLevel("").ok());
}

TEST(LogLevelTest, TheFlagWinsOverTheEnvironmentAndWarningIsTheDefault) {
  EXPECT_EQ(ResolveLogLevel("", nullptr).value(), LogLevel::kWarning);
  EXPECT_EQ(ResolveLogLevel("", "").value(), LogLevel::kWarning);
  EXPECT_EQ(ResolveLogLevel("", "debug").value(), LogLevel::kDebug);
  EXPECT_EQ(ResolveLogLevel("error", "debug").value(), LogLevel::kError);
  // A bad environment does not matter when the flag decides.
  EXPECT_EQ(ResolveLogLevel("info", "loud").value(), LogLevel::kInfo);
  absl::StatusOr<LogLevel> env = ResolveLogLevel("", "loud");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("FUSEBOX_LOG_LEVEL: 'loud'"));
  EXPECT_NE(ResolveLogLevel("loud", nullptr, "--log-level").status().message().find(
                "--log-level: "),
            std::string::npos);
  absl::StatusOr<LogLevel> flag = ResolveLogLevel("loud", "info");
  ASSERT_FALSE(flag.ok());
  EXPECT_THAT(flag.status().message(), HasSubstr("--log_level: 'loud'"));
}

struct Captured {
  std::vector<std::string> lines;
  Logger::Sink sink() {
    return [this](const std::string& line) { lines.push_back(line); };
  }
};

void LogOneOfEach(const Logger& log) {
  log.Error("e");
  log.Warning("w");
  log.Info("i");
  log.Debug("d");
}

TEST(LoggerTest, ShowsItsLevelAndEverythingMoreSevere) {
  Captured warning, error, info, debug;
  LogOneOfEach(Logger("t", LogLevel::kWarning, warning.sink()));
  LogOneOfEach(Logger("t", LogLevel::kError, error.sink()));
  LogOneOfEach(Logger("t", LogLevel::kInfo, info.sink()));
  LogOneOfEach(Logger("t", LogLevel::kDebug, debug.sink()));
  EXPECT_THAT(error.lines, ElementsAre("t: e\n"));
  EXPECT_THAT(warning.lines, ElementsAre("t: e\n", "t: warning: w\n"));
  EXPECT_THAT(info.lines, ElementsAre("t: e\n", "t: warning: w\n", "t: info: i\n"));
  EXPECT_THAT(debug.lines,
              ElementsAre("t: e\n", "t: warning: w\n", "t: info: i\n", "t: debug: d\n"));
  EXPECT_TRUE(Logger("t", LogLevel::kInfo).Enabled(LogLevel::kWarning));
  EXPECT_FALSE(Logger("t", LogLevel::kInfo).Enabled(LogLevel::kDebug));
}

TEST(LoggerTest, NamesTheRankOnceKnownAndCallbacksLogAtTheirLevel) {
  Captured c;
  Logger log("fusebox-perf", LogLevel::kInfo, c.sink());
  log.Warning("before the rendezvous");
  log.set_rank(3);
  log.Warning("after it");
  std::function<void(const std::string&)> warn = log.At(LogLevel::kWarning);
  std::function<void(const std::string&)> debug = log.At(LogLevel::kDebug);
  warn("from a library");
  debug("not shown at info");
  EXPECT_THAT(c.lines, ElementsAre("fusebox-perf: warning: before the rendezvous\n",
                                   "fusebox-perf (rank 3): warning: after it\n",
                                   "fusebox-perf (rank 3): warning: from a library\n"));
}

}  // namespace
}  // namespace fusebox::comm
