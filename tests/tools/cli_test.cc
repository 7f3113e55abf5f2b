#include "tools/cli.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, cli_test_n, 3, "an int flag");
ABSL_FLAG(bool, cli_test_b, false, "a bool flag");

namespace fusebox::tools {
namespace {

std::optional<std::string> Check(std::vector<std::string> args) {
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return FindUsageError(static_cast<int>(argv.size()), argv.data());
}

TEST(CliTest, AcceptsEveryFlagForm) {
  EXPECT_EQ(Check({"--cli_test_n=4", "-cli_test_n", "5", "--cli_test_b", "--nocli_test_b",
                   "--cli_test_b=false", "positional", "--", "--anything"}),
            std::nullopt);
  // absl's own flags are absl's to handle.
  EXPECT_EQ(Check({"--help"}), std::nullopt);
  EXPECT_EQ(Check({"--helpfull", "--version", "--help=perf"}), std::nullopt);
}

// --cli-test-n is --cli_test_n; values, positional arguments and whatever
// follows "--" keep their dashes.
TEST(CliTest, DashesInFlagNamesAreUnderscores) {
  std::vector<std::string> args = {"tool",     "--cli-test-n=4", "-cli-test-b", "--cli-test-n",
                                   "-1",       "over-lap",       "--",          "--keep-me"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  NormalizeFlagSpelling(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(args, (std::vector<std::string>{"tool", "--cli_test_n=4", "-cli_test_b",
                                            "--cli_test_n", "-1", "over-lap", "--",
                                            "--keep-me"}));
  EXPECT_EQ(FindUsageError(static_cast<int>(argv.size()), argv.data()), std::nullopt);
}

TEST(CliTest, NamesTheFlagOfEachUsageError) {
  auto unknown = Check({"--cli_test_m=1"});
  ASSERT_TRUE(unknown.has_value());
  EXPECT_NE(unknown->find("--cli_test_m"), std::string::npos) << *unknown;
  auto bad = Check({"--cli_test_n", "four"});
  ASSERT_TRUE(bad.has_value());
  EXPECT_NE(bad->find("--cli_test_n"), std::string::npos) << *bad;
  EXPECT_NE(bad->find("four"), std::string::npos) << *bad;
  auto missing = Check({"--cli_test_n"});
  ASSERT_TRUE(missing.has_value());
  EXPECT_NE(missing->find("needs a value"), std::string::npos) << *missing;
  // "no" + a flag that is not boolean is no negation.
  EXPECT_TRUE(Check({"--nocli_test_n"}).has_value());
}

}  // namespace
}  // namespace fusebox::tools
