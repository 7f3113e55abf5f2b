#include "tools/launcher.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

absl::StatusOr<LaunchOptions> Parse(std::vector<std::string> args) {
  return ParseLaunchArgs(args);
}

std::string ParseError(std::vector<std::string> args) {
  auto options = ParseLaunchArgs(args);
  EXPECT_FALSE(options.ok());
  if (options.ok()) return "";
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(options.status().message());
}

TEST(LauncherTest, ParsesCommandAfterDoubleDash) {
  auto options = Parse({"-n", "4", "--", "prog", "--flag", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->nproc, 4);
  EXPECT_THAT(options->command, ElementsAre("prog", "--flag", "x"));
  EXPECT_FALSE(options->help);
}

TEST(LauncherTest, DefaultsMatchTheDocumentation) {
  auto options = Parse({"-n", "1", "prog"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->master_addr, "127.0.0.1");
  EXPECT_EQ(options->master_port, 0);
  EXPECT_EQ(options->output, OutputMode::kPrefix);
  EXPECT_EQ(options->timeout, absl::InfiniteDuration());
  EXPECT_EQ(options->grace, absl::Seconds(5));
  EXPECT_THAT(options->env, IsEmpty());
}

TEST(LauncherTest, StopsAtFirstNonOption) {
  // The command's own options, even ones that look like ours, pass through.
  auto options = Parse({"-n", "2", "prog", "-n", "7", "--nproc", "9", "--"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->nproc, 2);
  EXPECT_THAT(options->command,
              ElementsAre("prog", "-n", "7", "--nproc", "9", "--"));
}

TEST(LauncherTest, KeepsDoubleDashAfterTheFirstOne) {
  auto options = Parse({"-n", "1", "--", "--", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->command, ElementsAre("--", "x"));
}

TEST(LauncherTest, AcceptsEveryNprocSpelling) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"-n", "3", "p"},
                                             {"-n3", "p"},
                                             {"-np", "3", "p"},
                                             {"--nproc", "3", "p"},
                                             {"--nproc=3", "p"},
                                             {"--nproc-per-node", "3", "p"},
                                             {"--nproc_per_node", "3", "p"},
                                             {"--nproc_per_node=3", "p"}}) {
    auto options = Parse(args);
    ASSERT_TRUE(options.ok()) << args[0] << ": " << options.status();
    EXPECT_EQ(options->nproc, 3) << args[0];
    EXPECT_THAT(options->command, ElementsAre("p")) << args[0];
  }
}

TEST(LauncherTest, RequiresNproc) {
  EXPECT_THAT(ParseError({"--", "prog"}), HasSubstr("-n N"));
}

TEST(LauncherTest, RejectsNprocOutOfRange) {
  EXPECT_THAT(ParseError({"-n", "0", "prog"}), HasSubstr("[1, 1024]"));
  EXPECT_THAT(ParseError({"-n", "1025", "prog"}), HasSubstr("[1, 1024]"));
  EXPECT_THAT(ParseError({"-n", "two", "prog"}), HasSubstr("'two'"));
  EXPECT_THAT(ParseError({"-n", "2x", "prog"}), HasSubstr("'2x'"));
  auto max = Parse({"-n", "1024", "prog"});
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->nproc, 1024);
}

TEST(LauncherTest, RejectsUnknownOption) {
  std::string error = ParseError({"-n", "2", "--bogus", "prog"});
  EXPECT_THAT(error, HasSubstr("unknown option '--bogus'"));
  EXPECT_THAT(error, HasSubstr("--help"));
  EXPECT_THAT(ParseError({"-x", "prog"}), HasSubstr("'-x'"));
  EXPECT_THAT(ParseError({"--timeout=3=4", "prog"}), HasSubstr("--timeout"));
}

