#include "bucketing/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fusebox::bucketing {

namespace {

std::string DescribeLimit(size_t bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  return bytes % kMiB == 0 ? absl::StrCat(bytes / kMiB, " MiB") : absl::StrCat(bytes, " bytes");
}

}  // namespace

absl::StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string text;
  absl::Status status;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      status = absl::UnavailableError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than the limit of ", DescribeLimit(max_bytes)));
      break;
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot create ", tmp, ": ", std::strerror(errno)));
  }
  absl::Status status;
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = absl::UnavailableError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (status.ok() && fsync(fd) != 0) {
    status = absl::UnavailableError(absl::StrCat(path, ": fsync failed: ", std::strerror(errno)));
  }
  if (close(fd) != 0 && status.ok()) {
    status = absl::UnavailableError(absl::StrCat(path, ": close failed: ", std::strerror(errno)));
  }
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::UnavailableError(
        absl::StrCat(path, ": cannot rename ", tmp, " over it: ", std::strerror(errno)));
  }
  if (!status.ok()) unlink(tmp.c_str());
  return status;
}

}  // namespace fusebox::bucketing
