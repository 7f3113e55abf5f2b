// FUZZ_CHECK: an invariant of a fuzz target. A violation prints the
// condition and a message and aborts, which libFuzzer (and the corpus
// replay in ordinary test builds) reports as a crash with the input saved.
#ifndef FUSEBOX_TESTS_FUZZ_FUZZ_CHECK_H_
#define FUSEBOX_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fusebox::fuzz {

[[noreturn]] inline void InvariantFailed(const char* file, int line, const char* condition,
                                         const std::string& message) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s %s\n", file, line, condition,
               message.c_str());
  std::abort();
}

// The common shape of a parser's target: `parse` the input as text; a
// failure must say why, a success goes to `check` (the invariants).
template <typename Parse, typename Check>
void ParseThenCheck(const uint8_t* data, size_t size, Parse parse, Check check) {
  auto parsed = parse(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) {
      InvariantFailed(__FILE__, __LINE__, "!parsed.status().message().empty()",
                      "an error without a message");
    }
    return;
  }
  check(*parsed);
}

}  // namespace fusebox::fuzz

// FUZZ_CHECK(cond, parts...): the parts are absl::StrCat'ed into the message.
#define FUZZ_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      ::fusebox::fuzz::InvariantFailed(__FILE__, __LINE__, #cond,                    \
                                       ::absl::StrCat(__VA_ARGS__));                 \
    }                                                                                \
  } while (0)

#endif  // FUSEBOX_TESTS_FUZZ_FUZZ_CHECK_H_