TEST(LauncherTest, RejectsOptionWithoutValue) {
  EXPECT_THAT(ParseError({"-n"}), HasSubstr("-n needs a value"));
  EXPECT_THAT(ParseError({"-n", "2", "--env"}),
              HasSubstr("--env needs a value"));
}

TEST(LauncherTest, RequiresCommand) {
  EXPECT_THAT(ParseError({"-n", "2"}), HasSubstr("no command"));
  EXPECT_THAT(ParseError({"-n", "2", "--"}), HasSubstr("no command"));
}

TEST(LauncherTest, ParsesMasterAddressAndPort) {
  auto options = Parse(
      {"--master-addr", "10.0.0.7", "--master-port=29500", "-n", "2", "prog"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->master_addr, "10.0.0.7");
  EXPECT_EQ(options->master_port, 29500);
  EXPECT_THAT(ParseError({"-n", "2", "--master-port", "70000", "prog"}),
              HasSubstr("[0, 65535]"));
  EXPECT_THAT(ParseError({"-n", "2", "--master-addr=", "prog"}),
              HasSubstr("--master-addr"));
}

TEST(LauncherTest, ParsesOutputModes) {
  auto plain = Parse({"-n", "2", "--output", "plain", "prog"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->output, OutputMode::kPlain);

  auto prefix = Parse({"-n", "2", "--output=prefix", "prog"});
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(prefix->output, OutputMode::kPrefix);

  auto separate = Parse(
      {"-n", "2", "--output", "separate", "--output-dir", "logs", "prog"});
  ASSERT_TRUE(separate.ok()) << separate.status();
  EXPECT_EQ(separate->output, OutputMode::kSeparate);
  EXPECT_EQ(separate->output_dir, "logs");

  EXPECT_THAT(ParseError({"-n", "2", "--output", "json", "prog"}),
              HasSubstr("prefix, separate or plain"));
}

TEST(LauncherTest, SeparateOutputNeedsDirectory) {
  EXPECT_THAT(ParseError({"-n", "2", "--output", "separate", "prog"}),
              HasSubstr("--output-dir"));
}

TEST(LauncherTest, OutputDirAloneImpliesSeparate) {
  auto options = Parse({"-n", "2", "--output-dir", "logs", "prog"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->output, OutputMode::kSeparate);
}

TEST(LauncherTest, RejectsOutputDirWithOtherMode) {
  EXPECT_THAT(
      ParseError({"-n", "2", "--output", "plain", "--output-dir", "d", "prog"}),
      HasSubstr("only to --output separate"));
}

TEST(LauncherTest, ParsesTimeoutAndGrace) {
  auto options = Parse({"-n", "1", "--timeout", "2.5", "--grace=500ms", "p"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->timeout, absl::Milliseconds(2500));
  EXPECT_EQ(options->grace, absl::Milliseconds(500));

  auto minutes = Parse({"-n", "1", "--timeout", "2m", "--grace", "0", "p"});
  ASSERT_TRUE(minutes.ok()) << minutes.status();
  EXPECT_EQ(minutes->timeout, absl::Minutes(2));
  EXPECT_EQ(minutes->grace, absl::ZeroDuration());

  auto none = Parse({"-n", "1", "--timeout", "0", "p"});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->timeout, absl::InfiniteDuration());
  EXPECT_EQ(none->failure_grace, absl::ZeroDuration());

  auto failure = Parse({"-n", "1", "--failure-grace", "20", "p"});
  ASSERT_TRUE(failure.ok()) << failure.status();
  EXPECT_EQ(failure->failure_grace, absl::Seconds(20));
  EXPECT_THAT(ParseError({"-n", "1", "--failure-grace", "-3", "p"}), HasSubstr("--failure-grace"));
}

TEST(LauncherTest, RejectsBadDurations) {
  EXPECT_THAT(ParseError({"-n", "1", "--timeout", "-1", "p"}),
              HasSubstr("non-negative"));
  EXPECT_THAT(ParseError({"-n", "1", "--grace", "soon", "p"}),
              HasSubstr("'soon'"));
  EXPECT_THAT(ParseError({"-n", "1", "--timeout", "nan", "p"}),
              HasSubstr("--timeout"));
  EXPECT_THAT(ParseError({"-n", "1", "--timeout", "inf", "p"}),
              HasSubstr("--timeout"));
}

TEST(LauncherTest, CollectsRepeatedEnvInOrder) {
  auto options = Parse({"-n", "1", "--env", "A=1", "--env=B=x=y", "--env",
                        "A=2", "--env", "EMPTY=", "p"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->env, ElementsAre(Pair("A", "1"), Pair("B", "x=y"),
                                        Pair("A", "2"), Pair("EMPTY", "")));
}

TEST(LauncherTest, RejectsMalformedEnv) {
  EXPECT_THAT(ParseError({"-n", "1", "--env", "NOVALUE", "p"}),
              HasSubstr("NAME=VALUE"));
  EXPECT_THAT(ParseError({"-n", "1", "--env", "=1", "p"}),
              HasSubstr("not a valid variable name"));
  EXPECT_THAT(ParseError({"-n", "1", "--env", "1X=1", "p"}),
              HasSubstr("not a valid variable name"));
}

TEST(LauncherTest, RejectsEnvThatSetsLauncherVariables) {
  for (const char* name : kReservedEnvVars) {
    EXPECT_THAT(ParseError({"-n", "1", "--env", std::string(name) + "=5", "p"}),
                HasSubstr(name));
  }
}

TEST(LauncherTest, HelpNeedsNothingElse) {
  for (const char* flag : {"-h", "--help"}) {
    auto options = Parse({flag});
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_TRUE(options->help);
  }
  auto late = Parse({"-n", "2", "--help", "--bogus"});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->help);
}

TEST(LauncherTest, UsageDocumentsEveryOptionWithExamples) {
  const std::string usage = LaunchUsage();
  for (const char* text :
       {"Usage: fusebox-run -n N", "--nproc", "--master-addr", "--master-port", "--nnodes", "--node-rank",
        "--output", "--output-dir", "--timeout", "--grace", "--failure-grace", "--env", "--help",
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "FUSEBOX_STORE_PORT",
        "FUSEBOX_AGENT_STORE", "Exit status", "Examples"}) {
    EXPECT_THAT(usage, HasSubstr(text));
  }
}

TEST(LauncherTest, BuildsRankEnvironment) {
  LaunchOptions options;
  options.nproc = 4;
  options.master_addr = "10.1.2.3";
  std::vector<std::string> env =
      BuildRankEnvironment({"HOME=/root", "PATH=/bin"}, options, 2, 29400, 29555);
  // fusebox's store has variables of its own; MASTER_PORT is another port,
  // free for the command's own rendezvous (torch's env://).
  EXPECT_THAT(
      env, UnorderedElementsAre("HOME=/root", "PATH=/bin", "RANK=2",
                                "WORLD_SIZE=4", "LOCAL_RANK=2",
                                "LOCAL_WORLD_SIZE=4", "FUSEBOX_STORE_ADDR=10.1.2.3",
                                "FUSEBOX_STORE_PORT=29400", "FUSEBOX_AGENT_STORE=1",
                                "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29555"));
}

TEST(LauncherTest, RankEnvironmentOverridesInheritedValues) {
  LaunchOptions options;
  options.nproc = 2;
  options.env = {{"PATH", "/opt/bin"}, {"X", "1"}, {"X", "2"}};
  std::vector<std::string> env = BuildRankEnvironment(
      {"RANK=9", "PATH=/bin", "KEEP=yes", "X=0", "KEEP=dup", "junk", "=bad"},
      options, 0, 1234, 1300);
  EXPECT_THAT(
      env, UnorderedElementsAre("KEEP=yes", "PATH=/opt/bin", "X=2", "RANK=0",
                                "WORLD_SIZE=2", "LOCAL_RANK=0",
                                "LOCAL_WORLD_SIZE=2", "FUSEBOX_STORE_ADDR=127.0.0.1",
                                "FUSEBOX_STORE_PORT=1234", "FUSEBOX_AGENT_STORE=1",
                                "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1300"));
}

TEST(LauncherTest, MultiNodeRanksAreNumberedByNode) {
  auto options = ParseLaunchArgs({"-n", "3", "--nnodes", "4", "--node-rank=2", "--master-addr",
                                  "10.9.0.1", "--master-port", "29501", "--", "./x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->nnodes, 4);
  EXPECT_EQ(options->node_rank, 2);
  EXPECT_EQ(GlobalRank(*options, 0), 6);
  EXPECT_EQ(GlobalRank(*options, 2), 8);
  EXPECT_THAT(BuildRankEnvironment({}, *options, 1, 29501, 29502),
              UnorderedElementsAre("RANK=7", "WORLD_SIZE=12", "LOCAL_RANK=1",
                                   "LOCAL_WORLD_SIZE=3", "FUSEBOX_STORE_ADDR=10.9.0.1",
                                   "FUSEBOX_STORE_PORT=29501", "FUSEBOX_AGENT_STORE=1",
                                   "MASTER_ADDR=10.9.0.1", "MASTER_PORT=29502"));
}

TEST(LauncherTest, RejectsInconsistentMultiNodeOptions) {
  auto out_of_range = ParseLaunchArgs(
      {"-n", "1", "--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "x"});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_THAT(std::string(out_of_range.status().message()),
              HasSubstr("--node-rank 2 is out of range for --nnodes 2"));
  auto no_port = ParseLaunchArgs({"-n", "1", "--nnodes", "2", "x"});
  ASSERT_FALSE(no_port.ok());
  EXPECT_THAT(std::string(no_port.status().message()), HasSubstr("fixed --master-port"));
  EXPECT_FALSE(ParseLaunchArgs({"-n", "1", "--nnodes", "0", "x"}).ok());
  EXPECT_FALSE(ParseLaunchArgs({"-n", "1", "--nnodes", "5000", "x"}).ok());
}

TEST(LauncherTest, BindsStoreToLoopbackOnlyForLoopbackMaster) {
  EXPECT_EQ(StoreBindAddress("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(StoreBindAddress("127.0.0.2"), "127.0.0.2");
  EXPECT_EQ(StoreBindAddress("localhost"), "127.0.0.1");
  EXPECT_EQ(StoreBindAddress("10.0.0.7"), "0.0.0.0");
  EXPECT_EQ(StoreBindAddress("node7.cluster"), "0.0.0.0");
}

TEST(LauncherTest, DescribesWaitStatuses) {
  const int exited3 = 3 << 8;  // as waitpid() reports exit(3)
  const int exited0 = 0;
  const int killed = SIGKILL;  // as waitpid() reports death by SIGKILL
  EXPECT_EQ(DescribeWaitStatus(exited3), "exited with status 3");
  EXPECT_EQ(DescribeWaitStatus(killed), "killed by signal SIGKILL");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV | 0x80),
            "killed by signal SIGSEGV (core dumped)");
  EXPECT_EQ(ExitCodeForWaitStatus(exited3), 3);
  EXPECT_EQ(ExitCodeForWaitStatus(exited0), 0);
  EXPECT_EQ(ExitCodeForWaitStatus(killed), 128 + SIGKILL);
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGHUP), "SIGHUP");
  EXPECT_EQ(SignalName(1000), "signal 1000");
}

TEST(LinePrefixerTest, PrefixesCompleteLines) {
  LinePrefixer prefixer(RankPrefix(3));
  EXPECT_EQ(prefixer.Feed("a\nbb\n"), "[3]: a\n[3]: bb\n");
  EXPECT_EQ(prefixer.pending_bytes(), 0u);
  EXPECT_EQ(prefixer.Flush(), "");
}

TEST(LinePrefixerTest, KeepsPartialLineUntilNewline) {
  LinePrefixer prefixer("[0]: ");
  EXPECT_EQ(prefixer.Feed("hel"), "");
  EXPECT_EQ(prefixer.Feed("lo wo"), "");
  EXPECT_EQ(prefixer.pending_bytes(), 8u);
  EXPECT_EQ(prefixer.Feed("rld\nnext"), "[0]: hello world\n");
  EXPECT_EQ(prefixer.Feed("\n"), "[0]: next\n");
}

TEST(LinePrefixerTest, FlushEmitsUnterminatedLastLine) {
  LinePrefixer prefixer("[1]: ");
  EXPECT_EQ(prefixer.Feed("done\nno newline"), "[1]: done\n");
  EXPECT_EQ(prefixer.Flush(), "[1]: no newline\n");
  EXPECT_EQ(prefixer.Flush(), "");
}

TEST(LinePrefixerTest, PrefixesEmptyLines) {
  LinePrefixer prefixer("[2]: ");
  EXPECT_EQ(prefixer.Feed("\n\nx\n"), "[2]: \n[2]: \n[2]: x\n");
}

TEST(LinePrefixerTest, ByteAtATimeMatchesOneFeed) {
  const std::string input = "alpha\n\nbeta gamma\r\ndelta";
  LinePrefixer whole("[7]: ");
  std::string expected = whole.Feed(input);
  expected += whole.Flush();
  LinePrefixer bytes("[7]: ");
  std::string got;
  for (char c : input) got += bytes.Feed(std::string(1, c));
  got += bytes.Flush();
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got, "[7]: alpha\n[7]: \n[7]: beta gamma\r\n[7]: delta\n");
}

TEST(LinePrefixerTest, PassesBinaryBytesThrough) {
  LinePrefixer prefixer("> ");
  std::string data("a\0b\n", 4);
  EXPECT_EQ(prefixer.Feed(data), std::string("> a\0b\n", 6));
}

TEST(LinePrefixerTest, SplitsOverlongLinesToBoundMemory) {
  LinePrefixer prefixer("p:", 4);
  EXPECT_EQ(prefixer.Feed("abcdefghij"), "p:abcd\np:efgh\n");
  EXPECT_LE(prefixer.pending_bytes(), 4u);
  EXPECT_EQ(prefixer.Feed("k\n"), "p:ijk\n");
  EXPECT_EQ(prefixer.Feed("0123456789\n"), "p:0123\np:4567\np:89\n");
  EXPECT_EQ(prefixer.Flush(), "");
}

}  // namespace
}  // namespace fusebox::tools

namespace fusebox::tools {
namespace {

TEST(LauncherTest, BindsOneRankPerCpuOnlyWhenTheyFit) {
  EXPECT_EQ(RankCpus({0, 1}, 2, Binding::kAuto), (std::vector<int>{0, 1}));
  EXPECT_EQ(RankCpus({2, 5, 7}, 2, Binding::kAuto), (std::vector<int>{2, 5}));
  EXPECT_TRUE(RankCpus({0, 1}, 4, Binding::kAuto).empty());  // oversubscribed
  EXPECT_EQ(RankCpus({0, 1}, 3, Binding::kCore), (std::vector<int>{0, 1, 0}));
  EXPECT_TRUE(RankCpus({0, 1}, 2, Binding::kNone).empty());
}

TEST(LauncherTest, ParsesBind) {
  auto o = ParseLaunchArgs(std::vector<std::string>{"-n", "2", "--bind", "none", "true"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->bind, Binding::kNone);
  auto bad = ParseLaunchArgs(std::vector<std::string>{"-n", "2", "--bind", "socket", "true"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("socket"), std::string::npos);
}

}  // namespace
}  // namespace fusebox::tools
