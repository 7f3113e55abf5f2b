// Waits for one collective with a deadline, naming it in the error.
#ifndef FUSEBOX_TESTS_SOAK_AWAIT_H_
#define FUSEBOX_TESTS_SOAK_AWAIT_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/work.h"

namespace fusebox::soak {

// The collective's status once it completes (issue errors as they are), or
// DeadlineExceeded after `timeout`; errors start with `what`.
inline absl::Status Await(absl::StatusOr<std::shared_ptr<comm::Work>> issued,
                          absl::Duration timeout, absl::string_view what) {
  absl::Status s = issued.ok() ? (*issued)->WaitFor(timeout) : issued.status();
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace fusebox::soak

#endif  // FUSEBOX_TESTS_SOAK_AWAIT_H_
